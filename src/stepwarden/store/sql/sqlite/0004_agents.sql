-- Healthy, capable agents: the registry of agent instances, step heartbeats and timeouts,
-- reassignments, and the concurrency and rate limits of operations.
--
-- Each agent instance (one row per process and agent) heartbeats what it serves, its
-- capacity, its calls in flight and its circuit breaker; it is gone once expires_at passes.
CREATE TABLE stepwarden_agents (
    instance     TEXT NOT NULL,
    agent        TEXT NOT NULL,
    operations   TEXT NOT NULL,
    capacity     INTEGER NOT NULL,
    inflight     INTEGER NOT NULL DEFAULT 0,
    breaker      TEXT NOT NULL DEFAULT 'closed',
    breaker_detail TEXT NOT NULL DEFAULT '{}',
    started_at   REAL NOT NULL,
    heartbeat_at REAL NOT NULL,
    expires_at   REAL NOT NULL,
    PRIMARY KEY (instance, agent)
);
-- The step's own complete_within (a heartbeat extends complete_by by it), the times a step
-- was handed to another agent instance without a failure counted, its last heartbeat, its
-- pick-up timeout (per dispatch) and total timeout (across all attempts), and its limit key.
ALTER TABLE stepwarden_steps ADD COLUMN complete_within REAL;
ALTER TABLE stepwarden_steps ADD COLUMN reassignments INTEGER NOT NULL DEFAULT 0;
ALTER TABLE stepwarden_steps ADD COLUMN heartbeat TEXT;
ALTER TABLE stepwarden_steps ADD COLUMN heartbeat_at REAL;
ALTER TABLE stepwarden_steps ADD COLUMN pickup_within REAL;
ALTER TABLE stepwarden_steps ADD COLUMN give_up_by REAL;
ALTER TABLE stepwarden_steps ADD COLUMN limit_key TEXT;
-- Running steps by the instance that holds them (instances gone), and by operation and key
-- (concurrency limits).
CREATE INDEX stepwarden_steps_running ON stepwarden_steps (agent, operation, limit_key)
    WHERE state = 'running';
CREATE INDEX stepwarden_steps_holder ON stepwarden_steps (locked_by) WHERE state = 'running';
-- Steps with a pick-up or a total timeout still open.
CREATE INDEX stepwarden_steps_pickup ON stepwarden_steps (dispatched_at)
    WHERE state = 'not_started' AND pickup_within IS NOT NULL;
CREATE INDEX stepwarden_steps_give_up ON stepwarden_steps (give_up_by)
    WHERE state IN ('not_started', 'running') AND give_up_by IS NOT NULL;
-- Starts of rate-limited operations, kept for their period.
CREATE TABLE stepwarden_starts (
    agent     TEXT NOT NULL,
    operation TEXT NOT NULL,
    limit_key TEXT NOT NULL,
    at        REAL NOT NULL
);
CREATE INDEX stepwarden_starts_key ON stepwarden_starts (agent, operation, limit_key, at);
-- When a lease was last taken or renewed: the supervisor leader renews it before each sweep.
ALTER TABLE stepwarden_leases ADD COLUMN renewed_at REAL;
