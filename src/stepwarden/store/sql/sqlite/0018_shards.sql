-- Shards are PostgreSQL's (placement.py); the tables exist here so that both dialects share
-- one schema version, and stay empty.
CREATE TABLE stepwarden_shard_map (
    generation INTEGER PRIMARY KEY CHECK (generation > 0),
    shards     TEXT NOT NULL,
    slots      TEXT NOT NULL,
    created_at REAL NOT NULL
);
CREATE TABLE stepwarden_shard_name (
    only_one INTEGER PRIMARY KEY DEFAULT 1 CHECK (only_one = 1),
    name     TEXT NOT NULL
);
