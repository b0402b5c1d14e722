-- Compensation (saga), the policy on failure, the reply channel of status messages.
ALTER TABLE stepwarden_tasks ADD COLUMN on_failure TEXT NOT NULL DEFAULT 'compensate';
ALTER TABLE stepwarden_tasks ADD COLUMN reply_to TEXT;
-- The step's compensation ("agent.operation") and its input, recorded with the step.
ALTER TABLE stepwarden_steps ADD COLUMN compensation TEXT;
ALTER TABLE stepwarden_steps ADD COLUMN compensation_input TEXT;
-- Set on a compensation step: the seq of the step it undoes.
ALTER TABLE stepwarden_steps ADD COLUMN compensates INTEGER;
-- A task is held (locked_by, complete_by) while processing and while compensating: the sweep
-- indexes every held task, and only those.
DROP INDEX stepwarden_tasks_expiry;
CREATE INDEX stepwarden_tasks_expiry ON stepwarden_tasks (complete_by)
    WHERE complete_by IS NOT NULL;
-- Tasks waiting for a scheduler to run their compensations.
CREATE INDEX stepwarden_tasks_compensate ON stepwarden_tasks (priority DESC, created_at)
    WHERE process_state = 'compensating' AND locked_by IS NULL;
