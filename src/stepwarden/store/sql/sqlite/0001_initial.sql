-- Times are seconds since the epoch (REAL); payloads are JSON text.
CREATE TABLE stepwarden_tasks (
    task_id         TEXT PRIMARY KEY,
    workflow        TEXT NOT NULL,
    input           TEXT NOT NULL,
    locked_by       TEXT,
    complete_by     REAL,
    process_state   TEXT NOT NULL DEFAULT 'pending',
    failure_count   INTEGER NOT NULL DEFAULT 0,
    max_failures    INTEGER NOT NULL,
    attempt         INTEGER NOT NULL DEFAULT 0,
    priority        INTEGER NOT NULL DEFAULT 0,
    complete_within REAL NOT NULL,
    eligible_at     REAL NOT NULL,
    result          TEXT,
    error           TEXT,
    created_at      REAL NOT NULL,
    updated_at      REAL NOT NULL,
    finished_at     REAL
);
-- The scheduler's claim: pending tasks by priority then age.
CREATE INDEX stepwarden_tasks_pending ON stepwarden_tasks (priority DESC, created_at)
    WHERE process_state = 'pending';
-- The supervisor's sweep: only processing tasks are indexed, so it costs what is expired.
CREATE INDEX stepwarden_tasks_expiry ON stepwarden_tasks (complete_by)
    WHERE process_state = 'processing';
CREATE INDEX stepwarden_tasks_state ON stepwarden_tasks (process_state, workflow);

CREATE TABLE stepwarden_steps (
    task_id         TEXT NOT NULL REFERENCES stepwarden_tasks (task_id) ON DELETE CASCADE,
    seq             INTEGER NOT NULL,
    name            TEXT NOT NULL,
    agent           TEXT NOT NULL,
    operation       TEXT NOT NULL,
    state           TEXT NOT NULL,
    attempt         INTEGER NOT NULL,
    task_attempt    INTEGER NOT NULL,
    priority        INTEGER NOT NULL,
    complete_by     REAL NOT NULL,
    idempotency_key TEXT NOT NULL,
    input           TEXT NOT NULL,
    result          TEXT,
    error           TEXT,
    locked_by       TEXT,
    tries           INTEGER NOT NULL DEFAULT 0,
    created_at      REAL NOT NULL,
    dispatched_at   REAL NOT NULL,
    claimed_at      REAL,
    finished_at     REAL,
    PRIMARY KEY (task_id, seq)
);
-- The request queue of each agent.
CREATE INDEX stepwarden_steps_requests ON stepwarden_steps (agent, priority DESC, dispatched_at)
    WHERE state = 'not_started';
-- The supervisor's sweep of open steps.
CREATE INDEX stepwarden_steps_expiry ON stepwarden_steps (complete_by)
    WHERE state IN ('not_started', 'running');

CREATE TABLE stepwarden_events (
    id      INTEGER PRIMARY KEY AUTOINCREMENT,
    task_id TEXT,
    at      REAL NOT NULL,
    kind    TEXT NOT NULL,
    detail  TEXT NOT NULL
);
CREATE INDEX stepwarden_events_task ON stepwarden_events (task_id, id);
CREATE INDEX stepwarden_events_kind ON stepwarden_events (kind, id);

CREATE TABLE stepwarden_leases (
    name       TEXT PRIMARY KEY,
    holder     TEXT NOT NULL,
    term       INTEGER NOT NULL,
    expires_at REAL NOT NULL
);
