-- Workflow versions. A task runs to its end on the version of its workflow it was submitted
-- with, and a scheduler claims only the tasks of the (workflow, version)s its code declares.
-- Tasks stored before versions existed are version 1.
ALTER TABLE stepwarden_tasks ADD COLUMN version INTEGER NOT NULL DEFAULT 1;
-- The claim reads, for each (workflow, version) a scheduler runs, the eligible tasks of that
-- pair by priority then age: the tasks of versions no scheduler runs are never read by it.
DROP INDEX stepwarden_tasks_pending;
CREATE INDEX stepwarden_tasks_pending
    ON stepwarden_tasks (workflow, version, priority DESC, created_at)
    WHERE process_state = 'pending';
DROP INDEX stepwarden_tasks_compensate;
CREATE INDEX stepwarden_tasks_compensate
    ON stepwarden_tasks (workflow, version, priority DESC, created_at)
    WHERE process_state = 'compensating' AND locked_by IS NULL;
-- The registry: the (workflow, version)s each scheduler instance runs, [[workflow, version]].
ALTER TABLE stepwarden_schedulers ADD COLUMN versions TEXT NOT NULL DEFAULT '[]';
UPDATE stepwarden_schedulers
SET versions = (SELECT json_group_array(json_array(w.value, 1))
                FROM json_each(stepwarden_schedulers.workflows) AS w);
-- The version of its workflow a schedule's tasks run.
ALTER TABLE stepwarden_schedules ADD COLUMN version INTEGER NOT NULL DEFAULT 1;
