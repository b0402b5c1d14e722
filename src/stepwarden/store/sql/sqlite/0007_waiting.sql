-- Long-running processes. A task whose workflow waits (a durable timer, an event from
-- outside, a delayed start) is `waiting`: held by no scheduler, with the time it wakes
-- (`wake_at`: a timer's, or a wait's timeout) and what it waits for. The supervisor finds the
-- due ones through the index of waiting tasks by wake_at, whatever their number.
ALTER TABLE stepwarden_tasks ADD COLUMN wake_at REAL;
ALTER TABLE stepwarden_tasks ADD COLUMN waiting_for TEXT;
CREATE INDEX stepwarden_tasks_waking ON stepwarden_tasks (wake_at)
    WHERE process_state = 'waiting';
-- Each wait of a workflow, at its position among the steps (seq): a timer, or a wait for an
-- event by name; `wake_at` is when the timer fires or the wait times out; `state` says how it
-- ended (open, done, timed_out), and a done event wait keeps the event it took.
CREATE TABLE stepwarden_waits (
    task_id     TEXT NOT NULL REFERENCES stepwarden_tasks (task_id) ON DELETE CASCADE,
    seq         INTEGER NOT NULL,
    kind        TEXT NOT NULL,
    name        TEXT NOT NULL,
    wake_at     REAL NOT NULL,
    state       TEXT NOT NULL DEFAULT 'open',
    event_id    TEXT,
    payload     TEXT,
    created_at  REAL NOT NULL,
    finished_at REAL,
    PRIMARY KEY (task_id, seq)
);
-- Events sent to a task, kept until a wait of its workflow takes them, in the order sent; an
-- event_id is sent once.
CREATE TABLE stepwarden_inbox (
    id         INTEGER PRIMARY KEY AUTOINCREMENT,
    task_id    TEXT NOT NULL REFERENCES stepwarden_tasks (task_id) ON DELETE CASCADE,
    event_id   TEXT NOT NULL,
    name       TEXT NOT NULL,
    payload    TEXT NOT NULL,
    sent_at    REAL NOT NULL,
    taken_by   INTEGER,
    UNIQUE (task_id, event_id)
);
CREATE INDEX stepwarden_inbox_untaken ON stepwarden_inbox (task_id, name, id)
    WHERE taken_by IS NULL;
