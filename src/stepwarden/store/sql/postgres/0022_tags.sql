-- What a task is about: its tags, key and value (`Submission.tags`, `Context.tag`). The
-- task's row holds them as a JSON object (`tags`, shown with it); the side table
-- stepwarden_task_tags holds one row per tag, kept by the triggers below in the statement
-- that writes the row, and is what a filter by tag reads, through its index on (key,
-- value). A task's tags go with it (ON DELETE CASCADE: the purge).
ALTER TABLE stepwarden_tasks ADD COLUMN tags json NOT NULL DEFAULT '{}';
CREATE TABLE stepwarden_task_tags (
    task_id text NOT NULL REFERENCES stepwarden_tasks (task_id) ON DELETE CASCADE,
    key     text NOT NULL,
    value   text NOT NULL,
    PRIMARY KEY (task_id, key)
);
CREATE INDEX stepwarden_task_tags_key_value ON stepwarden_task_tags (key, value, task_id);

CREATE FUNCTION stepwarden_tags_inserted() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO stepwarden_task_tags (task_id, key, value)
    SELECT NEW.task_id, t.key, t.value FROM json_each_text(NEW.tags) AS t;
    RETURN NULL;
END $$;
CREATE TRIGGER stepwarden_tags_inserted AFTER INSERT ON stepwarden_tasks
FOR EACH ROW WHEN (NEW.tags::text <> '{}') EXECUTE FUNCTION stepwarden_tags_inserted();

CREATE FUNCTION stepwarden_tags_updated() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM stepwarden_task_tags WHERE task_id = NEW.task_id;
    INSERT INTO stepwarden_task_tags (task_id, key, value)
    SELECT NEW.task_id, t.key, t.value FROM json_each_text(NEW.tags) AS t;
    RETURN NULL;
END $$;
CREATE TRIGGER stepwarden_tags_updated AFTER UPDATE OF tags ON stepwarden_tasks
FOR EACH ROW WHEN (NEW.tags::text <> OLD.tags::text) EXECUTE FUNCTION stepwarden_tags_updated();

-- A fork (App.fork): the task it was forked from, and whose idempotency keys its steps
-- carry (keys_of), for the steps before new_keys_from (all of them when NULL):
-- records.idempotency_key. NULL for every other task (its own keys, task_id/seq).
ALTER TABLE stepwarden_tasks ADD COLUMN forked_from text;
ALTER TABLE stepwarden_tasks ADD COLUMN keys_of text;
ALTER TABLE stepwarden_tasks ADD COLUMN new_keys_from integer;
