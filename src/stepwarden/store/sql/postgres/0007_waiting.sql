-- Long-running processes. A task whose workflow waits (a durable timer, an event from
-- outside, a delayed start) is `waiting`: held by no scheduler, with the time it wakes
-- (`wake_at`: a timer's, or a wait's timeout) and what it waits for. The supervisor finds the
-- due ones through the index of waiting tasks by wake_at, whatever their number.
ALTER TABLE stepwarden_tasks ADD COLUMN wake_at timestamptz;
ALTER TABLE stepwarden_tasks ADD COLUMN waiting_for text;
CREATE INDEX stepwarden_tasks_waking ON stepwarden_tasks (wake_at)
    WHERE process_state = 'waiting';
-- Each wait of a workflow, at its position among the steps (seq): a timer, or a wait for an
-- event by name; `wake_at` is when the timer fires or the wait times out; `state` says how it
-- ended (open, done, timed_out), and a done event wait keeps the event it took.
CREATE TABLE stepwarden_waits (
    task_id     text NOT NULL REFERENCES stepwarden_tasks (task_id) ON DELETE CASCADE,
    seq         integer NOT NULL,
    kind        text NOT NULL,
    name        text NOT NULL,
    wake_at     timestamptz NOT NULL,
    state       text NOT NULL DEFAULT 'open',
    event_id    text,
    payload     json,
    created_at  timestamptz NOT NULL DEFAULT now(),
    finished_at timestamptz,
    PRIMARY KEY (task_id, seq)
);
-- Events sent to a task, kept until a wait of its workflow takes them, in the order sent; an
-- event_id is sent once.
CREATE TABLE stepwarden_inbox (
    id         bigserial PRIMARY KEY,
    task_id    text NOT NULL REFERENCES stepwarden_tasks (task_id) ON DELETE CASCADE,
    event_id   text NOT NULL,
    name       text NOT NULL,
    payload    json NOT NULL,
    sent_at    timestamptz NOT NULL DEFAULT now(),
    taken_by   integer,
    UNIQUE (task_id, event_id)
);
CREATE INDEX stepwarden_inbox_untaken ON stepwarden_inbox (task_id, name, id)
    WHERE taken_by IS NULL;
