-- A task's end wakes whoever waits for its result (PostgreSQL: NOTIFY
-- stepwarden_task_done), and only when someone does (rules.await_next): a waiter marks the
-- row `awaited` while a scheduler holds it, under the row's lock, so that the end after it
-- reads it; it notes its wait in stepwarden_awaited while no scheduler holds it (schedulers
-- claim those rows skipping locked ones: a waiter does not lock them), and the end reads
-- that too. No foreign key: its check would lock the task row (FOR KEY SHARE), which a
-- claim skipping locked rows would then pass over; the purge deletes a task's note.
ALTER TABLE stepwarden_tasks ADD COLUMN awaited INTEGER NOT NULL DEFAULT 0;
CREATE TABLE stepwarden_awaited (
    task_id TEXT PRIMARY KEY
);
