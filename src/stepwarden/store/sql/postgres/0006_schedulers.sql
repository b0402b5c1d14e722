-- Recovery in seconds. Each scheduler instance heartbeats in a registry, like agent
-- instances; the tasks of one gone silent are released for another scheduler at once,
-- found through the index of held tasks by holder.
CREATE TABLE stepwarden_schedulers (
    instance     text PRIMARY KEY,
    workflows    json NOT NULL,
    capacity     integer NOT NULL,
    held         integer NOT NULL DEFAULT 0,
    started_at   timestamptz NOT NULL DEFAULT now(),
    heartbeat_at timestamptz NOT NULL DEFAULT now(),
    expires_at   timestamptz NOT NULL
);
CREATE INDEX stepwarden_tasks_holder ON stepwarden_tasks (locked_by) WHERE locked_by IS NOT NULL;
-- A compensating task counts its own expiries; failure_count keeps those of the forward path.
-- (Before, failure_count started again at 0 when compensation began.)
ALTER TABLE stepwarden_tasks ADD COLUMN compensation_failures integer NOT NULL DEFAULT 0;
UPDATE stepwarden_tasks SET compensation_failures = failure_count, failure_count = 0
WHERE process_state IN ('compensating', 'compensated', 'compensation_failed');
