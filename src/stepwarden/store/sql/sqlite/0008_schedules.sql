-- Schedules: declared in the application's code, stored here by the supervisor leader, which
-- creates one task per tick (its id derived from the schedule and the tick), fenced by its
-- lease; `next_at` is the next tick to create, found through the index of schedules not
-- paused.
CREATE TABLE stepwarden_schedules (
    name       TEXT PRIMARY KEY,
    workflow   TEXT NOT NULL,
    cron       TEXT,
    every      REAL,
    input      TEXT NOT NULL,
    timezone   TEXT NOT NULL,
    complete_within REAL NOT NULL,
    max_failures    INTEGER NOT NULL,
    on_failure      TEXT NOT NULL,
    catch_up   TEXT NOT NULL,
    paused     INTEGER NOT NULL DEFAULT 0,
    next_at    REAL NOT NULL,
    last_tick  REAL,
    updated_at REAL NOT NULL
);
CREATE INDEX stepwarden_schedules_due ON stepwarden_schedules (next_at) WHERE NOT paused;
