-- Fair share of the agents' queue across tenants (`rules.fair_shares`, the stride
-- scheduling of the task claim): a step has its task's tenant, written when it is recorded
-- (the steps stored before: their task's here). An agent instance's claim with the queued
-- requests of several tenants before it is shared among them by the weights of
-- stepwarden_tenants (the same weight as their tasks'), by rank within each. The passes are
-- kept apart from the task claim's, one set per agent with its own fair clock: an agent's
-- capacity is what its claims share, and a tenant's use of one agent, or of the schedulers,
-- costs it nothing at another. A claim finds the tenants with requests queued for each of
-- its operations by walking the index below from one tenant to the next, and takes each
-- tenant's share in the order of its rank through it.
ALTER TABLE stepwarden_steps ADD COLUMN tenant TEXT NOT NULL DEFAULT '';
UPDATE stepwarden_steps
SET tenant = (SELECT t.tenant FROM stepwarden_tasks AS t WHERE t.task_id = stepwarden_steps.task_id)
WHERE EXISTS (SELECT 1 FROM stepwarden_tasks AS t
              WHERE t.task_id = stepwarden_steps.task_id AND t.tenant <> '');
CREATE INDEX stepwarden_steps_fair ON stepwarden_steps (agent, operation, tenant, ranked_at)
    WHERE state = 'not_started';
CREATE TABLE stepwarden_agent_tenants (
    agent  TEXT NOT NULL,
    tenant TEXT NOT NULL,
    pass   REAL NOT NULL,
    PRIMARY KEY (agent, tenant)
);
CREATE TABLE stepwarden_agent_clock (
    agent TEXT PRIMARY KEY,
    vtime REAL NOT NULL
);
