-- A task's tenant: who it belongs to (`records.Submission.tenant`). The application API's
-- submit records its client unless it names another tenant its tokens entry grants; a
-- task the App submits in Python has none unless it names one (''); a child task has its
-- parent's; a schedule's tasks have the schedule's. The application API answers a client
-- only about the tasks of the tenants it may see (`_tokens.Client.may_see`). The tasks
-- stored before are their submitting client's, or their parent's when it had one.
ALTER TABLE stepwarden_tasks ADD COLUMN tenant text NOT NULL DEFAULT '';
UPDATE stepwarden_tasks SET tenant = submitted_by WHERE submitted_by IS NOT NULL;
UPDATE stepwarden_tasks AS c SET tenant = p.tenant
FROM stepwarden_tasks AS p
WHERE c.parent_id = p.task_id AND c.tenant = '' AND p.tenant <> '';
-- One tenant's tasks, oldest first (`stepwarden tasks --tenant`, `purge --tenant`).
CREATE INDEX stepwarden_tasks_tenant ON stepwarden_tasks (tenant, created_at);
ALTER TABLE stepwarden_schedules ADD COLUMN tenant text NOT NULL DEFAULT '';
-- Fair share of the claims across tenants (`rules.fair_shares`, stride scheduling): each
-- tenant's weight (default 1, `stepwarden tenants weight`) and pass, and the fair clock, the
-- least pass of the tenants with work waiting at the last claim (where one that comes back
-- after an idle while starts). A claim finds the tenants with pending tasks of its
-- (workflow, version)s by walking the index below from one tenant to the next, and takes
-- each tenant's share in the order of its rank through it.
CREATE TABLE stepwarden_tenants (
    tenant text PRIMARY KEY,
    weight double precision NOT NULL DEFAULT 1 CHECK (weight > 0),
    pass   double precision NOT NULL DEFAULT 0
);
CREATE TABLE stepwarden_fair_clock (
    id    integer PRIMARY KEY CHECK (id = 1),
    vtime double precision NOT NULL
);
INSERT INTO stepwarden_fair_clock (id, vtime) VALUES (1, 0);
CREATE INDEX stepwarden_tasks_fair ON stepwarden_tasks (workflow, version, tenant, ranked_at)
    WHERE process_state = 'pending';
