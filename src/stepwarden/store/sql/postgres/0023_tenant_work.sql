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
-- of least pass first.
--
-- The rows are written when a tenant comes to have work, not once a task: a submit of a
-- tenant that has a row already only shares a lock on it (FOR KEY SHARE, which submits of
-- the tenant side by side all hold at once, and which the claims' updates of `pass` do not
-- wait for). The claim deletes a row only once it holds it (FOR UPDATE SKIP LOCKED: never
-- a row a submit holds, never a wait) and finds no pending task in a statement after: a
-- task a submit made pending before is seen, and a submit after finds the row gone and
-- writes it anew.
CREATE TABLE stepwarden_tenant_work (
    tenant   text NOT NULL,
    workflow text NOT NULL,
    version  integer NOT NULL,
    pass     double precision NOT NULL,
    PRIMARY KEY (tenant, workflow, version)
);
CREATE INDEX stepwarden_tenant_work_pass
    ON stepwarden_tenant_work (workflow, version, pass, tenant);

-- A (tenant, workflow, version) noted as one with work waiting, in the transaction that
-- makes one of its tasks pending: its row held (FOR KEY SHARE) until the commit, or written
-- when there is none (at the pass the claims would give it now). A row a claim deletes
-- meanwhile is written again.
CREATE FUNCTION stepwarden_tenant_work_note(t text, w text, v integer) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    LOOP
        PERFORM 1 FROM stepwarden_tenant_work k
        WHERE k.tenant = t AND k.workflow = w AND k.version = v
        FOR KEY SHARE;
        EXIT WHEN FOUND;
        INSERT INTO stepwarden_tenant_work (tenant, workflow, version, pass)
        SELECT t, w, v, greatest(c.vtime, n.pass)
        FROM stepwarden_fair_clock c LEFT JOIN stepwarden_tenants n ON n.tenant = t
        WHERE c.id = 1
        ON CONFLICT DO NOTHING;
        EXIT WHEN FOUND;
    END LOOP;
END $$;
-- A submit's tasks: noted once a statement, each (tenant, workflow, version) once, in their
-- order, so that submits side by side that name the same new tenants never wait for each
-- other in a cycle.
CREATE FUNCTION stepwarden_tenant_work_inserted() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM stepwarden_tenant_work_note(d.tenant, d.workflow, d.version)
    FROM (SELECT DISTINCT tenant, workflow, version FROM new_tasks
          WHERE process_state = 'pending' ORDER BY tenant, workflow, version) AS d;
    RETURN NULL;
END $$;
CREATE TRIGGER stepwarden_tenant_work_inserted AFTER INSERT ON stepwarden_tasks
REFERENCING NEW TABLE AS new_tasks
FOR EACH STATEMENT EXECUTE FUNCTION stepwarden_tenant_work_inserted();
-- A task pending again (given back, released after its deadline, a delayed start come
-- due), or moved to another (workflow, version) or tenant while pending.
CREATE FUNCTION stepwarden_tenant_work_updated() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM stepwarden_tenant_work_note(NEW.tenant, NEW.workflow, NEW.version);
    RETURN NULL;
END $$;
CREATE TRIGGER stepwarden_tenant_work_updated
AFTER UPDATE OF process_state, workflow, version, tenant ON stepwarden_tasks
FOR EACH ROW WHEN (NEW.process_state = 'pending' AND (OLD.process_state <> 'pending'
    OR OLD.workflow <> NEW.workflow OR OLD.version <> NEW.version OR OLD.tenant <> NEW.tenant))
EXECUTE FUNCTION stepwarden_tenant_work_updated();

INSERT INTO stepwarden_tenant_work (tenant, workflow, version, pass)
SELECT t.tenant, t.workflow, t.version, greatest(c.vtime, n.pass)
FROM (SELECT DISTINCT tenant, workflow, version FROM stepwarden_tasks
      WHERE process_state = 'pending') AS t
CROSS JOIN stepwarden_fair_clock c
LEFT JOIN stepwarden_tenants n ON n.tenant = t.tenant
WHERE c.id = 1;
