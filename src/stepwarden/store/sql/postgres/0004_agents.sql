-- Healthy, capable agents: the registry of agent instances, step heartbeats and timeouts,
-- reassignments, and the concurrency and rate limits of operations.
--
-- Each agent instance (one row per process and agent) heartbeats what it serves, its
-- capacity, its calls in flight and its circuit breaker; it is gone once expires_at passes.
CREATE TABLE stepwarden_agents (
    instance       text NOT NULL,
    agent          text NOT NULL,
    operations     json NOT NULL,
    capacity       integer NOT NULL,
    inflight       integer NOT NULL DEFAULT 0,
    breaker        text NOT NULL DEFAULT 'closed',
    breaker_detail json NOT NULL DEFAULT '{}',
    started_at     timestamptz NOT NULL DEFAULT now(),
    heartbeat_at   timestamptz NOT NULL DEFAULT now(),
    expires_at     timestamptz NOT NULL,
    PRIMARY KEY (instance, agent)
);
-- The step's own complete_within (a heartbeat extends complete_by by it), the times a step
-- was handed to another agent instance without a failure counted, its last heartbeat, its
-- pick-up timeout (per dispatch) and total timeout (across all attempts), and its limit key.
ALTER TABLE stepwarden_steps ADD COLUMN complete_within double precision;
ALTER TABLE stepwarden_steps ADD COLUMN reassignments integer NOT NULL DEFAULT 0;
ALTER TABLE stepwarden_steps ADD COLUMN heartbeat json;
ALTER TABLE stepwarden_steps ADD COLUMN heartbeat_at timestamptz;
ALTER TABLE stepwarden_steps ADD COLUMN pickup_within double precision;
ALTER TABLE stepwarden_steps ADD COLUMN give_up_by timestamptz;
ALTER TABLE stepwarden_steps ADD COLUMN limit_key text;
-- Running steps by operation and key (concurrency limits), and by the instance that holds
-- them (instances gone).
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
    agent     text NOT NULL,
    operation text NOT NULL,
    limit_key text NOT NULL,
    at        timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX stepwarden_starts_key ON stepwarden_starts (agent, operation, limit_key, at);
-- When a lease was last taken or renewed: the supervisor leader renews it before each sweep.
ALTER TABLE stepwarden_leases ADD COLUMN renewed_at timestamptz;
