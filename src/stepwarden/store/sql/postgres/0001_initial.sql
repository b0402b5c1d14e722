-- Times are timestamptz from the database clock; payloads are json text.
CREATE TABLE stepwarden_tasks (
    task_id         text PRIMARY KEY,
    workflow        text NOT NULL,
    input           json NOT NULL,
    locked_by       text,
    complete_by     timestamptz,
    process_state   text NOT NULL DEFAULT 'pending',
    failure_count   integer NOT NULL DEFAULT 0,
    max_failures    integer NOT NULL,
    attempt         integer NOT NULL DEFAULT 0,
    priority        integer NOT NULL DEFAULT 0,
    complete_within double precision NOT NULL,
    eligible_at     timestamptz NOT NULL DEFAULT now(),
    result          json,
    error           text,
    created_at      timestamptz NOT NULL DEFAULT now(),
    updated_at      timestamptz NOT NULL DEFAULT now(),
    finished_at     timestamptz
);
-- The scheduler's claim: pending tasks by priority then age.
CREATE INDEX stepwarden_tasks_pending ON stepwarden_tasks (priority DESC, created_at)
    WHERE process_state = 'pending';
-- The supervisor's sweep: only processing tasks are indexed, so it costs what is expired.
CREATE INDEX stepwarden_tasks_expiry ON stepwarden_tasks (complete_by)
    WHERE process_state = 'processing';
CREATE INDEX stepwarden_tasks_state ON stepwarden_tasks (process_state, workflow);

CREATE TABLE stepwarden_steps (
    task_id         text NOT NULL REFERENCES stepwarden_tasks (task_id) ON DELETE CASCADE,
    seq             integer NOT NULL,
    name            text NOT NULL,
    agent           text NOT NULL,
    operation       text NOT NULL,
    state           text NOT NULL,
    attempt         integer NOT NULL,
    task_attempt    integer NOT NULL,
    priority        integer NOT NULL,
    complete_by     timestamptz NOT NULL,
    idempotency_key text NOT NULL,
    input           json NOT NULL,
    result          json,
    error           text,
    locked_by       text,
    tries           integer NOT NULL DEFAULT 0,
    created_at      timestamptz NOT NULL DEFAULT now(),
    dispatched_at   timestamptz NOT NULL DEFAULT now(),
    claimed_at      timestamptz,
    finished_at     timestamptz,
    PRIMARY KEY (task_id, seq)
);
-- The request queue of each agent.
CREATE INDEX stepwarden_steps_requests ON stepwarden_steps (agent, priority DESC, dispatched_at)
    WHERE state = 'not_started';
-- The supervisor's sweep of open steps.
CREATE INDEX stepwarden_steps_expiry ON stepwarden_steps (complete_by)
    WHERE state IN ('not_started', 'running');

CREATE TABLE stepwarden_events (
    id      bigserial PRIMARY KEY,
    task_id text,
    at      timestamptz NOT NULL DEFAULT now(),
    kind    text NOT NULL,
    detail  json NOT NULL
);
CREATE INDEX stepwarden_events_task ON stepwarden_events (task_id, id);
CREATE INDEX stepwarden_events_kind ON stepwarden_events (kind, id);

CREATE TABLE stepwarden_leases (
    name       text PRIMARY KEY,
    holder     text NOT NULL,
    term       bigint NOT NULL,
    expires_at timestamptz NOT NULL
);
