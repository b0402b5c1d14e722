-- Shards: a store of several PostgreSQL databases places each task on one of them by its id
-- (placement.py). Every shard holds the same map, all its generations (the shards named, and
-- each slot's owner as an index into them); a submit reads the newest generation in its
-- transaction, and adding a shard writes the next one with this table locked (ACCESS
-- EXCLUSIVE), so that no submit under the older generation commits after it.
CREATE TABLE stepwarden_shard_map (
    generation integer PRIMARY KEY CHECK (generation > 0),
    shards     jsonb NOT NULL,
    slots      jsonb NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now()
);
-- This database's own name in the map (one row, written once).
CREATE TABLE stepwarden_shard_name (
    only_one boolean PRIMARY KEY DEFAULT true CHECK (only_one),
    name     text NOT NULL
);
