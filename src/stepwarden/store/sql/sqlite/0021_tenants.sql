-- A task's tenant: who it belongs to (`records.Submission.tenant`). The application API's
-- submit records its client unless it names another tenant its tokens entry grants; a
-- task the App submits in Python has none unless it names one (''); a child task has its
-- parent's; a schedule's tasks have the schedule's. The application API answers a client
-- only about the tasks of the tenants it may see (`_tokens.Client.may_see`). The tasks
-- stored before are their submitting client's, or their parent's when it had one.
ALTER TABLE stepwarden_tasks ADD COLUMN tenant TEXT NOT NULL DEFAULT '';
UPDATE stepwarden_tasks SET tenant = submitted_by WHERE submitted_by IS NOT NULL;
UPDATE stepwarden_tasks AS c
SET tenant = (SELECT p.tenant FROM stepwarden_tasks AS p WHERE p.task_id = c.parent_id)
WHERE c.parent_id IS NOT NULL AND c.tenant = ''
  AND EXISTS (SELECT 1 FROM stepwarden_tasks AS p
              WHERE p.task_id = c.parent_id AND p.tenant <> '');
-- One tenant's tasks, oldest first (`stepwarden tasks --tenant`, `purge --tenant`).
CREATE INDEX stepwarden_tasks_tenant ON stepwarden_tasks (tenant, created_at);
ALTER TABLE stepwarden_schedules ADD COLUMN tenant TEXT NOT NULL DEFAULT '';
