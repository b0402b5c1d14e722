-- Schedules: declared in the application's code, stored here by the supervisor leader, which
-- creates one task per tick (its id derived from the schedule and the tick), fenced by its
-- lease; `next_at` is the next tick to create, found through the index of schedules not
-- paused.
CREATE TABLE stepwarden_schedules (
    name       text PRIMARY KEY,
    workflow   text NOT NULL,
    cron       text,
    every      double precision,
    input      json NOT NULL,
    timezone   text NOT NULL,
    complete_within double precision NOT NULL,
    max_failures    integer NOT NULL,
    on_failure      text NOT NULL,
    catch_up   text NOT NULL,
    paused     boolean NOT NULL DEFAULT false,
    next_at    timestamptz NOT NULL,
    last_tick  timestamptz,
    updated_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX stepwarden_schedules_due ON stepwarden_schedules (next_at) WHERE NOT paused;
