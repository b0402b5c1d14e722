-- Child workflows. A task started by another's workflow (`ctx.child`) names its parent and
-- the place in the parent's workflow that started it; the parent waits for it as for a
-- timer or an event: a wait of kind 'child' whose name is the child's task id, with no
-- wake_at (it ends when the child ends, not at a time). The parent's children are found
-- through the index of tasks by parent.
ALTER TABLE stepwarden_tasks ADD COLUMN parent_id text;
ALTER TABLE stepwarden_tasks ADD COLUMN parent_position text;
CREATE INDEX stepwarden_tasks_children ON stepwarden_tasks (parent_id, created_at)
    WHERE parent_id IS NOT NULL;
ALTER TABLE stepwarden_waits ALTER COLUMN wake_at DROP NOT NULL;
