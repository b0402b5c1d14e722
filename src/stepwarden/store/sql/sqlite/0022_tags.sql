-- What a task is about: its tags, key and value (`Submission.tags`, `Context.tag`). The
-- task's row holds them as a JSON object (`tags`, shown with it); the side table
-- stepwarden_task_tags holds one row per tag, kept by the triggers below in the statement
-- that writes the row, and is what a filter by tag reads, through its index on (key,
-- value). A task's tags go with it (ON DELETE CASCADE: the purge).
ALTER TABLE stepwarden_tasks ADD COLUMN tags TEXT NOT NULL DEFAULT '{}';
CREATE TABLE stepwarden_task_tags (
    task_id TEXT NOT NULL REFERENCES stepwarden_tasks (task_id) ON DELETE CASCADE,
    key     TEXT NOT NULL,
    value   TEXT NOT NULL,
    PRIMARY KEY (task_id, key)
) WITHOUT ROWID;
CREATE INDEX stepwarden_task_tags_key_value ON stepwarden_task_tags (key, value, task_id);

CREATE TRIGGER stepwarden_tags_inserted AFTER INSERT ON stepwarden_tasks
WHEN NEW.tags <> '{}'
BEGIN
    INSERT INTO stepwarden_task_tags (task_id, key, value)
    SELECT NEW.task_id, t.key, t.value FROM json_each(NEW.tags) AS t;
END;

CREATE TRIGGER stepwarden_tags_updated AFTER UPDATE OF tags ON stepwarden_tasks
WHEN NEW.tags <> OLD.tags
BEGIN
    DELETE FROM stepwarden_task_tags WHERE task_id = NEW.task_id;
    INSERT INTO stepwarden_task_tags (task_id, key, value)
    SELECT NEW.task_id, t.key, t.value FROM json_each(NEW.tags) AS t;
END;

-- A fork (App.fork): the task it was forked from, and whose idempotency keys its steps
-- carry (keys_of), for the steps before new_keys_from (all of them when NULL):
-- records.idempotency_key. NULL for every other task (its own keys, task_id/seq).
ALTER TABLE stepwarden_tasks ADD COLUMN forked_from TEXT;
ALTER TABLE stepwarden_tasks ADD COLUMN keys_of TEXT;
ALTER TABLE stepwarden_tasks ADD COLUMN new_keys_from INTEGER;
