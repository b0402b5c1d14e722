-- Who submitted a task, and what: `submitted_by` is the application API's client that
-- submitted it (the tokens file's name; NULL for a task the App submitted in Python, a child
-- or a schedule's tick), `input_digest` a keyed digest of its canonical input
-- (`sealing.input_digest`). A re-submit under a task's id is compared with these, never with
-- the input's revealed values. Rows stored before get their digest when the store is
-- migrated (`Store.migrate`, in Python: the key is not in the database).
ALTER TABLE stepwarden_tasks ADD COLUMN submitted_by text;
ALTER TABLE stepwarden_tasks ADD COLUMN input_digest text;
-- A client's unfinished tasks, counted for its quota.
CREATE INDEX stepwarden_tasks_submitted_by ON stepwarden_tasks (submitted_by)
    WHERE submitted_by IS NOT NULL
      AND process_state NOT IN ('processed', 'error', 'compensated', 'compensation_failed',
                                'cancelled');
