-- The tenants with work waiting, by (workflow, version): what a fair claim reads
-- (`fair_tenants`) to find the few tenants of least pass it serves (`rules.fair_shares` gives
-- claims only to the `limit` tenants of least pass), instead of walking the index of
-- migration 0021 one probe a tenant. A row says that the tenant may have pending tasks of
-- the pair; the triggers below write it in the statement that makes a task pending (a
-- submit, a release, a delayed start come due), and a claim that finds a row with no
-- pending task behind it deletes it. Its `pass` is the tenant's pass as the claims order
-- them, never above the tenant's own (max(fair clock, stepwarden_tenants.pass)): the
-- claims that move a tenant's pass move its rows' too, and a claim that finds a row behind
-- moves it up. So the index on (workflow, version, pass, tenant) gives a claim the tenants
-- of least pass first. A submit of a tenant that has a row already writes nothing to it.
CREATE TABLE stepwarden_tenant_work (
    tenant   TEXT NOT NULL,
    workflow TEXT NOT NULL,
    version  INTEGER NOT NULL,
    pass     REAL NOT NULL,
    PRIMARY KEY (tenant, workflow, version)
) WITHOUT ROWID;
CREATE INDEX stepwarden_tenant_work_pass
    ON stepwarden_tenant_work (workflow, version, pass, tenant);

CREATE TRIGGER stepwarden_tenant_work_inserted AFTER INSERT ON stepwarden_tasks
WHEN NEW.process_state = 'pending'
BEGIN
    INSERT OR IGNORE INTO stepwarden_tenant_work (tenant, workflow, version, pass)
    SELECT NEW.tenant, NEW.workflow, NEW.version,
           max(c.vtime, coalesce((SELECT n.pass FROM stepwarden_tenants AS n
                                  WHERE n.tenant = NEW.tenant), c.vtime))
    FROM stepwarden_fair_clock AS c WHERE c.id = 1;
END;

CREATE TRIGGER stepwarden_tenant_work_updated
AFTER UPDATE OF process_state, workflow, version, tenant ON stepwarden_tasks
WHEN NEW.process_state = 'pending' AND (OLD.process_state <> 'pending'
    OR OLD.workflow <> NEW.workflow OR OLD.version <> NEW.version OR OLD.tenant <> NEW.tenant)
BEGIN
    INSERT OR IGNORE INTO stepwarden_tenant_work (tenant, workflow, version, pass)
    SELECT NEW.tenant, NEW.workflow, NEW.version,
           max(c.vtime, coalesce((SELECT n.pass FROM stepwarden_tenants AS n
                                  WHERE n.tenant = NEW.tenant), c.vtime))
    FROM stepwarden_fair_clock AS c WHERE c.id = 1;
END;

INSERT INTO stepwarden_tenant_work (tenant, workflow, version, pass)
SELECT t.tenant, t.workflow, t.version,
       max(c.vtime, coalesce((SELECT n.pass FROM stepwarden_tenants AS n
                              WHERE n.tenant = t.tenant), c.vtime))
FROM (SELECT DISTINCT tenant, workflow, version FROM stepwarden_tasks
      WHERE process_state = 'pending') AS t
CROSS JOIN stepwarden_fair_clock AS c
WHERE c.id = 1;
