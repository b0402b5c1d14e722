-- Child workflows. A task started by another's workflow (`ctx.child`) names its parent and
-- the place in the parent's workflow that started it; the parent waits for it as for a
-- timer or an event: a wait of kind 'child' whose name is the child's task id, with no
-- wake_at (it ends when the child ends, not at a time). The parent's children are found
-- through the index of tasks by parent.
ALTER TABLE stepwarden_tasks ADD COLUMN parent_id TEXT;
ALTER TABLE stepwarden_tasks ADD COLUMN parent_position TEXT;
CREATE INDEX stepwarden_tasks_children ON stepwarden_tasks (parent_id, created_at)
    WHERE parent_id IS NOT NULL;
-- SQLite cannot drop a NOT NULL constraint: the waits move to a table without it.
CREATE TABLE stepwarden_waits_0012 (
    task_id     TEXT NOT NULL REFERENCES stepwarden_tasks (task_id) ON DELETE CASCADE,
    seq         INTEGER NOT NULL,
    kind        TEXT NOT NULL,
    name        TEXT NOT NULL,
    wake_at     REAL,
    state       TEXT NOT NULL DEFAULT 'open',
    event_id    TEXT,
    payload     TEXT,
    created_at  REAL NOT NULL,
    finished_at REAL,
    position    TEXT,
    PRIMARY KEY (task_id, seq)
);
INSERT INTO stepwarden_waits_0012 (task_id, seq, kind, name, wake_at, state, event_id, payload,
                                   created_at, finished_at, position)
SELECT task_id, seq, kind, name, wake_at, state, event_id, payload, created_at, finished_at,
       position
FROM stepwarden_waits;
DROP TABLE stepwarden_waits;
ALTER TABLE stepwarden_waits_0012 RENAME TO stepwarden_waits;
