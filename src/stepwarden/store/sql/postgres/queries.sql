-- name: migration_lock
-- Serialise migrations of this database across processes, until the transaction ends.
SELECT pg_advisory_xact_lock(7318421900536115001)

-- name: create_schema_table
-- The record of applied migrations.
CREATE TABLE IF NOT EXISTS stepwarden_schema (
    version    integer PRIMARY KEY,
    name       text NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
)

-- name: schema_table_exists
-- Whether the record of migrations exists (in the search path).
SELECT to_regclass('stepwarden_schema') IS NOT NULL AS present

-- name: schema_version
-- The newest applied migration, 0 when none.
SELECT coalesce(max(version), 0) AS version FROM stepwarden_schema

-- name: record_migration
-- Note one applied migration.
INSERT INTO stepwarden_schema (version, name) VALUES (%(version)s, %(name)s)

-- name: insert_tasks
-- Record tasks in one statement, each in the state the caller decided (rules.start_state:
-- pending, or waiting for a delayed start at start_at, an epoch, or start_after seconds
-- from now by the database's clock), each with the version of its workflow it runs and its
-- rank for claims (ranked_at: now less its priority's head start); an existing task_id is
-- left untouched. A child task names its parent and its place in the parent's workflow.
-- Its tags go to stepwarden_task_tags by trigger (migration 0022).
-- The schedulers are woken (delivered on commit) when a task became
-- pending: the statement runs alone, in autocommit (PostgresStore._write_alone).
WITH ins AS (
INSERT INTO stepwarden_tasks (task_id, workflow, input, priority, complete_within, max_failures,
                              on_failure, reply_to, eligible_at, created_at, updated_at,
                              process_state, wake_at, waiting_for, version, parent_id,
                              parent_position, ranked_at, trace_context, submitted_by,
                              input_digest, tenant, tags)
SELECT d.task_id, d.workflow, d.input::json, d.priority, d.complete_within, d.max_failures,
       d.on_failure, d.reply_to, now(), now(), now(),
       d.process_state,
       CASE WHEN d.waiting_for IS NOT NULL
            THEN coalesce(to_timestamp(d.start_at),
                          now() + make_interval(secs => d.start_after)) END,
       d.waiting_for, d.version, d.parent_id, d.parent_position,
       now() - make_interval(secs => d.head_start), d.trace_context, d.submitted_by,
       d.input_digest, d.tenant, d.tags::json
FROM unnest(%(task_id)s::text[], %(workflow)s::text[], %(input)s::text[],
            %(priority)s::int[], %(complete_within)s::float8[], %(max_failures)s::int[],
            %(on_failure)s::text[], %(reply_to)s::text[], %(start_at)s::float8[],
            %(start_after)s::float8[], %(version)s::int[], %(parent_id)s::text[],
            %(parent_position)s::text[], %(head_start)s::float8[],
            %(trace_context)s::text[], %(submitted_by)s::text[],
            %(input_digest)s::text[], %(process_state)s::text[], %(waiting_for)s::text[],
            %(tenant)s::text[], %(tags)s::text[])
     AS d(task_id, workflow, input, priority, complete_within, max_failures, on_failure,
          reply_to, start_at, start_after, version, parent_id, parent_position,
          head_start, trace_context, submitted_by, input_digest, process_state, waiting_for,
          tenant, tags)
ON CONFLICT (task_id) DO NOTHING
RETURNING task_id, process_state
), woken AS (
    SELECT pg_notify('stepwarden_tasks', '') FROM ins WHERE process_state = 'pending' LIMIT 1
)
SELECT task_id, (SELECT count(*) FROM woken) AS woken FROM ins

-- name: insert_tasks_fenced
-- insert_tasks on a shard (store/sharded.py), only where the shard map's newest generation is
-- the one the submitter placed the tasks by: a first row gives the generation found, the
-- others the tasks created (none when it differs). Reading the map takes its table's ACCESS
-- SHARE lock, held until this statement commits (alone, in autocommit): a new generation
-- (lock_shard_map) waits for it, and a submit after it sees the new one.
WITH gen AS (
    SELECT coalesce(max(generation), 0) AS generation FROM stepwarden_shard_map
), ins AS (
INSERT INTO stepwarden_tasks (task_id, workflow, input, priority, complete_within, max_failures,
                              on_failure, reply_to, eligible_at, created_at, updated_at,
                              process_state, wake_at, waiting_for, version, parent_id,
                              parent_position, ranked_at, trace_context, submitted_by,
                              input_digest, tenant, tags)
SELECT d.task_id, d.workflow, d.input::json, d.priority, d.complete_within, d.max_failures,
       d.on_failure, d.reply_to, now(), now(), now(),
       d.process_state,
       CASE WHEN d.waiting_for IS NOT NULL
            THEN coalesce(to_timestamp(d.start_at),
                          now() + make_interval(secs => d.start_after)) END,
       d.waiting_for, d.version, d.parent_id, d.parent_position,
       now() - make_interval(secs => d.head_start), d.trace_context, d.submitted_by,
       d.input_digest, d.tenant, d.tags::json
FROM unnest(%(task_id)s::text[], %(workflow)s::text[], %(input)s::text[],
            %(priority)s::int[], %(complete_within)s::float8[], %(max_failures)s::int[],
            %(on_failure)s::text[], %(reply_to)s::text[], %(start_at)s::float8[],
            %(start_after)s::float8[], %(version)s::int[], %(parent_id)s::text[],
            %(parent_position)s::text[], %(head_start)s::float8[],
            %(trace_context)s::text[], %(submitted_by)s::text[],
            %(input_digest)s::text[], %(process_state)s::text[], %(waiting_for)s::text[],
            %(tenant)s::text[], %(tags)s::text[])
     AS d(task_id, workflow, input, priority, complete_within, max_failures, on_failure,
          reply_to, start_at, start_after, version, parent_id, parent_position,
          head_start, trace_context, submitted_by, input_digest, process_state, waiting_for,
          tenant, tags)
WHERE (SELECT generation FROM gen) = %(generation)s
ON CONFLICT (task_id) DO NOTHING
RETURNING task_id, process_state
), woken AS (
    SELECT pg_notify('stepwarden_tasks', '') FROM ins WHERE process_state = 'pending' LIMIT 1
)
SELECT (SELECT generation FROM gen) AS generation, NULL::text AS task_id, 0::bigint AS woken
UNION ALL
SELECT NULL, task_id, (SELECT count(*) FROM woken) FROM ins


-- name: notify
-- Wake other processes: one notification per (channel, payload), delivered on commit.
SELECT pg_notify(n.channel, n.payload)
FROM unnest(%(channel)s::text[], %(payload)s::text[]) AS n(channel, payload)

-- name: claim_tasks
-- Claim eligible tasks of the given (workflow, version) pairs (the arrays workflows and
-- versions, side by side) by rank (ranked_at: priority with aging, rules.head_start),
-- skipping rows other claimers hold: pending ones (-> processing) and compensating ones no
-- scheduler holds; a new attempt each. Each pair is read through the claim indexes by
-- (workflow, version, ranked_at), up to the limit: the tasks of other versions are never
-- read. The LIMIT of w keeps every pair; it
-- tells the plan kept for all calls (generic) that the pairs are few, so that PostgreSQL
-- keeps that plan instead of planning each call anew (it took the generic plan for ten
-- pairs to be dearer than one planned for the call, and planned every claim).
WITH w AS MATERIALIZED (
    SELECT DISTINCT workflow, version
    FROM unnest(%(workflows)s::text[], %(versions)s::int[]) AS w(workflow, version)
    LIMIT cardinality(%(workflows)s::text[])
), p AS MATERIALIZED (
    SELECT x.* FROM w CROSS JOIN LATERAL (
        SELECT task_id, ranked_at FROM stepwarden_tasks t
        WHERE t.process_state = 'pending' AND t.workflow = w.workflow
          AND t.version = w.version AND t.eligible_at <= now()
        ORDER BY t.ranked_at
        LIMIT %(limit)s
        FOR UPDATE SKIP LOCKED
    ) AS x
), c AS MATERIALIZED (
    SELECT x.* FROM w CROSS JOIN LATERAL (
        SELECT task_id, ranked_at FROM stepwarden_tasks t
        WHERE t.process_state = 'compensating' AND t.locked_by IS NULL
          AND t.workflow = w.workflow AND t.version = w.version AND t.eligible_at <= now()
        ORDER BY t.ranked_at
        LIMIT %(limit)s
        FOR UPDATE SKIP LOCKED
    ) AS x
), pick AS MATERIALIZED (
    SELECT task_id FROM (SELECT * FROM p UNION ALL SELECT * FROM c) AS x
    ORDER BY ranked_at
    LIMIT %(limit)s
)
UPDATE stepwarden_tasks
SET locked_by = %(scheduler)s, attempt = attempt + 1,
    process_state = CASE process_state WHEN 'pending' THEN 'processing' ELSE process_state END,
    complete_by = now() + make_interval(secs => complete_within), updated_at = now()
WHERE task_id IN (SELECT task_id FROM pick)
  AND (process_state = 'pending' OR (process_state = 'compensating' AND locked_by IS NULL))
RETURNING *, extract(epoch FROM complete_by - now())::float8 AS remaining

-- name: fair_tenants
-- The tenants with work waiting for the given (workflow, version) pairs (the arrays
-- workflows and versions, side by side; migration 0023), of least pass first: the first
-- `scan` rows of each pair by (pass, tenant), read through the index on (workflow, version,
-- pass, tenant). With each, whether the tenant has pending tasks of the pair (`live`: one
-- probe of the index of migration 0021), its weight and pass (none without a row: weight
-- 1), and the fair clock: one probe each (LIMIT 1: never a hash of the pending tasks nor of
-- every tenant's row). `rules.least_pass` takes from them the tenants a claim serves, or
-- asks for a larger `scan`.
WITH w AS MATERIALIZED (
    SELECT DISTINCT workflow, version
    FROM unnest(%(workflows)s::text[], %(versions)s::int[]) AS w(workflow, version)
    LIMIT cardinality(%(workflows)s::text[])
), r AS MATERIALIZED (
    SELECT x.* FROM w CROSS JOIN LATERAL (
        SELECT k.tenant, k.workflow, k.version, k.pass AS key
        FROM stepwarden_tenant_work k
        WHERE k.workflow = w.workflow AND k.version = w.version
        ORDER BY k.pass, k.tenant
        LIMIT %(scan)s
    ) AS x
)
SELECT r.tenant, r.workflow, r.version, r.key, l.live IS NOT NULL AS live,
       coalesce(n.weight, 1)::float8 AS weight, n.pass,
       (SELECT vtime FROM stepwarden_fair_clock WHERE id = 1) AS clock
FROM r
LEFT JOIN LATERAL (
    SELECT true AS live FROM stepwarden_tasks t
    WHERE t.process_state = 'pending' AND t.workflow = r.workflow
      AND t.version = r.version AND t.tenant = r.tenant
    LIMIT 1
) AS l ON true
LEFT JOIN LATERAL (
    SELECT n.weight, n.pass FROM stepwarden_tenants n WHERE n.tenant = r.tenant LIMIT 1
) AS n ON true

-- name: claim_fair
-- claim_tasks with each tenant's share (rules.fair_shares: the arrays tenants and counts,
-- side by side): of each tenant, up to its count of its eligible pending tasks by rank,
-- through the index of migration 0021; the compensating tasks no scheduler holds first, by
-- rank, as claim_tasks takes them; up to the limit in all.
WITH a AS MATERIALIZED (
    SELECT * FROM unnest(%(tenants)s::text[], %(counts)s::int[]) AS a(tenant, n)
), w AS MATERIALIZED (
    SELECT DISTINCT workflow, version
    FROM unnest(%(workflows)s::text[], %(versions)s::int[]) AS w(workflow, version)
    LIMIT cardinality(%(workflows)s::text[])
), p AS MATERIALIZED (
    SELECT x.*, a.tenant AS share_of, a.n FROM a CROSS JOIN w CROSS JOIN LATERAL (
        SELECT task_id, ranked_at FROM stepwarden_tasks t
        WHERE t.process_state = 'pending' AND t.workflow = w.workflow
          AND t.version = w.version AND t.tenant = a.tenant AND t.eligible_at <= now()
        ORDER BY t.ranked_at
        LIMIT a.n
        FOR UPDATE SKIP LOCKED
    ) AS x
), c AS MATERIALIZED (
    SELECT x.* FROM w CROSS JOIN LATERAL (
        SELECT task_id, ranked_at FROM stepwarden_tasks t
        WHERE t.process_state = 'compensating' AND t.locked_by IS NULL
          AND t.workflow = w.workflow AND t.version = w.version AND t.eligible_at <= now()
        ORDER BY t.ranked_at
        LIMIT %(limit)s
        FOR UPDATE SKIP LOCKED
    ) AS x
), pick AS MATERIALIZED (
    SELECT task_id FROM (
        SELECT task_id, 0 AS k, ranked_at FROM c
        UNION ALL
        SELECT task_id, 1, ranked_at FROM (
            SELECT task_id, ranked_at, n,
                   row_number() OVER (PARTITION BY share_of ORDER BY ranked_at) AS r
            FROM p
        ) AS q
        WHERE q.r <= q.n
    ) AS y
    ORDER BY k, ranked_at
    LIMIT %(limit)s
)
UPDATE stepwarden_tasks
SET locked_by = %(scheduler)s, attempt = attempt + 1,
    process_state = CASE process_state WHEN 'pending' THEN 'processing' ELSE process_state END,
    complete_by = now() + make_interval(secs => complete_within), updated_at = now()
WHERE task_id IN (SELECT task_id FROM pick)
  AND (process_state = 'pending' OR (process_state = 'compensating' AND locked_by IS NULL))
RETURNING *, extract(epoch FROM complete_by - now())::float8 AS remaining

-- name: advance_tenants
-- Each tenant served by a claim: its pass moves on by its claims over its weight (delta),
-- from the fair clock at least (floor); a tenant without a row gets one, of weight 1. In the
-- order of the tenants, so that claims side by side lock their rows in one order.
INSERT INTO stepwarden_tenants AS n (tenant, pass)
SELECT d.tenant, %(floor)s::float8 + d.delta
FROM unnest(%(tenant)s::text[], %(delta)s::float8[]) AS d(tenant, delta)
ORDER BY d.tenant
ON CONFLICT (tenant) DO UPDATE
SET pass = greatest(n.pass, %(floor)s::float8) + (excluded.pass - %(floor)s::float8)

-- name: advance_fair_clock
-- The fair clock moves on (never back) to the least pass of the tenants a claim found.
UPDATE stepwarden_fair_clock SET vtime = greatest(vtime, %(clock)s) WHERE id = 1

-- name: lift_tenant_work
-- The rows of the given tenants with work waiting (migration 0023), of every pair: each
-- pass moves up (never down) to the tenant's as the claims order them, max(fair clock,
-- its pass); after a claim moved the passes of the tenants it served and the clock (the
-- claims write these one at a time: each waits for the fair clock's row first). The LIMIT
-- of d tells the plan kept for all calls that the tenants are few (read by key).
WITH d AS MATERIALIZED (
    SELECT DISTINCT d.tenant FROM unnest(%(tenants)s::text[]) AS d(tenant)
    LIMIT cardinality(%(tenants)s::text[])
), p AS MATERIALIZED (
    SELECT d.tenant,
           greatest((SELECT vtime FROM stepwarden_fair_clock WHERE id = 1),
                    (SELECT n.pass FROM stepwarden_tenants n WHERE n.tenant = d.tenant)) AS pass
    FROM d
)
UPDATE stepwarden_tenant_work AS k SET pass = p.pass
FROM p
WHERE k.tenant = p.tenant AND k.pass < p.pass

-- name: hold_idle_tenant_work
-- Of the given rows of tenants with work waiting (the arrays tenant, workflow and version,
-- side by side), those a claim found no pending task behind: held, but never one a submit
-- holds (SKIP LOCKED: that one has a task on its way), for drop_idle_tenant_work next.
WITH d AS MATERIALIZED (
    SELECT * FROM unnest(%(tenant)s::text[], %(workflow)s::text[], %(version)s::int[])
        AS d(tenant, workflow, version)
    LIMIT cardinality(%(tenant)s::text[])
)
SELECT k.tenant, k.workflow, k.version
FROM d CROSS JOIN LATERAL (
    SELECT k.tenant, k.workflow, k.version FROM stepwarden_tenant_work k
    WHERE k.tenant = d.tenant AND k.workflow = d.workflow AND k.version = d.version
    FOR UPDATE SKIP LOCKED
) AS k

-- name: drop_idle_tenant_work
-- The rows held by hold_idle_tenant_work, each deleted if its tenant has no pending task of
-- its pair: read in this statement, after the hold, so that a task a submit made pending
-- before is seen (a submit after finds the row gone and writes it again).
WITH d AS MATERIALIZED (
    SELECT d.* FROM unnest(%(tenant)s::text[], %(workflow)s::text[], %(version)s::int[])
        AS d(tenant, workflow, version)
    LEFT JOIN LATERAL (
        SELECT true AS live FROM stepwarden_tasks t
        WHERE t.process_state = 'pending' AND t.workflow = d.workflow
          AND t.version = d.version AND t.tenant = d.tenant
        LIMIT 1
    ) AS l ON true
    WHERE l.live IS NULL
    LIMIT cardinality(%(tenant)s::text[])
)
DELETE FROM stepwarden_tenant_work AS k
USING d
WHERE k.tenant = d.tenant AND k.workflow = d.workflow AND k.version = d.version

-- name: set_tenant_weight
-- A tenant's weight, kept with its pass (a new tenant's pass: the fair clock's).
INSERT INTO stepwarden_tenants (tenant, weight, pass)
VALUES (%(tenant)s, %(weight)s, (SELECT vtime FROM stepwarden_fair_clock WHERE id = 1))
ON CONFLICT (tenant) DO UPDATE SET weight = excluded.weight

-- name: tenant_weights
-- Every tenant's row: its weight and its pass; and the fair clock.
SELECT n.tenant, n.weight, n.pass, (SELECT vtime FROM stepwarden_fair_clock WHERE id = 1) AS clock
FROM stepwarden_tenants n ORDER BY n.tenant

-- name: waits_of_tasks
-- The recorded waits of the given tasks (their positions, kinds and names).
SELECT task_id, seq, position, kind, name FROM stepwarden_waits
WHERE task_id = ANY(%(task_ids)s::text[])

-- name: steps_of_tasks
-- The recorded steps of the given tasks.
SELECT * FROM stepwarden_steps
WHERE task_id = ANY(%(task_ids)s::text[])
ORDER BY task_id, seq

-- name: dispatch_new
-- Record steps while their tasks are held under these attempts (task rows share-locked):
-- queued (not_started), or taken at once by the agent instance named in claimed_by (running);
-- ranked for claims at now less their priority's head start, with their task's tenant (the
-- fair share of the agents' queue).
WITH d AS (
    SELECT * FROM unnest(%(task_id)s::text[], %(seq)s::int[], %(task_attempt)s::int[],
                         %(scheduler)s::text[], %(name)s::text[], %(agent)s::text[],
                         %(operation)s::text[], %(priority)s::int[],
                         %(complete_within)s::float8[], %(idempotency_key)s::text[],
                         %(input)s::text[], %(ord)s::int[], %(compensation)s::text[],
                         %(compensation_input)s::text[], %(compensates)s::int[],
                         %(pickup_within)s::float8[], %(total_within)s::float8[],
                         %(limit_key)s::text[], %(position)s::text[],
                         %(claimed_by)s::text[], %(head_start)s::float8[],
                         %(trace_context)s::text[])
        AS d(task_id, seq, task_attempt, scheduler, name, agent, operation, priority,
             complete_within, idempotency_key, input, ord, compensation, compensation_input,
             compensates, pickup_within, total_within, limit_key, position, claimed_by,
             head_start, trace_context)
), t AS MATERIALIZED (
    SELECT task_id, attempt, locked_by, complete_by, tenant FROM stepwarden_tasks
    WHERE task_id IN (SELECT task_id FROM d) AND process_state IN ('processing', 'compensating')
    ORDER BY task_id
    FOR SHARE
), c AS MATERIALIZED (
    -- Of the dispatches of one step that pass the fence, the first (as one at a time).
    SELECT DISTINCT ON (d.task_id, d.seq) d.*, t.complete_by AS task_complete_by, t.tenant
    FROM d JOIN t ON t.task_id = d.task_id AND t.attempt = d.task_attempt
                 AND t.locked_by = d.scheduler
    ORDER BY d.task_id, d.seq, d.ord
), ins AS (
    INSERT INTO stepwarden_steps (task_id, seq, name, agent, operation, state, attempt,
                                  task_attempt, priority, complete_by, idempotency_key, input,
                                  created_at, dispatched_at, compensation, compensation_input,
                                  compensates, complete_within, pickup_within, give_up_by,
                                  limit_key, position, locked_by, claimed_at, ranked_at,
                                  trace_context, tenant)
    SELECT task_id, seq, name, agent, operation,
           CASE WHEN claimed_by IS NULL THEN 'not_started' ELSE 'running' END, 1, task_attempt,
           priority,
           stepwarden_step_deadline(now(), make_interval(secs => complete_within),
                                    task_complete_by,
                                    now() + make_interval(secs => total_within), NULL),
           idempotency_key, input::json, now(), now(), compensation, compensation_input::json,
           compensates, complete_within, pickup_within,
           now() + make_interval(secs => total_within), limit_key, position, claimed_by,
           CASE WHEN claimed_by IS NOT NULL THEN now() END,
           now() - make_interval(secs => head_start), trace_context, tenant
    FROM c
    ORDER BY ord
    ON CONFLICT (task_id, seq) DO NOTHING
    RETURNING task_id, seq, attempt, complete_by
)
SELECT c.ord, ins.attempt, extract(epoch FROM ins.complete_by - now())::float8 AS remaining
FROM ins JOIN c ON c.task_id = ins.task_id AND c.seq = ins.seq

-- name: savepoint_dependents
-- A scheduler's group commit: the writes that depend on the outcomes written before this.
SAVEPOINT stepwarden_dependents

-- name: rollback_dependents
-- An outcome was refused: undo what depends on the outcomes, to write it again without it.
ROLLBACK TO SAVEPOINT stepwarden_dependents

-- name: dispatch_again
-- Re-dispatch expired steps: a new attempt, the same idempotency key, back in the queue.
WITH d AS (
    SELECT * FROM unnest(%(task_id)s::text[], %(seq)s::int[], %(task_attempt)s::int[],
                         %(scheduler)s::text[], %(expected_attempt)s::int[],
                         %(complete_within)s::float8[], %(ord)s::int[],
                         %(trace_context)s::text[])
        AS d(task_id, seq, task_attempt, scheduler, expected_attempt, complete_within, ord,
             trace_context)
), t AS MATERIALIZED (
    SELECT task_id, attempt, locked_by, complete_by FROM stepwarden_tasks
    WHERE task_id IN (SELECT task_id FROM d) AND process_state IN ('processing', 'compensating')
    ORDER BY task_id
    FOR SHARE
)
UPDATE stepwarden_steps s
SET state = 'not_started', attempt = s.attempt + 1, task_attempt = d.task_attempt,
    locked_by = NULL, claimed_at = NULL, call_stopped_at = NULL, dispatched_at = now(),
    ranked_at = now() - (s.dispatched_at - s.ranked_at), complete_within = d.complete_within,
    trace_context = d.trace_context,
    complete_by = stepwarden_step_deadline(now(), make_interval(secs => d.complete_within),
                                           t.complete_by, s.give_up_by, NULL)
FROM d JOIN t ON t.task_id = d.task_id AND t.attempt = d.task_attempt
             AND t.locked_by = d.scheduler
WHERE s.task_id = d.task_id AND s.seq = d.seq AND s.attempt = d.expected_attempt
  AND s.state IN ('not_started', 'running')
RETURNING d.ord, s.attempt, extract(epoch FROM s.complete_by - now())::float8 AS remaining

-- name: dispatch_adopt
-- Take over steps an earlier attempt of the task dispatched, while they are still in time.
-- A step still queued takes the trace context of this dispatch, when it has one.
WITH d AS (
    SELECT * FROM unnest(%(task_id)s::text[], %(seq)s::int[], %(task_attempt)s::int[],
                         %(scheduler)s::text[], %(expected_attempt)s::int[], %(ord)s::int[],
                         %(trace_context)s::text[])
        AS d(task_id, seq, task_attempt, scheduler, expected_attempt, ord, trace_context)
), t AS MATERIALIZED (
    SELECT task_id, attempt, locked_by FROM stepwarden_tasks
    WHERE task_id IN (SELECT task_id FROM d) AND process_state IN ('processing', 'compensating')
    ORDER BY task_id
    FOR SHARE
)
UPDATE stepwarden_steps s
SET task_attempt = d.task_attempt,
    trace_context = CASE WHEN s.state = 'not_started'
                         THEN coalesce(d.trace_context, s.trace_context)
                         ELSE s.trace_context END
FROM d JOIN t ON t.task_id = d.task_id AND t.attempt = d.task_attempt
             AND t.locked_by = d.scheduler
WHERE s.task_id = d.task_id AND s.seq = d.seq AND s.attempt = d.expected_attempt
  AND s.state IN ('not_started', 'running') AND s.complete_by > now()
RETURNING d.ord, s.attempt, extract(epoch FROM s.complete_by - now())::float8 AS remaining

-- name: finished_steps
-- Of the given (task_id, seq), the steps that are completed or failed.
SELECT * FROM stepwarden_steps
WHERE (task_id, seq) IN (SELECT * FROM unnest(%(task_id)s::text[], %(seq)s::int[]))
  AND state IN ('completed', 'failed')

-- name: compensation_facts
-- The facts rules.compensable_tasks decides on: each given task's on_failure, with its steps
-- that have a compensation (one row with no step for a task that has none).
SELECT t.task_id, s.state, s.abandoned, s.compensation, s.compensates, t.on_failure
FROM stepwarden_tasks t
LEFT JOIN stepwarden_steps s ON s.task_id = t.task_id AND s.compensation IS NOT NULL
WHERE t.task_id = ANY(%(task_ids)s::text[])
ORDER BY t.task_id, s.seq

-- name: finish_tasks
-- End the hold of tasks under the holding attempt and scheduler (in the state held_as), into
-- the state the caller planned (rules.plan_finish), eligible after `hold` seconds: a
-- compensation waits for the steps an agent may still be calling
-- (rules.compensation_wait); the planned alert, and the open steps of each task closed
-- (abandoned; locked_by kept: the instance whose call may still run).
WITH d AS (
    SELECT * FROM unnest(%(task_id)s::text[], %(attempt)s::int[], %(scheduler)s::text[],
                         %(held_as)s::text[], %(state)s::text[],
                         %(compensation_starts)s::bool[],
                         %(finished)s::bool[], %(result)s::text[], %(error)s::text[],
                         %(alert)s::text[], %(abandoned_error)s::text[], %(hold)s::float8[],
                         %(ord)s::int[])
        AS d(task_id, attempt, scheduler, held_as, state, compensation_starts, finished, result,
             error, alert, abandoned_error, hold, ord)
    LIMIT cardinality(%(ord)s::int[])  -- every row: a kept plan for a few (claim_tasks)
), u AS (
    UPDATE stepwarden_tasks t
    SET process_state = d.state,
        compensation_failures = CASE WHEN d.compensation_starts THEN 0
                                     ELSE t.compensation_failures END,
        eligible_at = now() + make_interval(secs => d.hold), backoff_until = now(),
        finished_at = CASE WHEN d.finished THEN now() END,
        result = d.result::json, error = d.error, locked_by = NULL, complete_by = NULL,
        updated_at = now()
    FROM d
    WHERE t.task_id = d.task_id AND t.attempt = d.attempt AND t.locked_by = d.scheduler
      AND t.process_state = d.held_as
    RETURNING d.ord, d.task_id, t.process_state, d.error, d.alert, d.abandoned_error,
              t.parent_id,
              t.awaited OR EXISTS (SELECT 1 FROM stepwarden_awaited a
                                   WHERE a.task_id = t.task_id) AS awaited
), e AS (
    INSERT INTO stepwarden_events (task_id, at, kind, detail)
    SELECT task_id, now(), 'alert',
           json_build_object('reason', alert, 'error', error, 'then', process_state)
    FROM u WHERE alert IS NOT NULL
    ORDER BY ord
), c AS (
    -- A finished task leaves no request behind: its open steps are closed.
    UPDATE stepwarden_steps s
    SET state = 'failed', error = u.abandoned_error, abandoned = true, finished_at = now()
    FROM u
    WHERE s.task_id = u.task_id AND s.state IN ('not_started', 'running')
)
SELECT ord, task_id, process_state, parent_id, awaited FROM u

-- name: claim_requests
-- Claim queued requests in time by rank (ranked_at: priority with aging, rules.head_start):
-- not_started -> running, skipping rows others hold. The pick
-- is materialised: as a subquery of the UPDATE it could be run again for each row, each run
-- locking other rows, and claim more than the limit.
WITH pick AS MATERIALIZED (
    SELECT task_id, seq FROM stepwarden_steps
    WHERE state = 'not_started' AND agent = %(agent)s AND complete_by > now()
      AND operation = ANY(%(operations)s::text[])
      AND (pickup_within IS NULL
           OR dispatched_at + make_interval(secs => pickup_within) > now())
    ORDER BY ranked_at
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
)
UPDATE stepwarden_steps s
SET state = 'running', locked_by = %(instance)s, claimed_at = now()
FROM pick
WHERE s.task_id = pick.task_id AND s.seq = pick.seq AND s.state = 'not_started'
RETURNING s.task_id, s.seq, s.attempt, s.agent, s.operation, s.input, s.idempotency_key,
          s.complete_by, s.ranked_at, s.compensates, s.trace_context,
          extract(epoch FROM s.complete_by - now())::float8 AS remaining,
          extract(epoch FROM now() - s.dispatched_at)::float8 AS queued,
          (SELECT t.workflow FROM stepwarden_tasks t WHERE t.task_id = s.task_id) AS workflow

-- name: fair_request_tenants
-- The tenants with requests queued at an agent for the given operations, with their weights
-- (stepwarden_tenants; 1 without a row), their passes at this agent (none without a row) and
-- the agent's fair clock: the index of migration 0024 walked from one tenant to the next,
-- for each operation (one probe a tenant, never a read of their requests).
WITH RECURSIVE o AS MATERIALIZED (
    SELECT DISTINCT operation FROM unnest(%(operations)s::text[]) AS o(operation)
    LIMIT cardinality(%(operations)s::text[])
), t AS (
    SELECT o.operation,
           (SELECT x.tenant FROM stepwarden_steps x
            WHERE x.state = 'not_started' AND x.agent = %(agent)s AND x.operation = o.operation
            ORDER BY x.tenant LIMIT 1) AS tenant
    FROM o
    UNION ALL
    SELECT t.operation,
           (SELECT x.tenant FROM stepwarden_steps x
            WHERE x.state = 'not_started' AND x.agent = %(agent)s
              AND x.operation = t.operation AND x.tenant > t.tenant
            ORDER BY x.tenant LIMIT 1)
    FROM t WHERE t.tenant IS NOT NULL
)
SELECT DISTINCT t.tenant, coalesce(n.weight, 1)::float8 AS weight, p.pass,
       (SELECT vtime FROM stepwarden_agent_clock WHERE agent = %(agent)s) AS clock
FROM t
LEFT JOIN stepwarden_tenants n ON n.tenant = t.tenant
LEFT JOIN stepwarden_agent_tenants p ON p.agent = %(agent)s AND p.tenant = t.tenant
WHERE t.tenant IS NOT NULL

-- name: claim_fair_requests
-- claim_requests with each tenant's share (rules.fair_shares: the arrays tenants and counts,
-- side by side): of each tenant, up to its count of its requests queued in time, by rank,
-- through the index of migration 0024, skipping rows others hold; up to the limit in all.
WITH a AS MATERIALIZED (
    SELECT * FROM unnest(%(tenants)s::text[], %(counts)s::int[]) AS a(tenant, n)
), o AS MATERIALIZED (
    SELECT DISTINCT operation FROM unnest(%(operations)s::text[]) AS o(operation)
    LIMIT cardinality(%(operations)s::text[])
), p AS MATERIALIZED (
    SELECT x.*, a.tenant AS share_of, a.n FROM a CROSS JOIN o CROSS JOIN LATERAL (
        SELECT task_id, seq, ranked_at FROM stepwarden_steps s
        WHERE s.state = 'not_started' AND s.agent = %(agent)s AND s.operation = o.operation
          AND s.tenant = a.tenant AND s.complete_by > now()
          AND (s.pickup_within IS NULL
               OR s.dispatched_at + make_interval(secs => s.pickup_within) > now())
        ORDER BY s.ranked_at
        LIMIT a.n
        FOR UPDATE SKIP LOCKED
    ) AS x
), pick AS MATERIALIZED (
    SELECT task_id, seq FROM (
        SELECT task_id, seq, ranked_at, n,
               row_number() OVER (PARTITION BY share_of ORDER BY ranked_at) AS r
        FROM p
    ) AS q
    WHERE q.r <= q.n
    ORDER BY ranked_at
    LIMIT %(limit)s
)
UPDATE stepwarden_steps s
SET state = 'running', locked_by = %(instance)s, claimed_at = now()
FROM pick
WHERE s.task_id = pick.task_id AND s.seq = pick.seq AND s.state = 'not_started'
RETURNING s.task_id, s.seq, s.attempt, s.agent, s.operation, s.input, s.idempotency_key,
          s.complete_by, s.ranked_at, s.compensates, s.trace_context, s.tenant,
          extract(epoch FROM s.complete_by - now())::float8 AS remaining,
          extract(epoch FROM now() - s.dispatched_at)::float8 AS queued,
          (SELECT t.workflow FROM stepwarden_tasks t WHERE t.task_id = s.task_id) AS workflow

-- name: advance_agent_tenants
-- Each tenant served by a claim of an agent's requests: its pass at the agent moves on by
-- its claims over its weight (delta), from the agent's fair clock at least (floor). In the
-- order of the tenants, so that claims side by side lock their rows in one order.
INSERT INTO stepwarden_agent_tenants AS n (agent, tenant, pass)
SELECT %(agent)s, d.tenant, %(floor)s::float8 + d.delta
FROM unnest(%(tenant)s::text[], %(delta)s::float8[]) AS d(tenant, delta)
ORDER BY d.tenant
ON CONFLICT (agent, tenant) DO UPDATE
SET pass = greatest(n.pass, %(floor)s::float8) + (excluded.pass - %(floor)s::float8)

-- name: advance_agent_clock
-- An agent's fair clock moves on (never back) to the least pass of the tenants a claim found.
INSERT INTO stepwarden_agent_clock AS c (agent, vtime) VALUES (%(agent)s, %(clock)s)
ON CONFLICT (agent) DO UPDATE SET vtime = greatest(c.vtime, excluded.vtime)

-- name: limits_lock
-- Claims within limits of one agent's operations go one at a time, until commit.
SELECT pg_advisory_xact_lock(hashtextextended('stepwarden.limits:' || %(agent)s, 0))

-- name: limited_candidates
-- Queued requests of an agent in claim order, for a claim within the operations' limits.
SELECT task_id, seq, operation, limit_key, tenant, ranked_at FROM stepwarden_steps
WHERE state = 'not_started' AND agent = %(agent)s AND complete_by > now()
  AND operation = ANY(%(operations)s::text[])
  AND (pickup_within IS NULL OR dispatched_at + make_interval(secs => pickup_within) > now())
ORDER BY ranked_at
LIMIT %(scan)s
FOR UPDATE SKIP LOCKED

-- name: limited_fair_candidates
-- Queued requests of an agent of each of the given tenants, up to scan of each in claim
-- order, through the index of migration 0024, skipping rows others hold: a fair claim within
-- the operations' limits picks each tenant's share from them.
WITH a AS MATERIALIZED (
    SELECT DISTINCT tenant FROM unnest(%(tenants)s::text[]) AS a(tenant)
    LIMIT cardinality(%(tenants)s::text[])
), o AS MATERIALIZED (
    SELECT DISTINCT operation FROM unnest(%(operations)s::text[]) AS o(operation)
    LIMIT cardinality(%(operations)s::text[])
)
SELECT task_id, seq, operation, limit_key, tenant, ranked_at FROM (
    SELECT x.*, row_number() OVER (PARTITION BY x.tenant ORDER BY x.ranked_at) AS r
    FROM a CROSS JOIN o CROSS JOIN LATERAL (
        SELECT s.task_id, s.seq, s.operation, s.limit_key, s.tenant, s.ranked_at
        FROM stepwarden_steps s
        WHERE s.state = 'not_started' AND s.agent = %(agent)s AND s.operation = o.operation
          AND s.tenant = a.tenant AND s.complete_by > now()
          AND (s.pickup_within IS NULL
               OR s.dispatched_at + make_interval(secs => s.pickup_within) > now())
        ORDER BY s.ranked_at
        LIMIT %(scan)s
        FOR UPDATE SKIP LOCKED
    ) AS x
) AS q
WHERE q.r <= %(scan)s

-- name: running_counts
-- Steps running now, by operation and limit key ('' for none).
SELECT operation, coalesce(limit_key, '') AS limit_key, count(*)::int AS n
FROM stepwarden_steps
WHERE state = 'running' AND agent = %(agent)s AND operation = ANY(%(operations)s::text[])
GROUP BY operation, coalesce(limit_key, '')

-- name: forget_starts
-- Starts of rate-limited operations older than their period are forgotten.
DELETE FROM stepwarden_starts s
USING unnest(%(operation)s::text[], %(per)s::float8[]) AS r(operation, per)
WHERE s.agent = %(agent)s AND s.operation = r.operation
  AND s.at <= now() - make_interval(secs => r.per)

-- name: start_counts
-- Starts of rate-limited operations within each one's period, by limit key.
WITH r AS (
    SELECT * FROM unnest(%(operation)s::text[], %(per)s::float8[]) AS r(operation, per)
)
SELECT s.operation, s.limit_key, count(*)::int AS n
FROM stepwarden_starts s JOIN r ON r.operation = s.operation
WHERE s.agent = %(agent)s AND s.at > now() - make_interval(secs => r.per)
GROUP BY s.operation, s.limit_key

-- name: claim_chosen
-- Claim the requests chosen within limits, and note the starts of rate-limited ones.
WITH c AS (
    SELECT * FROM unnest(%(task_id)s::text[], %(seq)s::int[]) AS c(task_id, seq)
), u AS (
    UPDATE stepwarden_steps s
    SET state = 'running', locked_by = %(instance)s, claimed_at = now()
    FROM c
    WHERE s.task_id = c.task_id AND s.seq = c.seq AND s.state = 'not_started'
    RETURNING s.task_id, s.seq, s.attempt, s.agent, s.operation, s.input, s.idempotency_key,
              s.complete_by, s.ranked_at, s.compensates, s.limit_key, s.trace_context,
              s.tenant, extract(epoch FROM s.complete_by - now())::float8 AS remaining,
              extract(epoch FROM now() - s.dispatched_at)::float8 AS queued,
              (SELECT t.workflow FROM stepwarden_tasks t WHERE t.task_id = s.task_id)
                  AS workflow
), i AS (
    INSERT INTO stepwarden_starts (agent, operation, limit_key, at)
    SELECT agent, operation, coalesce(limit_key, ''), now() FROM u
    WHERE operation = ANY(%(rated)s::text[])
)
SELECT * FROM u

-- name: hand_back
-- Claimed requests back in the queue, untried here, fenced like outcomes.
WITH d AS (
    SELECT * FROM unnest(%(task_id)s::text[], %(seq)s::int[], %(attempt)s::int[],
                         %(instance)s::text[], %(reason)s::text[], %(ord)s::int[])
        AS d(task_id, seq, attempt, instance, reason, ord)
), u AS (
    UPDATE stepwarden_steps s
    SET state = 'not_started', locked_by = NULL, claimed_at = NULL,
        reassignments = s.reassignments + 1
    FROM d
    WHERE s.task_id = d.task_id AND s.seq = d.seq AND s.attempt = d.attempt
      AND s.state = 'running' AND s.locked_by = d.instance AND s.complete_by > now()
    RETURNING d.ord, d.task_id, d.seq, d.attempt, d.instance, d.reason, s.agent
), e AS (
    INSERT INTO stepwarden_events (task_id, at, kind, detail)
    SELECT task_id, now(), 'handed_back',
           json_build_object('seq', seq, 'attempt', attempt, 'from', instance, 'reason', reason)
    FROM u ORDER BY ord
)
SELECT ord, task_id, seq, agent FROM u

-- name: note_run
-- Record the trace context of a task's run (its span) while the run holds the task, for the
-- next run to link to (stepwarden.tracing).
UPDATE stepwarden_tasks SET run_trace = %(run_trace)s
WHERE task_id = %(task_id)s AND attempt = %(attempt)s AND locked_by = %(scheduler)s
RETURNING task_id

-- name: held_tags
-- The tags of a task while its scheduler holds it under this attempt (no row: not held so),
-- its row locked until the commit (set_tags follows).
SELECT tags FROM stepwarden_tasks
WHERE task_id = %(task_id)s AND attempt = %(attempt)s AND locked_by = %(scheduler)s
FOR UPDATE

-- name: set_tags
-- A held task's tags, as its workflow tagged it (Context.tag); stepwarden_task_tags
-- follows by trigger (migration 0022).
UPDATE stepwarden_tasks SET tags = %(tags)s::json
WHERE task_id = %(task_id)s AND attempt = %(attempt)s AND locked_by = %(scheduler)s
RETURNING task_id

-- name: heartbeat_step
-- Extend a running step's complete_by by its complete_within from now: never shorter than
-- it is, never past its task's complete_by nor its total timeout.
UPDATE stepwarden_steps s
SET heartbeat = %(detail)s::json, heartbeat_at = now(),
    complete_by = stepwarden_step_deadline(
        now(),
        coalesce(make_interval(secs => s.complete_within), s.complete_by - s.dispatched_at),
        coalesce((SELECT t.complete_by FROM stepwarden_tasks t WHERE t.task_id = s.task_id),
                 s.complete_by),
        s.give_up_by, s.complete_by)
WHERE s.task_id = %(task_id)s AND s.seq = %(seq)s AND s.attempt = %(attempt)s
  AND s.state = 'running' AND s.locked_by = %(instance)s AND s.complete_by > now()
RETURNING extract(epoch FROM s.complete_by - now())::float8 AS remaining

-- name: call_facts
-- The facts rules.call_lost and rules.plan_call_stopped decide on, for each step of the
-- batch: its agent, state, attempt, holder, abandonment and stop, the seconds left before
-- its complete_by, and its task's state, holder and attempt.
SELECT s.task_id, s.seq, s.agent, s.state, s.attempt, s.locked_by, s.abandoned,
       s.call_stopped_at IS NOT NULL AS call_stopped,
       extract(epoch FROM s.complete_by - now())::float8 AS remaining,
       t.process_state, t.locked_by AS task_locked_by, t.attempt AS task_attempt
FROM unnest(%(task_id)s::text[], %(seq)s::int[]) AS c(task_id, seq)
JOIN stepwarden_steps s ON s.task_id = c.task_id AND s.seq = c.seq
JOIN stepwarden_tasks t ON t.task_id = s.task_id

-- name: held_steps
-- The steps of an agent that an instance of it holds: running, locked by it, before their
-- complete_by; as claim_requests returns them, with the facts rules.call_lost decides on.
SELECT s.task_id, s.seq, s.attempt, s.agent, s.operation, s.input, s.idempotency_key,
       s.complete_by, s.ranked_at, s.compensates, s.trace_context,
       extract(epoch FROM s.complete_by - now())::float8 AS remaining,
       s.state, s.locked_by, s.abandoned, s.call_stopped_at IS NOT NULL AS call_stopped,
       t.process_state
FROM stepwarden_steps s JOIN stepwarden_tasks t ON t.task_id = s.task_id
WHERE s.state = 'running' AND s.agent = %(agent)s AND s.locked_by = %(instance)s AND s.complete_by > now()

-- name: lock_tasks
-- Tasks a flow decides on, locked until commit (in the order of their ids).
SELECT task_id FROM stepwarden_tasks WHERE task_id = ANY(%(task_ids)s::text[])
ORDER BY task_id
FOR UPDATE

-- name: stop_calls
-- Agents' word that their calls of steps ended, as the caller planned
-- (rules.plan_call_stopped), fenced by the attempt, the instance and the state it read:
-- `stopped` notes when (call_stopped_at); `requeue` and `hand_back` put a step still running
-- back to not_started (requeue: past its complete_by, for the task's next scheduler to
-- dispatch again). Then a `call_stopped` event each.
WITH d AS (
    SELECT * FROM unnest(%(task_id)s::text[], %(seq)s::int[], %(attempt)s::int[],
                         %(instance)s::text[], %(state)s::text[], %(plan)s::text[],
                         %(reason)s::text[], %(ord)s::int[])
        AS d(task_id, seq, attempt, instance, state, plan, reason, ord)
), u AS (
    UPDATE stepwarden_steps s
    SET call_stopped_at = CASE WHEN d.plan = 'stopped' THEN now() END,
        state = CASE WHEN d.plan = 'stopped' THEN s.state ELSE 'not_started' END,
        locked_by = CASE WHEN d.plan = 'stopped' THEN s.locked_by END,
        claimed_at = CASE WHEN d.plan = 'stopped' THEN s.claimed_at END,
        complete_by = CASE WHEN d.plan = 'requeue' THEN LEAST(s.complete_by, now())
                           ELSE s.complete_by END
    FROM d
    WHERE s.task_id = d.task_id AND s.seq = d.seq AND s.attempt = d.attempt
      AND s.locked_by = d.instance AND s.state = d.state AND s.call_stopped_at IS NULL
    RETURNING d.ord, d.task_id, d.seq, d.attempt, d.instance, d.plan, d.reason
), e AS (
    INSERT INTO stepwarden_events (task_id, at, kind, detail)
    SELECT task_id, now(), 'call_stopped',
           json_build_object('seq', seq, 'attempt', attempt, 'from', instance,
                             'reason', reason, 'then', plan)
    FROM u ORDER BY ord
)
SELECT ord, task_id, seq FROM u

-- name: hold_facts
-- The facts rules.compensation_wait decides on: the steps of the given tasks an agent may
-- still be calling (open, or abandoned), the seconds left before their complete_by, and
-- whether their call was reported stopped.
SELECT task_id, seq, extract(epoch FROM complete_by - now())::float8 AS remaining,
       call_stopped_at IS NOT NULL AS call_stopped
FROM stepwarden_steps
WHERE task_id = ANY(%(task_ids)s::text[])
  AND (state IN ('not_started', 'running') OR abandoned)
ORDER BY task_id, seq

-- name: compensate_sooner
-- Compensating tasks no scheduler holds (under the attempt read) are eligible after `hold`
-- seconds (what their steps still hold them up for, rules.compensation_wait), never sooner
-- than the end of their backoff (backoff_until; a task without one keeps its eligible_at),
-- never later than they were.
WITH d AS (
    SELECT * FROM unnest(%(task_id)s::text[], %(attempt)s::int[], %(hold)s::float8[],
                         %(ord)s::int[])
        AS d(task_id, attempt, hold, ord)
)
UPDATE stepwarden_tasks t
SET eligible_at = LEAST(t.eligible_at,
                        GREATEST(now() + make_interval(secs => d.hold), t.backoff_until))
FROM d
WHERE t.task_id = d.task_id AND t.attempt = d.attempt AND t.process_state = 'compensating'
  AND t.locked_by IS NULL AND t.backoff_until IS NOT NULL
RETURNING d.ord, t.task_id, t.eligible_at <= now() AS due

-- name: agent_beat
INSERT INTO stepwarden_agents AS a (instance, agent, operations, capacity, inflight, breaker,
                                    breaker_detail, started_at, heartbeat_at, expires_at)
SELECT b.instance, b.agent, b.operations::json, b.capacity, b.inflight, b.breaker,
       b.breaker_detail::json, now(), now(), now() + make_interval(secs => %(ttl)s)
FROM unnest(%(instance)s::text[], %(agent)s::text[], %(operations)s::text[],
            %(capacity)s::int[], %(inflight)s::int[], %(breaker)s::text[],
            %(breaker_detail)s::text[])
     AS b(instance, agent, operations, capacity, inflight, breaker, breaker_detail)
ON CONFLICT (instance, agent) DO UPDATE
SET operations = excluded.operations, capacity = excluded.capacity,
    inflight = excluded.inflight, breaker = excluded.breaker,
    breaker_detail = excluded.breaker_detail, heartbeat_at = excluded.heartbeat_at,
    expires_at = excluded.expires_at

-- name: agent_leave
UPDATE stepwarden_agents SET expires_at = LEAST(expires_at, now())
WHERE instance = %(instance)s AND agent = ANY(%(agents)s::text[])

-- name: agent_room
-- The capacity of the alive agent instances, and what takes it up: the held tasks (each about
-- to queue a step, or waiting for one) or the steps queued or running in time, the more; of
-- these, only what alive instances hold: not a task of a scheduler instance found gone, nor
-- a step running under an agent instance gone (the supervisor gives both back).
SELECT (SELECT sum(capacity) FROM stepwarden_agents WHERE expires_at > now()) AS capacity,
       GREATEST((SELECT count(*) FROM stepwarden_tasks t
                 WHERE t.complete_by IS NOT NULL
                   AND NOT EXISTS (SELECT 1 FROM stepwarden_schedulers g
                                   WHERE g.instance = t.locked_by
                                     AND g.expires_at <= now())),
                (SELECT count(*) FROM stepwarden_steps s
                 WHERE s.state IN ('not_started', 'running') AND s.complete_by > now()
                   AND (s.state = 'not_started'
                        OR EXISTS (SELECT 1 FROM stepwarden_agents a
                                   WHERE a.instance = s.locked_by AND a.agent = s.agent
                                     AND a.expires_at > now())))) AS open

-- name: list_agents
SELECT *, expires_at > now() AS alive FROM stepwarden_agents
ORDER BY agent, started_at, instance

-- name: read_step
SELECT *, extract(epoch FROM complete_by - now())::float8 AS remaining FROM stepwarden_steps
WHERE task_id = %(task_id)s AND seq = %(seq)s

-- name: read_held_step
-- A step, the seconds until its complete_by, and whether its task is still held under this
-- attempt by this scheduler: a drive's look at a step it waits for, once its complete_by
-- has passed (the supervisor then either fails the step or takes the task from the drive).
SELECT s.*, extract(epoch FROM s.complete_by - now())::float8 AS remaining,
       EXISTS (SELECT 1 FROM stepwarden_tasks t
               WHERE t.task_id = s.task_id AND t.attempt = %(attempt)s
                 AND t.locked_by = %(scheduler)s
                 AND t.process_state IN ('processing', 'compensating')) AS held
FROM stepwarden_steps s
WHERE s.task_id = %(task_id)s AND s.seq = %(seq)s

-- name: gone_holders
-- Running steps in time whose agent instance is gone, whatever the state of their task
-- (held, released, waiting, paused...), with that task's state, holder and attempt, and
-- whether its holder is a scheduler instance found gone: both rows locked, so that the task
-- is not claimed meanwhile (a claim skips it, and adopts the step given back once this
-- commits) and its hold as read is the one kept or released.
SELECT s.task_id, s.seq, s.attempt, s.agent, s.locked_by, t.attempt AS task_attempt,
       t.process_state AS task_state, t.locked_by AS task_locked_by,
       EXISTS (SELECT 1 FROM stepwarden_schedulers g
               WHERE g.instance = t.locked_by AND g.expires_at <= now()) AS task_holder_gone
FROM stepwarden_steps s JOIN stepwarden_tasks t ON t.task_id = s.task_id
WHERE s.state = 'running' AND s.complete_by > now()
  AND NOT EXISTS (SELECT 1 FROM stepwarden_agents a
                  WHERE a.instance = s.locked_by AND a.agent = s.agent
                    AND a.expires_at > now())
LIMIT %(limit)s
FOR UPDATE OF s, t SKIP LOCKED

-- name: pickup_expired
-- Steps no agent claimed within their pick-up timeout.
SELECT task_id, seq, attempt, agent, locked_by, state, pickup_within FROM stepwarden_steps
WHERE state = 'not_started' AND pickup_within IS NOT NULL
  AND dispatched_at + make_interval(secs => pickup_within) < now()
LIMIT %(limit)s
FOR UPDATE SKIP LOCKED

-- name: total_expired
-- Open steps past their total timeout (`total`: seconds from the first dispatch).
SELECT task_id, seq, attempt, agent, locked_by, state,
       extract(epoch FROM give_up_by - created_at)::float8 AS total
FROM stepwarden_steps
WHERE state IN ('not_started', 'running') AND give_up_by IS NOT NULL AND give_up_by < now()
LIMIT %(limit)s
FOR UPDATE SKIP LOCKED

-- name: reassign_steps
-- The running steps of gone agent instances back to not_started under a new attempt, as
-- the caller planned (rules.plan_gone_step), each fenced by the attempt, state and holder
-- read, and named after the task's attempt read (its holder's, or the last one's, whose
-- next claim adopts it): `in_time`, with a full complete_by of its own (never past the
-- complete_by of a task kept held), for another instance to claim; otherwise past its
-- complete_by (its task paused), for the scheduler resuming the task to dispatch again. A
-- task held under the attempt and state read by a scheduler instance found gone is
-- released into `released_as` (when given), failure_count unchanged, for a scheduler to
-- take up again at once (it adopts the step).
WITH d AS (
    SELECT * FROM unnest(%(task_id)s::text[], %(seq)s::int[], %(attempt)s::int[],
                         %(instance)s::text[], %(in_time)s::bool[], %(task_attempt)s::int[],
                         %(held_as)s::text[], %(released_as)s::text[], %(ord)s::int[])
        AS d(task_id, seq, attempt, instance, in_time, task_attempt, held_as, released_as,
             ord)
), r AS (
    UPDATE stepwarden_steps s
    SET state = 'not_started', attempt = s.attempt + 1, reassignments = s.reassignments + 1,
        task_attempt = d.task_attempt, locked_by = NULL, claimed_at = NULL,
        dispatched_at = now(), ranked_at = now() - (s.dispatched_at - s.ranked_at),
        complete_by = CASE WHEN d.in_time THEN stepwarden_step_deadline(
            now(),
            coalesce(make_interval(secs => s.complete_within), s.complete_by - s.dispatched_at),
            CASE WHEN d.released_as IS NULL THEN t.complete_by END, s.give_up_by, NULL)
            ELSE LEAST(s.complete_by, now()) END
    FROM d JOIN stepwarden_tasks t ON t.task_id = d.task_id
    WHERE s.task_id = d.task_id AND s.seq = d.seq AND s.attempt = d.attempt
      AND s.state = 'running' AND s.locked_by = d.instance
    RETURNING d.ord, s.task_id, s.seq, s.attempt, d.instance, d.task_attempt, d.held_as,
              d.released_as
), rel AS (
    UPDATE stepwarden_tasks t
    SET locked_by = NULL, complete_by = NULL, eligible_at = now(), updated_at = now(),
        process_state = x.released_as
    FROM (SELECT DISTINCT task_id, task_attempt, held_as, released_as FROM r
          WHERE released_as IS NOT NULL) AS x
    WHERE t.task_id = x.task_id AND t.attempt = x.task_attempt AND t.locked_by IS NOT NULL
      AND t.process_state = x.held_as
), e AS (
    INSERT INTO stepwarden_events (task_id, at, kind, detail)
    SELECT task_id, now(), 'reassigned',
           json_build_object('seq', seq, 'attempt', attempt, 'from', instance,
                             'by', %(holder)s::text, 'term', %(term)s::bigint)
    FROM r ORDER BY ord
)
SELECT ord, task_id, seq, attempt FROM r

-- name: fail_steps
-- Steps past their pick-up or total timeout fail with the error (and abandonment) the caller
-- worked out (rules.pickup_failure, rules.total_failure), fenced by the attempt and state
-- read.
WITH d AS (
    SELECT * FROM unnest(%(task_id)s::text[], %(seq)s::int[], %(attempt)s::int[],
                         %(state)s::text[], %(error)s::text[], %(abandoned)s::bool[],
                         %(ord)s::int[])
        AS d(task_id, seq, attempt, state, error, abandoned, ord)
), f AS (
    UPDATE stepwarden_steps s
    SET state = 'failed', error = d.error, abandoned = d.abandoned, locked_by = NULL,
        finished_at = now()
    FROM d
    WHERE s.task_id = d.task_id AND s.seq = d.seq AND s.attempt = d.attempt
      AND s.state = d.state
    RETURNING d.ord, s.task_id, s.seq, s.attempt, d.error
), e AS (
    INSERT INTO stepwarden_events (task_id, at, kind, detail)
    SELECT task_id, now(), 'step_failed',
           json_build_object('seq', seq, 'attempt', attempt, 'error', error,
                             'by', %(holder)s::text, 'term', %(term)s::bigint)
    FROM f ORDER BY ord
)
SELECT ord, task_id, seq, attempt FROM f

-- name: forget_agents
-- Agent instances gone for a while leave the registry.
DELETE FROM stepwarden_agents
WHERE expires_at < now() - make_interval(secs => %(forget_after)s::float8)

-- name: complete_steps
-- running -> completed | failed for the current attempt, its agent, before complete_by.
WITH d AS (
    SELECT * FROM unnest(%(task_id)s::text[], %(seq)s::int[], %(attempt)s::int[],
                         %(instance)s::text[], %(state)s::text[], %(result)s::text[],
                         %(error)s::text[], %(tries)s::int[], %(ord)s::int[])
        AS d(task_id, seq, attempt, instance, state, result, error, tries, ord)
    LIMIT cardinality(%(ord)s::int[])  -- every row: a kept plan for a few (claim_tasks)
), u AS (
    UPDATE stepwarden_steps s
    SET state = d.state, result = d.result::json, error = d.error, tries = d.tries,
        finished_at = now()
    FROM d
    WHERE s.task_id = d.task_id AND s.seq = d.seq AND s.attempt = d.attempt
      AND s.state = 'running' AND s.locked_by = d.instance AND s.complete_by > now()
    RETURNING d.ord, d.task_id, d.seq, d.attempt, d.state, d.error
), e AS (
    INSERT INTO stepwarden_events (task_id, at, kind, detail)
    SELECT task_id, now(), 'step_failed',
           json_build_object('seq', seq, 'attempt', attempt, 'error', error)
    FROM u WHERE state = 'failed'
    ORDER BY ord
)
SELECT ord, task_id, seq FROM u

-- name: lock_lease_row
-- A lease as it stands, locked until commit, whether it is live (by the clock now, not
-- the statement's start: a read that waited for the row lock sees the lease as it is), and
-- the seconds until it lapses.
SELECT holder, term, expires_at > clock_timestamp() AS live,
       extract(epoch FROM expires_at - clock_timestamp())::float8 AS lapses_in
FROM stepwarden_leases
WHERE name = %(name)s
FOR UPDATE

-- name: look_lease
-- A lease as it stands, not locked (a standby's look, written beside its process's registry
-- beats: it waits for no lock the leader holds), whether it is live, and the seconds until it
-- lapses.
SELECT holder, term, expires_at > clock_timestamp() AS live,
       extract(epoch FROM expires_at - clock_timestamp())::float8 AS lapses_in
FROM stepwarden_leases
WHERE name = %(name)s

-- name: next_expiry
-- Seconds until the soonest expiry to come of a registry row (an instance silent from now
-- on is gone then) and of the lease when another holds it; NULL when none is coming.
SELECT EXTRACT(EPOCH FROM least(
    (SELECT min(expires_at) FROM stepwarden_schedulers WHERE expires_at > now()),
    (SELECT min(expires_at) FROM stepwarden_agents WHERE expires_at > now()),
    (SELECT expires_at FROM stepwarden_leases
     WHERE name = %(name)s AND holder <> %(holder)s AND expires_at > now())
) - now())::float8 AS seconds

-- name: put_lease
-- Take or renew a lease under the term the caller worked out (rules.lease_term), only while
-- the term read (`seen`) stands: a lease first taken by another meanwhile is not overwritten.
-- Its ttl runs from when the row is written (clock_timestamp).
INSERT INTO stepwarden_leases AS l (name, holder, term, expires_at, renewed_at)
VALUES (%(name)s, %(holder)s, %(term)s,
        clock_timestamp() + make_interval(secs => %(ttl)s::float8), clock_timestamp())
ON CONFLICT (name) DO UPDATE
SET holder = excluded.holder, term = excluded.term, expires_at = excluded.expires_at,
    renewed_at = excluded.renewed_at
WHERE l.term = %(seen)s::bigint
RETURNING term

-- name: end_stalled_sessions
-- Sessions of this application, other than this one, whose transaction has lasted longer than
-- `stalled` seconds and waits on its client (frozen mid-pipeline, where the server's idle
-- timeout does not apply): ended, which rolls their transaction back and frees its locks.
-- The rest of the transaction waits `lock_timeout` (ms) at most for a lock (a session not
-- stalled for long enough yet still holds it: the caller tries again soon). One row with a
-- NULL pid when none is ended.
WITH waits AS MATERIALIZED (
    SELECT set_config('lock_timeout', %(lock_timeout)s::text, true) AS lock_timeout
)
SELECT a.pid, pg_terminate_backend(a.pid) AS ended
FROM waits LEFT JOIN pg_stat_activity a
  ON a.datname = current_database() AND a.usename = current_user
  AND a.application_name = %(application_name)s AND a.pid <> pg_backend_pid()
  AND a.wait_event = 'ClientRead' AND a.state IN ('active', 'idle in transaction')
  AND a.xact_start < now() - make_interval(secs => %(stalled)s::float8)

-- name: release_lease
-- Let the lease lapse at once, so that the next taker gets a new term.
UPDATE stepwarden_leases SET expires_at = 'epoch'
WHERE name = %(name)s AND holder = %(holder)s

-- name: lock_lease
-- The sweep's fence: the lease row, locked until the sweep commits, when held at this term.
SELECT term FROM stepwarden_leases
WHERE name = %(name)s AND holder = %(holder)s AND term = %(term)s AND expires_at > now()
FOR UPDATE

-- name: expired_steps
-- Open steps of the current attempt of held tasks whose complete_by passed. (A task the
-- sweep released, or an operator's retry reopened, is held again only once claimed.) A step
-- past its total timeout (give_up_by) is not one: it fails by `total_expired`, counting no
-- failure of its task.
-- (The lateral LIMIT 1 keeps the plan a walk of the expiry index with one task lookup each.)
SELECT t.task_id, t.attempt, t.failure_count, t.compensation_failures, t.max_failures,
       t.process_state, t.on_failure, s.seq
FROM stepwarden_steps s
CROSS JOIN LATERAL (
    SELECT task_id, attempt, failure_count, compensation_failures, max_failures, process_state,
           on_failure
    FROM stepwarden_tasks
    WHERE task_id = s.task_id AND process_state IN ('processing', 'compensating')
      AND locked_by IS NOT NULL AND attempt = s.task_attempt
    LIMIT 1) t
WHERE s.state IN ('not_started', 'running') AND s.complete_by < now()
  AND (s.give_up_by IS NULL OR s.give_up_by >= now())
ORDER BY s.complete_by
LIMIT %(limit)s

-- name: expired_tasks
-- Held tasks (processing, compensating) whose complete_by passed.
SELECT task_id, attempt, failure_count, compensation_failures, max_failures, process_state,
       on_failure, NULL::integer AS seq
FROM stepwarden_tasks
WHERE complete_by < now() AND process_state IN ('processing', 'compensating')
ORDER BY complete_by
LIMIT %(limit)s

-- name: reset_tasks
-- The supervisor's recovery of expired tasks into the states the caller planned
-- (rules.plan_expiry), each fenced by the attempt and state it read. A task whose open
-- steps are abandoned waits `hold` seconds for them too (rules.compensation_wait: an agent
-- still calling may yet apply its effect), and its backoff's end is kept (backoff_until).
WITH d AS (
    SELECT * FROM unnest(%(task_id)s::text[], %(attempt)s::int[], %(seq)s::int[],
                         %(held_as)s::text[], %(state)s::text[], %(failure_count)s::int[],
                         %(compensation_failures)s::int[], %(expiries)s::int[],
                         %(error)s::text[], %(delay)s::float8[],
                         %(finished)s::bool[], %(abandon)s::bool[], %(alert)s::text[],
                         %(abandoned_error)s::text[], %(hold)s::float8[], %(ord)s::int[])
        AS d(task_id, attempt, seq, held_as, state, failure_count, compensation_failures,
             expiries, error, delay, finished, abandon, alert, abandoned_error, hold, ord)
), u AS (
    UPDATE stepwarden_tasks t
    SET failure_count = d.failure_count, compensation_failures = d.compensation_failures,
        locked_by = NULL, complete_by = NULL, process_state = d.state,
        error = coalesce(d.error, t.error),
        finished_at = CASE WHEN d.finished THEN now() END,
        eligible_at = now() + make_interval(secs => GREATEST(d.delay, d.hold)),
        backoff_until = CASE WHEN d.abandon THEN now() + make_interval(secs => d.delay)
                             ELSE t.backoff_until END,
        updated_at = now()
    FROM d
    WHERE t.task_id = d.task_id AND t.attempt = d.attempt AND t.process_state = d.held_as
      AND t.locked_by IS NOT NULL
    RETURNING d.ord, t.task_id, d.attempt, d.seq, d.expiries, t.process_state, t.error,
              d.alert, d.abandon, d.abandoned_error
), e AS (
    INSERT INTO stepwarden_events (task_id, at, kind, detail)
    SELECT u.task_id, now(), x.kind, x.detail
    FROM u CROSS JOIN LATERAL (VALUES
        (1, 'expired', json_build_object('seq', u.seq, 'attempt', u.attempt,
                                         'failure_count', u.expiries, 'by', %(holder)s::text,
                                         'term', %(term)s::bigint)),
        (2, 'alert', CASE WHEN u.alert IS NOT NULL
                          THEN json_build_object('reason', u.alert, 'error', u.error,
                                                 'then', u.process_state)
                     END)) AS x(k, kind, detail)
    WHERE x.detail IS NOT NULL
    ORDER BY u.ord, x.k
), c AS (
    -- A task leaving the held states leaves no request behind.
    UPDATE stepwarden_steps s
    SET state = 'failed', error = u.abandoned_error, abandoned = true, finished_at = now()
    FROM u
    WHERE u.abandon AND s.task_id = u.task_id AND s.state IN ('not_started', 'running')
)
SELECT ord, task_id, seq, expiries AS failure_count, process_state FROM u ORDER BY ord

-- name: set_aside
-- Tasks the sweep could not recover wait for an operator in the state the caller planned
-- (rules.plan_set_aside), fenced by the attempt and state read; a `set_aside` event and an
-- alert each, their open steps closed (abandoned).
WITH d AS (
    SELECT * FROM unnest(%(task_id)s::text[], %(attempt)s::int[], %(held_as)s::text[],
                         %(state)s::text[], %(error)s::text[], %(alert)s::text[],
                         %(abandoned_error)s::text[], %(ord)s::int[])
        AS d(task_id, attempt, held_as, state, error, alert, abandoned_error, ord)
), u AS (
    UPDATE stepwarden_tasks t
    SET process_state = d.state, error = d.error, locked_by = NULL, complete_by = NULL,
        finished_at = now(), eligible_at = now(), updated_at = now()
    FROM d
    WHERE t.task_id = d.task_id AND t.attempt = d.attempt AND t.process_state = d.held_as
      AND t.locked_by IS NOT NULL
    RETURNING d.ord, t.task_id, t.failure_count, t.process_state, t.error, d.alert,
              d.abandoned_error
), e AS (
    INSERT INTO stepwarden_events (task_id, at, kind, detail)
    SELECT u.task_id, now(), x.kind, x.detail
    FROM u CROSS JOIN LATERAL (VALUES
        (1, 'set_aside', json_build_object('error', u.error, 'by', %(holder)s::text,
                                           'term', %(term)s::bigint)),
        (2, 'alert', json_build_object('reason', u.alert, 'error', u.error,
                                       'then', u.process_state))) AS x(k, kind, detail)
    ORDER BY u.ord, x.k
), c AS (
    UPDATE stepwarden_steps s
    SET state = 'failed', error = u.abandoned_error, abandoned = true, finished_at = now()
    FROM u
    WHERE s.task_id = u.task_id AND s.state IN ('not_started', 'running')
)
SELECT ord, task_id, failure_count, process_state FROM u ORDER BY ord

-- name: set_fork
-- A fork just inserted (App.fork): the task it was forked from, and whose idempotency
-- keys its steps carry (records.idempotency_key).
UPDATE stepwarden_tasks
SET forked_from = %(forked_from)s, keys_of = %(keys_of)s, new_keys_from = %(new_keys_from)s::int
WHERE task_id = %(task_id)s

-- name: insert_forked_steps
-- A fork's kept steps: each a copy of its original's step, completed with its result and
-- its idempotency key, its input and result sealed again for the fork (new_id).
INSERT INTO stepwarden_steps (task_id, seq, name, agent, operation, state, attempt,
                              task_attempt, priority, complete_by, idempotency_key, input,
                              result, tries, created_at, dispatched_at, claimed_at,
                              finished_at, compensation, compensation_input, complete_within,
                              position, ranked_at, limit_key, tenant)
SELECT d.new_id, s.seq, s.name, s.agent, s.operation, s.state, s.attempt, 0, s.priority,
       s.complete_by, s.idempotency_key, d.input::json, d.result::json, s.tries, s.created_at,
       s.dispatched_at, s.claimed_at, s.finished_at, s.compensation,
       d.compensation_input::json, s.complete_within, s.position, s.ranked_at, s.limit_key,
       coalesce(f.tenant, s.tenant)
FROM unnest(%(task_id)s::text[], %(seq)s::int[], %(new_id)s::text[], %(input)s::text[],
            %(result)s::text[], %(compensation_input)s::text[])
     AS d(task_id, seq, new_id, input, result, compensation_input)
JOIN stepwarden_steps AS s ON s.task_id = d.task_id AND s.seq = d.seq
LEFT JOIN stepwarden_tasks AS f ON f.task_id = d.new_id

-- name: get_task
-- One task.
SELECT * FROM stepwarden_tasks WHERE task_id = %(task_id)s

-- name: mark_awaited
-- A waiter for the task's result marks its row awaited, under the row's lock, where a
-- scheduler holds it (rules.await_next): the end after the mark reads it. A row no
-- scheduler holds is not marked (schedulers claim those skipping locked rows); one that
-- stopped being held while the mark waited for its lock stays locked until this statement
-- ends. The task as marked; nothing when not marked.
UPDATE stepwarden_tasks SET awaited = true
WHERE task_id = %(task_id)s AND NOT awaited AND locked_by IS NOT NULL
RETURNING *

-- name: note_awaited
-- A waiter for the result of a task no scheduler holds notes its wait beside the row, where
-- the task's end reads it (rules.await_next).
INSERT INTO stepwarden_awaited (task_id)
SELECT task_id FROM stepwarden_tasks WHERE task_id = %(task_id)s
ON CONFLICT DO NOTHING

-- name: get_steps
-- The steps of one task, in order.
SELECT * FROM stepwarden_steps WHERE task_id = %(task_id)s ORDER BY seq

-- name: list_tasks
-- The tasks a filter matches (records.TaskFilter, for `stepwarden tasks`), oldest first
-- (created_at, then task id bytewise, so that shards merge in the same order), those after the
-- cursor after only (NULL: from the first): a task id, whose created_at is read here, or
-- taken from after_at (an epoch) on a shard that does not hold it; states a JSON array (NULL:
-- any), times as epochs (run unprepared).
SELECT * FROM stepwarden_tasks AS t
WHERE (%(after)s::text IS NULL
       OR t.created_at > coalesce((SELECT a.created_at FROM stepwarden_tasks AS a
                                   WHERE a.task_id = %(after)s::text),
                                  to_timestamp(%(after_at)s::float8))
       OR (t.created_at = coalesce((SELECT a.created_at FROM stepwarden_tasks AS a
                                    WHERE a.task_id = %(after)s::text),
                                   to_timestamp(%(after_at)s::float8))
           AND t.task_id COLLATE "C" > %(after)s::text))
  AND (%(states)s::json IS NULL
       OR t.process_state IN (SELECT json_array_elements_text(%(states)s::json)))
  AND (%(workflow)s::text IS NULL OR t.workflow = %(workflow)s::text)
  AND (%(version)s::int IS NULL OR t.version = %(version)s::int)
  AND (%(tenant)s::text IS NULL OR t.tenant = %(tenant)s::text)
  AND (%(error)s::text IS NULL OR strpos(t.error, %(error)s::text) > 0)
  AND (%(created_after)s::float8 IS NULL OR t.created_at >= to_timestamp(%(created_after)s::float8))
  AND (%(created_before)s::float8 IS NULL OR t.created_at < to_timestamp(%(created_before)s::float8))
  AND (%(finished_after)s::float8 IS NULL
       OR t.finished_at >= to_timestamp(%(finished_after)s::float8))
  AND (%(finished_before)s::float8 IS NULL
       OR t.finished_at < to_timestamp(%(finished_before)s::float8))
ORDER BY t.created_at, t.task_id COLLATE "C"
LIMIT %(limit)s

-- name: select_tasks
-- The tasks a filter matches (records.TaskFilter, for a bulk action), by task id (bytewise, so
-- that shards merge in the same order) from after the cursor after; states a JSON array (NULL:
-- any), tags a JSON object (NULL: none asked), times as epochs (run unprepared).
SELECT * FROM stepwarden_tasks AS t
WHERE t.task_id COLLATE "C" > %(after)s::text
  AND (%(states)s::json IS NULL
       OR t.process_state IN (SELECT json_array_elements_text(%(states)s::json)))
  AND (%(workflow)s::text IS NULL OR t.workflow = %(workflow)s::text)
  AND (%(version)s::int IS NULL OR t.version = %(version)s::int)
  AND (%(tenant)s::text IS NULL OR t.tenant = %(tenant)s::text)
  AND (%(error)s::text IS NULL OR strpos(t.error, %(error)s::text) > 0)
  AND (%(created_after)s::float8 IS NULL OR t.created_at >= to_timestamp(%(created_after)s::float8))
  AND (%(created_before)s::float8 IS NULL OR t.created_at < to_timestamp(%(created_before)s::float8))
  AND (%(finished_after)s::float8 IS NULL
       OR t.finished_at >= to_timestamp(%(finished_after)s::float8))
  AND (%(finished_before)s::float8 IS NULL
       OR t.finished_at < to_timestamp(%(finished_before)s::float8))
  AND (%(tags)s::json IS NULL OR NOT EXISTS (
        SELECT 1 FROM json_each_text(%(tags)s::json) AS w
        WHERE NOT EXISTS (SELECT 1 FROM stepwarden_task_tags AS m
                          WHERE m.task_id = t.task_id AND m.key = w.key
                            AND m.value = w.value)))
ORDER BY t.task_id COLLATE "C"
LIMIT %(limit)s

-- name: list_tagged_tasks
-- list_tasks of the tasks that have every tag of the JSON object tags, read through the
-- tags' index on (key, value) from one of them (key, value) (run unprepared).
SELECT t.* FROM stepwarden_task_tags AS g
JOIN stepwarden_tasks AS t ON t.task_id = g.task_id
WHERE g.key = %(key)s::text AND g.value = %(value)s::text
  AND (%(after)s::text IS NULL
       OR t.created_at > coalesce((SELECT a.created_at FROM stepwarden_tasks AS a
                                   WHERE a.task_id = %(after)s::text),
                                  to_timestamp(%(after_at)s::float8))
       OR (t.created_at = coalesce((SELECT a.created_at FROM stepwarden_tasks AS a
                                    WHERE a.task_id = %(after)s::text),
                                   to_timestamp(%(after_at)s::float8))
           AND t.task_id COLLATE "C" > %(after)s::text))
  AND (%(states)s::json IS NULL
       OR t.process_state IN (SELECT json_array_elements_text(%(states)s::json)))
  AND (%(workflow)s::text IS NULL OR t.workflow = %(workflow)s::text)
  AND (%(version)s::int IS NULL OR t.version = %(version)s::int)
  AND (%(tenant)s::text IS NULL OR t.tenant = %(tenant)s::text)
  AND (%(error)s::text IS NULL OR strpos(t.error, %(error)s::text) > 0)
  AND (%(created_after)s::float8 IS NULL OR t.created_at >= to_timestamp(%(created_after)s::float8))
  AND (%(created_before)s::float8 IS NULL OR t.created_at < to_timestamp(%(created_before)s::float8))
  AND (%(finished_after)s::float8 IS NULL
       OR t.finished_at >= to_timestamp(%(finished_after)s::float8))
  AND (%(finished_before)s::float8 IS NULL
       OR t.finished_at < to_timestamp(%(finished_before)s::float8))
  AND NOT EXISTS (SELECT 1 FROM json_each_text(%(tags)s::json) AS w
                  WHERE NOT EXISTS (SELECT 1 FROM stepwarden_task_tags AS m
                                    WHERE m.task_id = t.task_id AND m.key = w.key
                                      AND m.value = w.value))
ORDER BY t.created_at, t.task_id COLLATE "C"
LIMIT %(limit)s

-- name: client_unfinished
-- The tasks an application API client submitted that have not finished, for its quota,
-- through the partial index of migration 0019 (its states: `states.FINISHED_TASK_STATES`;
-- a unit test keeps them the same).
SELECT count(*) AS unfinished FROM stepwarden_tasks
WHERE submitted_by = %(client)s
  AND process_state NOT IN ('processed', 'error', 'compensated', 'compensation_failed',
                            'cancelled')

-- name: client_agents
-- The alive agent registrations of a client (its instances are named CLIENT/...), and
-- whether this instance's for this agent is one of them.
SELECT count(*) AS alive,
       coalesce(bool_or(instance = %(instance)s AND agent = %(agent)s), false) AS known
FROM stepwarden_agents
WHERE substr(instance, 1, length(%(prefix)s)) = %(prefix)s AND expires_at > now()

-- name: count_tasks
-- The number of tasks in each state.
SELECT process_state, count(*) AS n FROM stepwarden_tasks GROUP BY process_state

-- name: events
-- Events, optionally of one task and one kind, in order (run unprepared).
SELECT id, task_id, at, kind, detail FROM stepwarden_events
WHERE (%(task_id)s::text IS NULL OR task_id = %(task_id)s::text)
  AND (%(kind)s::text IS NULL OR kind = %(kind)s::text)
ORDER BY id
LIMIT %(limit)s

-- name: history
-- A page of one task's events, newest first, below an id (its index read backwards).
SELECT id, task_id, at, kind, detail FROM stepwarden_events
WHERE task_id = %(task_id)s AND (%(before)s::bigint IS NULL OR id < %(before)s::bigint)
ORDER BY id DESC
LIMIT %(limit)s

-- name: wait_read_task
-- A wait reads the task it parks, and locks it until commit (a send waits for it).
SELECT process_state, attempt, locked_by FROM stepwarden_tasks
WHERE task_id = %(task_id)s FOR UPDATE

-- name: read_wait
-- The wait at a position of a task's workflow, and whether its time has come.
SELECT task_id, kind, name, state, event_id, payload, wake_at <= now() AS due
FROM stepwarden_waits
WHERE task_id = %(task_id)s AND seq = %(seq)s

-- name: insert_wait
-- A new wait at its position: it fires (or times out) at `until` (an epoch) or `delay`
-- seconds from now, by the database clock.
INSERT INTO stepwarden_waits (task_id, seq, position, kind, name, wake_at)
VALUES (%(task_id)s, %(seq)s, %(position)s, %(kind)s, %(name)s,
        coalesce(to_timestamp(%(until)s::float8),
                 now() + make_interval(secs => %(delay)s::float8)))
RETURNING task_id, kind, name, state, event_id, payload, wake_at <= now() AS due

-- name: end_wait
-- An open wait ends: done (a timer fired, an event taken) or timed_out.
UPDATE stepwarden_waits
SET state = %(state)s, event_id = %(event_id)s, payload = %(payload)s::json, finished_at = now()
WHERE task_id = %(task_id)s AND seq = %(seq)s AND state = 'open'

-- name: take_event
-- The oldest event of this name sent to the task that no wait has taken (once the wait has
-- timed out, only one sent before its timeout), taken by the wait at `seq`.
UPDATE stepwarden_inbox SET taken_by = %(seq)s
WHERE id = (SELECT i.id FROM stepwarden_inbox i
            WHERE i.task_id = %(task_id)s AND i.name = %(name)s AND i.taken_by IS NULL
              AND (NOT %(timed_out)s OR i.sent_at <= (
                  SELECT w.wake_at FROM stepwarden_waits w
                  WHERE w.task_id = %(task_id)s AND w.seq = %(seq)s))
            ORDER BY i.id LIMIT 1 FOR UPDATE)
RETURNING event_id, payload

-- name: park_task
-- The task waits: released by its scheduler (fenced by attempt and hold), no deadline
-- running, until the earliest wake_at of the waits it parks on (none when it waits only for
-- children), or an event, or a child's end.
UPDATE stepwarden_tasks t
SET process_state = 'waiting', locked_by = NULL, complete_by = NULL,
    wake_at = (SELECT min(w.wake_at) FROM stepwarden_waits w
               WHERE w.task_id = t.task_id AND w.seq = ANY(%(seqs)s::int[])),
    waiting_for = %(waiting_for)s, updated_at = now()
WHERE t.task_id = %(task_id)s AND t.process_state = 'processing'
  AND t.attempt = %(attempt)s AND t.locked_by = %(scheduler)s
RETURNING t.task_id, t.wake_at

-- name: park_waits
-- The waits a park is asked for, and whether each can end now: ended already (a child's end
-- is recorded in its wait), its time come (a timer fired, a wait timed out), or an event
-- kept for its name.
SELECT w.seq, w.position, w.kind, w.name, w.state, coalesce(w.wake_at <= now(), false) AS due,
       EXISTS (SELECT 1 FROM stepwarden_inbox i
               WHERE i.task_id = w.task_id AND i.name = w.name AND i.taken_by IS NULL
                 AND w.kind = 'event') AS kept
FROM stepwarden_waits w
WHERE w.task_id = %(task_id)s AND w.seq = ANY(%(seqs)s::int[])
ORDER BY w.seq

-- name: send_read_task
-- A send reads the task it is for, and locks it until commit (a wait waits for it).
SELECT process_state, waiting_for FROM stepwarden_tasks WHERE task_id = %(task_id)s FOR UPDATE

-- name: inbox_kept
-- The events a task keeps (taken by a wait or not), and whether this event_id is one of
-- them: read once the send holds the task's row, so that no concurrent send is counted out.
SELECT count(*) AS kept, coalesce(bool_or(event_id = %(event_id)s), false) AS sent_before
FROM stepwarden_inbox WHERE task_id = %(task_id)s

-- name: insert_inbox
-- An event for a task; an event_id already sent is not sent again.
INSERT INTO stepwarden_inbox (task_id, event_id, name, payload)
VALUES (%(task_id)s, %(event_id)s, %(name)s, %(payload)s::json)
ON CONFLICT (task_id, event_id) DO NOTHING
RETURNING id

-- name: wake_task
-- A waiting task with an open wait for this event is pending again, at once.
UPDATE stepwarden_tasks t
SET process_state = 'pending', eligible_at = now(), wake_at = NULL, waiting_for = NULL,
    updated_at = now()
WHERE t.task_id = %(task_id)s AND t.process_state = 'waiting'
  AND EXISTS (SELECT 1 FROM stepwarden_waits w
              WHERE w.task_id = t.task_id AND w.kind = 'event' AND w.name = %(name)s
                AND w.state = 'open')
RETURNING t.task_id

-- name: submit_found
-- The tasks of the given ids that a submit found taken: what a re-submit is compared by.
SELECT task_id, workflow, version, submitted_by, input_digest, tenant FROM stepwarden_tasks
WHERE task_id = ANY(%(task_ids)s::text[])

-- name: child_read
-- A task a child wait would create (or did): whose child it is, if anyone's, and its workflow.
SELECT task_id, parent_id, parent_position, workflow FROM stepwarden_tasks
WHERE task_id = %(task_id)s

-- name: wake_parents
-- Of the given tasks, those that ended and have a parent: each one's end is recorded in its
-- parent's open wait for it (done with its result, or failed with its state and error), and
-- the parent, waiting, is pending again at once, with a `woke` event (one, naming the first
-- child, when several of its children end together). The parent's row is
-- updated while it is processing too (and left as it is): a park of it under way, which
-- holds its row, is waited for, and the update then sees it waiting. The parents are locked
-- in the order of their ids, whatever the order of the children.
WITH c AS (
    SELECT task_id, parent_id, process_state, result, error FROM stepwarden_tasks
    WHERE task_id = ANY(%(task_ids)s::text[]) AND parent_id IS NOT NULL
      AND process_state IN ('processed', 'error', 'compensated', 'compensation_failed',
                            'cancelled')
), lp AS MATERIALIZED (
    SELECT task_id FROM stepwarden_tasks WHERE task_id IN (SELECT parent_id FROM c)
    ORDER BY task_id
    FOR UPDATE
), w AS (
    UPDATE stepwarden_waits w
    SET state = CASE WHEN c.process_state = 'processed' THEN 'done' ELSE 'failed' END,
        payload = CASE WHEN c.process_state = 'processed' THEN c.result
                       ELSE json_build_object('state', c.process_state, 'error', c.error)
                  END,
        finished_at = now()
    FROM c JOIN lp ON lp.task_id = c.parent_id
    WHERE w.task_id = c.parent_id AND w.kind = 'child' AND w.name = c.task_id
      AND w.state = 'open'
    RETURNING w.task_id AS parent_id, w.name AS child_id, c.process_state AS child_state
), p AS (
    UPDATE stepwarden_tasks t
    SET process_state = CASE WHEN t.process_state = 'waiting' THEN 'pending'
                             ELSE t.process_state END,
        eligible_at = CASE WHEN t.process_state = 'waiting' THEN now() ELSE t.eligible_at END,
        wake_at = CASE WHEN t.process_state = 'waiting' THEN NULL ELSE t.wake_at END,
        waiting_for = CASE WHEN t.process_state = 'waiting' THEN NULL ELSE t.waiting_for END,
        updated_at = CASE WHEN t.process_state = 'waiting' THEN now() ELSE t.updated_at END
    WHERE t.task_id IN (SELECT parent_id FROM w)
      AND t.process_state IN ('waiting', 'processing')
    RETURNING t.task_id, t.process_state = 'pending' AS woke
), e AS (
    INSERT INTO stepwarden_events (task_id, at, kind, detail)
    SELECT DISTINCT ON (w.parent_id) w.parent_id, now(), 'woke',
           json_build_object('waited_for', 'child:' || w.child_id, 'child', w.child_id,
                             'state', w.child_state)
    FROM w JOIN p ON p.task_id = w.parent_id AND p.woke
    ORDER BY w.parent_id, w.child_id
)
SELECT w.parent_id, w.child_id, w.child_state, coalesce(p.woke, false) AS woke
FROM w LEFT JOIN p ON p.task_id = w.parent_id
ORDER BY w.parent_id, w.child_id

-- name: descendants
-- The children of the given tasks, theirs, and so on, locked until commit deepest first: the
-- order in which a child's end locks its parent (`wake_parents`), so that a cascade and a
-- child's end never wait for each other.
WITH RECURSIVE d(task_id, depth) AS (
    SELECT task_id, 1 FROM stepwarden_tasks WHERE parent_id = ANY(%(task_ids)s::text[])
    UNION ALL
    SELECT t.task_id, d.depth + 1 FROM stepwarden_tasks t JOIN d ON t.parent_id = d.task_id
    WHERE d.depth < 1000
), x AS (
    SELECT task_id, max(depth) AS depth FROM d GROUP BY task_id
)
SELECT t.task_id, t.parent_id, t.process_state, t.created_at, x.depth
FROM stepwarden_tasks t JOIN x ON x.task_id = t.task_id
ORDER BY x.depth DESC, t.task_id
FOR UPDATE OF t

-- name: children_states
-- A task's children as a cascade reads them (rules.plan_cascade): their states, newest last.
SELECT task_id, parent_id, process_state, created_at FROM stepwarden_tasks
WHERE parent_id = %(task_id)s
ORDER BY created_at, task_id

-- name: children_of
-- A task's children, oldest first.
SELECT * FROM stepwarden_tasks WHERE parent_id = %(task_id)s
ORDER BY created_at, task_id
LIMIT %(limit)s

-- name: due_waiting
-- Waiting tasks whose wake_at has come (read through the index of waiting tasks by wake_at:
-- the cost is what is due, not what waits), locked until commit.
SELECT task_id, waiting_for FROM stepwarden_tasks
WHERE process_state = 'waiting' AND wake_at <= now()
ORDER BY wake_at
LIMIT %(limit)s
FOR UPDATE SKIP LOCKED

-- name: wake_due
-- Waiting tasks whose wake_at has come are pending again, with a `woke` event each.
WITH d AS (
    SELECT * FROM unnest(%(task_id)s::text[], %(waiting_for)s::text[], %(ord)s::int[])
        AS d(task_id, waiting_for, ord)
), u AS (
    UPDATE stepwarden_tasks t
    SET process_state = 'pending', eligible_at = now(), wake_at = NULL, waiting_for = NULL,
        updated_at = now()
    FROM d
    WHERE t.task_id = d.task_id AND t.process_state = 'waiting'
    RETURNING d.ord, t.task_id, d.waiting_for
), e AS (
    INSERT INTO stepwarden_events (task_id, at, kind, detail)
    SELECT task_id, now(), 'woke',
           json_build_object('waited_for', waiting_for, 'by', %(by)s::text,
                             'term', %(term)s::bigint)
    FROM u ORDER BY ord
)
SELECT ord, task_id, waiting_for FROM u

-- name: list_waits
-- The waits of a task, by position.
SELECT * FROM stepwarden_waits WHERE task_id = %(task_id)s ORDER BY seq

-- name: db_now
-- The database's clock, as an epoch.
SELECT extract(epoch FROM now())::float8 AS now

-- name: upsert_schedules
-- The application's schedules as its code declares them (the version of the workflow their
-- tasks run included); a schedule whose timing changed starts again from the next tick the
-- caller worked out, one that did not keeps its own (and whether an operator paused it).
INSERT INTO stepwarden_schedules AS s (name, workflow, cron, every, input, timezone, catch_up,
                                       complete_within, max_failures, on_failure, next_at,
                                       version, tenant)
SELECT d.name, d.workflow, d.cron, d.every, d.input::json, d.timezone, d.catch_up,
       d.complete_within, d.max_failures, d.on_failure, to_timestamp(d.next_at), d.version,
       d.tenant
FROM unnest(%(name)s::text[], %(workflow)s::text[], %(cron)s::text[], %(every)s::float8[],
            %(input)s::text[], %(timezone)s::text[], %(catch_up)s::text[],
            %(complete_within)s::float8[], %(max_failures)s::int[], %(on_failure)s::text[],
            %(next_at)s::float8[], %(version)s::int[], %(tenant)s::text[])
     AS d(name, workflow, cron, every, input, timezone, catch_up, complete_within,
          max_failures, on_failure, next_at, version, tenant)
ON CONFLICT (name) DO UPDATE
SET workflow = excluded.workflow, input = excluded.input, catch_up = excluded.catch_up,
    complete_within = excluded.complete_within, max_failures = excluded.max_failures,
    on_failure = excluded.on_failure, version = excluded.version, tenant = excluded.tenant,
    cron = excluded.cron, every = excluded.every, timezone = excluded.timezone,
    next_at = CASE WHEN s.cron IS DISTINCT FROM excluded.cron
                     OR s.every IS DISTINCT FROM excluded.every
                     OR s.timezone <> excluded.timezone
                   THEN excluded.next_at ELSE s.next_at END,
    updated_at = now()

-- name: due_schedules
-- Schedules not paused whose next tick has come, locked until commit, with the database's
-- clock.
SELECT name, workflow, version, cron, every, input, timezone, catch_up, complete_within,
       max_failures, on_failure, tenant, extract(epoch FROM next_at)::float8 AS next_at,
       extract(epoch FROM now())::float8 AS now
FROM stepwarden_schedules
WHERE NOT paused AND next_at <= now()
ORDER BY next_at
LIMIT %(limit)s
FOR UPDATE SKIP LOCKED

-- name: advance_schedules
-- Each schedule moves on to the next tick the caller worked out.
UPDATE stepwarden_schedules s
SET next_at = to_timestamp(d.next_at), last_tick = coalesce(to_timestamp(d.last_tick), s.last_tick),
    updated_at = now()
FROM unnest(%(name)s::text[], %(next_at)s::float8[], %(last_tick)s::float8[])
     AS d(name, next_at, last_tick)
WHERE s.name = d.name

-- name: set_aside_schedules
-- Schedules whose ticks cannot be worked out are paused, for an operator to see.
UPDATE stepwarden_schedules s SET paused = true, updated_at = now()
FROM unnest(%(name)s::text[]) AS d(name)
WHERE s.name = d.name

-- name: list_schedules
SELECT * FROM stepwarden_schedules ORDER BY name

-- name: lock_schedule
-- A schedule an operator pauses or resumes, locked until commit, with the database's clock.
SELECT name, workflow, version, cron, every, input, timezone, catch_up, complete_within,
       max_failures, on_failure, tenant, paused, extract(epoch FROM next_at)::float8 AS next_at,
       extract(epoch FROM now())::float8 AS now
FROM stepwarden_schedules
WHERE name = %(name)s
FOR UPDATE

-- name: pause_schedule
-- An operator pauses (or resumes) a schedule, from the next tick the caller worked out.
UPDATE stepwarden_schedules
SET paused = %(paused)s, next_at = to_timestamp(%(next_at)s), updated_at = now()
WHERE name = %(name)s

-- name: op_read_task
-- An operator action reads the task it acts on, and locks it until commit.
SELECT process_state, attempt FROM stepwarden_tasks WHERE task_id = %(task_id)s FOR UPDATE

-- name: op_move_task
-- An operator action moves the task from the state and attempt it read. Releasing a held task
-- fences out its scheduler; a compensation waits `hold` seconds for the steps an agent may
-- still be calling (rules.compensation_wait).
UPDATE stepwarden_tasks
SET process_state = %(to)s, locked_by = NULL, complete_by = NULL, wake_at = NULL,
    waiting_for = NULL,
    failure_count = CASE WHEN %(reset_failures)s THEN 0 ELSE failure_count END,
    compensation_failures = CASE WHEN %(reset_compensation_failures)s THEN 0
                                 ELSE compensation_failures END,
    eligible_at = now() + make_interval(secs => %(hold)s::float8),
    backoff_until = CASE WHEN %(wait_open)s THEN now() ELSE backoff_until END,
    finished_at = CASE WHEN %(final)s THEN now() END, updated_at = now()
WHERE task_id = %(task_id)s AND process_state = %(from)s AND attempt = %(attempt)s

-- name: close_open_steps
-- A task leaving the held states by an operator's hand leaves no request behind: its open
-- steps are closed (abandoned), so no agent claims them and a late answer changes nothing
-- (locked_by kept: the instance whose call may still run, until it says it stopped).
UPDATE stepwarden_steps
SET state = 'failed', error = %(error)s, abandoned = true, finished_at = now()
WHERE task_id = %(task_id)s AND state IN ('not_started', 'running')

-- name: op_reopen_steps
-- Resubmission: the failed steps (of the forward path, or the compensations) are open again,
-- already past complete_by, so that the scheduler taking the task up re-dispatches each under
-- a new attempt and the same idempotency key, and no agent claims them before.
UPDATE stepwarden_steps
SET state = 'not_started', complete_by = now(), locked_by = NULL, error = NULL,
    abandoned = false, finished_at = NULL, call_stopped_at = NULL
WHERE task_id = %(task_id)s AND state = 'failed'
  AND (compensates IS NOT NULL) = %(compensations)s
RETURNING seq

-- name: op_skip_step
-- Mark a step that is not completed as completed with the operator's result.
UPDATE stepwarden_steps
SET state = 'completed', result = %(result)s::json, error = NULL, abandoned = false,
    locked_by = NULL, finished_at = now()
WHERE task_id = %(task_id)s AND seq = %(seq)s AND state <> 'completed'
RETURNING seq

-- name: outbox_read
-- Outbox messages of a channel or a task, after an id, oldest first.
SELECT id, channel, task_id, kind, detail, at, attempts, delivered_to FROM stepwarden_outbox
WHERE (%(channel)s::text IS NULL OR channel = %(channel)s::text)
  AND (%(task_id)s::text IS NULL OR task_id = %(task_id)s::text)
  AND id > %(after)s
ORDER BY id
LIMIT %(limit)s

-- name: outbox_due
-- Alerts due for delivery, oldest first.
SELECT id, channel, task_id, kind, detail, at, attempts, delivered_to FROM stepwarden_outbox
WHERE next_at <= now() AND channel = 'alerts'
ORDER BY next_at, id
LIMIT %(limit)s

-- name: outbox_delivered
-- Record a delivery round of one alert: the sinks reached so far; done, or due again later.
UPDATE stepwarden_outbox
SET delivered_to = %(delivered_to)s::json, attempts = attempts + 1,
    next_at = CASE WHEN %(done)s THEN NULL
                   ELSE now() + make_interval(secs => %(retry_in)s::float8) END,
    delivered_at = CASE WHEN %(done)s THEN now() END
WHERE id = %(id)s AND next_at IS NOT NULL

-- name: relay_due
-- The relay's due status messages (for a broker), in id order: of the tasks whose first
-- undelivered message is due and at most :upto (the ids no transaction still running can
-- come before), their messages up to :upto. A task whose first message waits for its next
-- try holds back the others.
WITH heads AS (
    SELECT DISTINCT ON (task_id) task_id, id, next_at FROM stepwarden_outbox
    WHERE next_at IS NOT NULL AND channel <> 'alerts'
    ORDER BY task_id, id
), due AS (
    SELECT task_id FROM heads WHERE next_at <= now() AND id <= %(upto)s
    ORDER BY next_at, id
    LIMIT %(tasks)s
)
SELECT o.id, o.channel, o.task_id, o.kind, o.detail, o.at, o.attempts, o.delivered_to
FROM stepwarden_outbox o JOIN due ON o.task_id = due.task_id
WHERE o.next_at IS NOT NULL AND o.channel <> 'alerts' AND o.id <= %(upto)s
ORDER BY o.id
LIMIT %(limit)s

-- name: relay_fence
-- The newest undelivered status message for a broker (`upto`) and, when it is above :safe,
-- a fence: a new transaction id. Every message up to `upto` was given its id by a
-- transaction that began before the fence's, so once no transaction of this database
-- older than the fence runs (relay_passed), no message up to `upto` is still to come.
SELECT m.upto, CASE WHEN m.upto > %(safe)s THEN pg_current_xact_id()::text::bigint END AS fence
FROM (SELECT coalesce(max(id), 0) AS upto FROM stepwarden_outbox
      WHERE next_at IS NOT NULL AND channel <> 'alerts') AS m

-- name: relay_passed
-- Whether every transaction of this database that began before the fence has ended (xids
-- compared modulo 2^32, as PostgreSQL does).
SELECT NOT EXISTS (
    SELECT 1 FROM pg_stat_activity
    WHERE datname = current_database() AND backend_xid IS NOT NULL
      AND mod(mod(%(fence)s::bigint - backend_xid::text::bigint, 4294967296) + 4294967296,
              4294967296) < 2147483648
) AS passed

-- name: relay_delivered
-- Status messages the broker acknowledged: delivered; those of a task purged meanwhile (kept
-- past its retention until delivered: the purge deletes delivered ones only) deleted.
WITH d AS (
    SELECT o.id, o.task_id IS NOT NULL AND NOT EXISTS (
        SELECT 1 FROM stepwarden_tasks t WHERE t.task_id = o.task_id) AS purged
    FROM stepwarden_outbox o JOIN unnest(%(id)s::bigint[]) AS u(id) ON o.id = u.id
    WHERE o.next_at IS NOT NULL
), gone AS (
    DELETE FROM stepwarden_outbox o USING d WHERE o.id = d.id AND d.purged
)
UPDATE stepwarden_outbox o
SET next_at = NULL, attempts = o.attempts + 1, delivered_at = now(), error = NULL,
    delivered_to = '["relay"]'
FROM d
WHERE o.id = d.id AND NOT d.purged

-- name: relay_failed
-- A status message the broker did not take: tried again in :retry_in seconds.
UPDATE stepwarden_outbox
SET attempts = attempts + 1, error = %(error)s,
    next_at = now() + make_interval(secs => %(retry_in)s::float8)
WHERE id = %(id)s AND next_at IS NOT NULL

-- name: relay_refused
-- Status messages the relay never sends (their destination is not one it may send to): done,
-- never delivered, with their error; those of a task purged meanwhile deleted.
WITH d AS (
    SELECT o.id, u.error, o.task_id IS NOT NULL AND NOT EXISTS (
        SELECT 1 FROM stepwarden_tasks t WHERE t.task_id = o.task_id) AS purged
    FROM stepwarden_outbox o
    JOIN unnest(%(id)s::bigint[], %(error)s::text[]) AS u(id, error) ON o.id = u.id
    WHERE o.next_at IS NOT NULL
), gone AS (
    DELETE FROM stepwarden_outbox o USING d WHERE o.id = d.id AND d.purged
)
UPDATE stepwarden_outbox o
SET next_at = NULL, attempts = o.attempts + 1, error = d.error
FROM d
WHERE o.id = d.id AND NOT d.purged

-- name: relay_backlog
-- Per broker destination: status messages not yet delivered, the oldest one's age, those
-- tried and failed, the next try and the newest error.
SELECT channel, count(*) AS pending, extract(epoch FROM now() - min(at))::float8 AS lag,
       count(*) FILTER (WHERE attempts > 0) AS failing, max(attempts) AS attempts,
       extract(epoch FROM min(next_at) FILTER (WHERE attempts > 0) - now())::float8
           AS retry_in,
       (array_agg(error ORDER BY id DESC) FILTER (WHERE error IS NOT NULL))[1] AS error
FROM stepwarden_outbox
WHERE next_at IS NOT NULL AND channel <> 'alerts'
GROUP BY channel
ORDER BY channel

-- name: purge
-- Delete finished tasks (processed, compensated, cancelled) older than the retention (of one
-- tenant, or of all), oldest first, with their steps (ON DELETE CASCADE), events, delivered outbox rows and noted waits.
WITH p AS (
    SELECT task_id FROM stepwarden_tasks
    WHERE finished_at < now() - make_interval(secs => %(older_than)s::float8)
      AND process_state IN ('processed', 'compensated', 'cancelled')
      AND (%(tenant)s::text IS NULL OR tenant = %(tenant)s::text)
    ORDER BY finished_at
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
), e AS (
    DELETE FROM stepwarden_events WHERE task_id IN (SELECT task_id FROM p)
), o AS (
    DELETE FROM stepwarden_outbox WHERE task_id IN (SELECT task_id FROM p) AND next_at IS NULL
), a AS (
    DELETE FROM stepwarden_awaited WHERE task_id IN (SELECT task_id FROM p)
)
DELETE FROM stepwarden_tasks WHERE task_id IN (SELECT task_id FROM p)
RETURNING task_id

-- name: insert_events
-- Events, in the order given.
INSERT INTO stepwarden_events (task_id, at, kind, detail)
SELECT e.task_id, now(), e.kind, e.detail::json
FROM unnest(%(task_id)s::text[], %(kind)s::text[], %(detail)s::text[], %(ord)s::int[])
     AS e(task_id, kind, detail, ord)
ORDER BY e.ord

-- name: find_tasks
-- The dashboard (to the end of this file): read-only queries of the operator's dashboard
-- and its metrics.
-- Tasks newest first, optionally of one state, one workflow, one version and one tenant,
-- whose id contains a search (run unprepared).
SELECT * FROM stepwarden_tasks
WHERE (%(state)s::text IS NULL OR process_state = %(state)s::text)
  AND (%(workflow)s::text IS NULL OR workflow = %(workflow)s::text)
  AND (%(version)s::int IS NULL OR version = %(version)s::int)
  AND (%(tenant)s::text IS NULL OR tenant = %(tenant)s::text)
  AND (%(search)s::text IS NULL OR strpos(task_id, %(search)s::text) > 0)
ORDER BY created_at DESC, task_id DESC
LIMIT %(limit)s

-- name: find_tagged_tasks
-- find_tasks (and its tenant) of the tasks that have every tag of the JSON object tags, read through the
-- tags' index on (key, value) from one of them (key, value) (run unprepared).
SELECT t.* FROM stepwarden_task_tags AS g
JOIN stepwarden_tasks AS t ON t.task_id = g.task_id
WHERE g.key = %(key)s::text AND g.value = %(value)s::text
  AND (%(state)s::text IS NULL OR t.process_state = %(state)s::text)
  AND (%(workflow)s::text IS NULL OR t.workflow = %(workflow)s::text)
  AND (%(version)s::int IS NULL OR t.version = %(version)s::int)
  AND (%(tenant)s::text IS NULL OR t.tenant = %(tenant)s::text)
  AND (%(search)s::text IS NULL OR strpos(t.task_id, %(search)s::text) > 0)
  AND NOT EXISTS (SELECT 1 FROM json_each_text(%(tags)s::json) AS w
                  WHERE NOT EXISTS (SELECT 1 FROM stepwarden_task_tags AS m
                                    WHERE m.task_id = t.task_id AND m.key = w.key
                                      AND m.value = w.value))
ORDER BY t.created_at DESC, t.task_id DESC
LIMIT %(limit)s

-- name: workflow_names
SELECT DISTINCT workflow FROM stepwarden_tasks ORDER BY workflow

-- name: newest_outbox
SELECT * FROM stepwarden_outbox WHERE channel = %(channel)s ORDER BY id DESC LIMIT %(limit)s

-- name: oldest_pending
SELECT extract(epoch FROM now() - min(created_at))::float8 AS age
FROM stepwarden_tasks WHERE process_state = 'pending'

-- name: read_lease
SELECT name, holder, term, expires_at,
       extract(epoch FROM expires_at - now())::float8 AS remaining,
       extract(epoch FROM now() - renewed_at)::float8 AS since_renewed
FROM stepwarden_leases WHERE name = %(name)s

-- name: activity
-- Tasks processed and step failures per bucket of seconds over a window, by bucket number;
-- with the database clock.
WITH w AS (SELECT now() AS now, now() - make_interval(secs => %(window)s) AS since)
SELECT w.now, a.b, a.processed, a.failed FROM w LEFT JOIN (
    SELECT b, sum(processed)::int AS processed, sum(failed)::int AS failed FROM (
        SELECT floor(extract(epoch FROM t.finished_at) / %(bucket)s)::bigint AS b,
               1 AS processed, 0 AS failed
        FROM stepwarden_tasks t, w
        WHERE t.finished_at >= w.since AND t.process_state = 'processed'
        UNION ALL
        SELECT floor(extract(epoch FROM e.at) / %(bucket)s)::bigint, 0, 1
        FROM stepwarden_events e, w
        WHERE e.kind IN ('step_failed', 'expired') AND e.at >= w.since
    ) x GROUP BY b
) a ON true
ORDER BY a.b

-- name: step_stats
-- Per agent and operation: steps started, completed, failed and reassigned; the completed
-- steps' durations (claimed to finished) counted under each bound of base.DURATION_BUCKETS.
SELECT agent, operation,
       count(claimed_at)::int AS started,
       count(*) FILTER (WHERE state = 'completed')::int AS completed,
       count(*) FILTER (WHERE state = 'failed')::int AS failed,
       sum(reassignments)::int AS reassignments,
       count(*) FILTER (WHERE attempt > 1)::int AS retried,
       coalesce(sum(d), 0)::float8 AS duration_sum,
       sum(CASE WHEN d <= 0.005 THEN 1 ELSE 0 END)::int AS b0,
       sum(CASE WHEN d <= 0.01 THEN 1 ELSE 0 END)::int AS b1,
       sum(CASE WHEN d <= 0.025 THEN 1 ELSE 0 END)::int AS b2,
       sum(CASE WHEN d <= 0.05 THEN 1 ELSE 0 END)::int AS b3,
       sum(CASE WHEN d <= 0.1 THEN 1 ELSE 0 END)::int AS b4,
       sum(CASE WHEN d <= 0.25 THEN 1 ELSE 0 END)::int AS b5,
       sum(CASE WHEN d <= 0.5 THEN 1 ELSE 0 END)::int AS b6,
       sum(CASE WHEN d <= 1.0 THEN 1 ELSE 0 END)::int AS b7,
       sum(CASE WHEN d <= 2.5 THEN 1 ELSE 0 END)::int AS b8,
       sum(CASE WHEN d <= 5.0 THEN 1 ELSE 0 END)::int AS b9,
       sum(CASE WHEN d <= 10.0 THEN 1 ELSE 0 END)::int AS b10,
       sum(CASE WHEN d <= 30.0 THEN 1 ELSE 0 END)::int AS b11,
       sum(CASE WHEN d <= 60.0 THEN 1 ELSE 0 END)::int AS b12
FROM (
    SELECT agent, operation, state, claimed_at, reassignments, attempt,
           CASE WHEN state = 'completed' AND claimed_at IS NOT NULL
                THEN greatest(extract(epoch FROM finished_at - claimed_at)::float8, 0) END AS d
    FROM stepwarden_steps
) s
GROUP BY agent, operation ORDER BY agent, operation

-- name: count_events
SELECT count(*)::bigint AS n FROM stepwarden_events WHERE kind = %(kind)s

-- name: scheduler_beat
-- Scheduler instances register or refresh their row (the workflows and versions they run);
-- each is gone at expires_at.
INSERT INTO stepwarden_schedulers AS s (instance, workflows, versions, capacity, held,
                                        started_at, heartbeat_at, expires_at)
SELECT b.instance, b.workflows::json, b.versions::json, b.capacity, b.held, now(), now(),
       now() + make_interval(secs => %(ttl)s::float8)
FROM unnest(%(instance)s::text[], %(workflows)s::text[], %(versions)s::text[],
            %(capacity)s::int[], %(held)s::int[])
     AS b(instance, workflows, versions, capacity, held)
ON CONFLICT (instance) DO UPDATE
SET workflows = excluded.workflows, versions = excluded.versions, capacity = excluded.capacity,
    held = excluded.held, heartbeat_at = excluded.heartbeat_at, expires_at = excluded.expires_at

-- name: scheduler_leave
UPDATE stepwarden_schedulers SET expires_at = LEAST(expires_at, now())
WHERE instance = %(instance)s

-- name: list_schedulers
SELECT *, expires_at > now() AS alive FROM stepwarden_schedulers ORDER BY started_at, instance

-- name: held_by
-- The tasks one scheduler instance holds, and whether their complete_by is still to come.
SELECT task_id, attempt, locked_by, process_state, complete_by > now() AS in_time
FROM stepwarden_tasks
WHERE locked_by = %(scheduler)s AND process_state IN ('processing', 'compensating')

-- name: gone_scheduler_tasks
-- Tasks held by scheduler instances whose registry row has expired.
SELECT t.task_id, t.attempt, t.locked_by, t.process_state
FROM stepwarden_schedulers s JOIN stepwarden_tasks t ON t.locked_by = s.instance
WHERE s.expires_at <= now() AND t.process_state IN ('processing', 'compensating')
LIMIT %(limit)s
FOR UPDATE OF t SKIP LOCKED

-- name: release_tasks
-- Held tasks given back, unheld, into the state the caller worked out (rules.release_state),
-- each fenced by the attempt and the hold read; eligible at once, failure_count unchanged;
-- a `released` event each (who held it, who released it, why).
WITH d AS (
    SELECT * FROM unnest(%(task_id)s::text[], %(attempt)s::int[], %(scheduler)s::text[],
                         %(held_as)s::text[], %(state)s::text[], %(ord)s::int[])
        AS d(task_id, attempt, scheduler, held_as, state, ord)
), u AS (
    UPDATE stepwarden_tasks t
    SET process_state = d.state, locked_by = NULL, complete_by = NULL, eligible_at = now(),
        updated_at = now()
    FROM d
    WHERE t.task_id = d.task_id AND t.attempt = d.attempt AND t.locked_by = d.scheduler
      AND t.process_state = d.held_as
    RETURNING d.ord, t.task_id, t.attempt, d.scheduler, t.process_state
), e AS (
    INSERT INTO stepwarden_events (task_id, at, kind, detail)
    SELECT task_id, now(), 'released',
           json_build_object('attempt', attempt, 'from', scheduler, 'by', %(by)s::text,
                             'term', %(term)s::bigint, 'reason', %(reason)s::text)
    FROM u ORDER BY ord
)
SELECT ord, task_id, attempt, scheduler, process_state FROM u

-- name: version_backlog
-- The tasks waiting for a scheduler (pending; compensating, unheld) by workflow and version,
-- of the given workflows (all, when null), with the submit time of the oldest: read through
-- the claim indexes.
SELECT workflow, version,
       count(*) FILTER (WHERE process_state = 'pending')::int AS pending,
       count(*) FILTER (WHERE process_state = 'compensating')::int AS compensating,
       min(created_at) AS oldest
FROM stepwarden_tasks
WHERE (process_state = 'pending' OR (process_state = 'compensating' AND locked_by IS NULL))
  AND (%(workflows)s::text[] IS NULL OR workflow = ANY(%(workflows)s::text[]))
GROUP BY workflow, version
ORDER BY workflow, version

-- name: forget_schedulers
-- Scheduler instances gone for a while leave the registry.
DELETE FROM stepwarden_schedulers
WHERE expires_at < now() - make_interval(secs => %(forget_after)s::float8)

-- name: shard_name
-- This database's name in the shard map (placement.py); no row when it is not a shard.
SELECT name FROM stepwarden_shard_name

-- name: shard_map
-- Every generation of the shard map, oldest first.
SELECT generation, shards::text AS shards, slots::text AS slots
FROM stepwarden_shard_map ORDER BY generation

-- name: lock_shard_map
-- Hold the shard map until the commit, against submits too (ACCESS EXCLUSIVE): what writes
-- a generation waits for the submits under the older one to end, and the next ones wait.
LOCK TABLE stepwarden_shard_map IN ACCESS EXCLUSIVE MODE

-- name: name_shard
-- Name this database in the shard map, once.
INSERT INTO stepwarden_shard_name (name) VALUES (%(name)s) ON CONFLICT (only_one) DO NOTHING

-- name: put_shard_generation
-- Store one generation of the shard map (the same on every shard); one already stored stays.
INSERT INTO stepwarden_shard_map (generation, shards, slots)
VALUES (%(generation)s, %(shards)s::jsonb, %(slots)s::jsonb)
ON CONFLICT (generation) DO NOTHING

-- name: any_task
-- Whether the database holds any task (a database added as a shard must hold none).
SELECT EXISTS (SELECT 1 FROM stepwarden_tasks) AS present

-- name: inputs_without_digest
-- Tasks stored before their input's digest was recorded (migration 0019), in task_id order
-- after `after`, a batch at a time (`Store.migrate`).
SELECT task_id, input FROM stepwarden_tasks
WHERE task_id > %(after)s AND input_digest IS NULL
ORDER BY task_id
LIMIT %(limit)s

-- name: set_input_digests
-- The digests of tasks stored before migration 0019, where none was recorded since.
UPDATE stepwarden_tasks AS t SET input_digest = d.input_digest
FROM unnest(%(task_id)s::text[], %(input_digest)s::text[]) AS d(task_id, input_digest)
WHERE t.task_id = d.task_id AND t.input_digest IS NULL

-- name: sealing_keys
-- The keys that sealed secrets in this store, with their checks (`sealing.Keyring.verify`).
SELECT key_id, check_value FROM stepwarden_keys ORDER BY added_at, key_id

-- name: add_sealing_key
-- A key that seals in this store from now on, with its check; one of its id already known
-- is kept (the check read back says whether the keyring's key is that one).
INSERT INTO stepwarden_keys (key_id, check_value) VALUES (%(key_id)s, %(check_value)s)
ON CONFLICT (key_id) DO NOTHING

-- name: drop_sealing_keys
-- Keys that no longer seal anything here (`stepwarden reseal` moved every value off them).
DELETE FROM stepwarden_keys WHERE key_id = ANY(%(key_ids)s::text[])

-- name: reseal_tasks
-- Tasks after `after` (task_id order) whose input or result may hold a secret, or whose
-- input's digest is not keyed: what `stepwarden reseal` looks at, a batch at a time.
SELECT task_id, input::text AS input, result::text AS result, input_digest
FROM stepwarden_tasks
WHERE task_id > %(after)s
  AND (input::text LIKE '%%"$secret"%%' OR input::text LIKE '%%"$sealed"%%'
       OR result::text LIKE '%%"$secret"%%' OR result::text LIKE '%%"$sealed"%%'
       OR input_digest IS NULL OR input_digest NOT LIKE 'k.%%')
ORDER BY task_id
LIMIT %(limit)s

-- name: reseal_task
-- A task's payloads sealed anew, each where it is still the text read (a write since wins,
-- and the next pass looks again).
UPDATE stepwarden_tasks AS t SET
    input = CASE WHEN t.input::text = d.old_input THEN d.input::json ELSE t.input END,
    result = CASE WHEN t.result::text IS NOT DISTINCT FROM d.old_result THEN d.result::json
                  ELSE t.result END,
    input_digest = CASE WHEN t.input::text = d.old_input THEN d.input_digest
                        ELSE t.input_digest END
FROM unnest(%(task_id)s::text[], %(old_input)s::text[], %(input)s::text[],
            %(old_result)s::text[], %(result)s::text[], %(input_digest)s::text[])
     AS d(task_id, old_input, input, old_result, result, input_digest)
WHERE t.task_id = d.task_id

-- name: reseal_steps
-- Steps after (`after`, `after_seq`) whose payloads may hold a secret (`stepwarden reseal`).
SELECT task_id, seq, input::text AS input, result::text AS result,
       compensation_input::text AS compensation_input, heartbeat::text AS heartbeat
FROM stepwarden_steps
WHERE (task_id, seq) > (%(after)s, %(after_seq)s)
  AND (input::text LIKE '%%"$secret"%%' OR input::text LIKE '%%"$sealed"%%'
       OR result::text LIKE '%%"$secret"%%' OR result::text LIKE '%%"$sealed"%%'
       OR compensation_input::text LIKE '%%"$secret"%%'
       OR compensation_input::text LIKE '%%"$sealed"%%'
       OR heartbeat::text LIKE '%%"$secret"%%' OR heartbeat::text LIKE '%%"$sealed"%%')
ORDER BY task_id, seq
LIMIT %(limit)s

-- name: reseal_step
-- A step's payloads sealed anew, each where it is still the text read.
UPDATE stepwarden_steps AS s SET
    input = CASE WHEN s.input::text = d.old_input THEN d.input::json ELSE s.input END,
    result = CASE WHEN s.result::text IS NOT DISTINCT FROM d.old_result THEN d.result::json
                  ELSE s.result END,
    compensation_input = CASE WHEN s.compensation_input::text IS NOT DISTINCT FROM d.old_comp
                              THEN d.comp::json ELSE s.compensation_input END,
    heartbeat = CASE WHEN s.heartbeat::text IS NOT DISTINCT FROM d.old_beat THEN d.beat::json
                     ELSE s.heartbeat END
FROM unnest(%(task_id)s::text[], %(seq)s::int[], %(old_input)s::text[], %(input)s::text[],
            %(old_result)s::text[], %(result)s::text[], %(old_comp)s::text[], %(comp)s::text[],
            %(old_beat)s::text[], %(beat)s::text[])
     AS d(task_id, seq, old_input, input, old_result, result, old_comp, comp, old_beat, beat)
WHERE s.task_id = d.task_id AND s.seq = d.seq

-- name: reseal_inbox_rows
-- Events sent (the inbox) after `after_id` whose payload may hold a secret (`stepwarden
-- reseal`).
SELECT id, task_id, event_id, payload::text AS doc FROM stepwarden_inbox
WHERE id > %(after_id)s
  AND (payload::text LIKE '%%"$secret"%%' OR payload::text LIKE '%%"$sealed"%%')
ORDER BY id
LIMIT %(limit)s

-- name: reseal_wait_rows
-- Waits after (`after`, `after_seq`) whose payload (an event's, a child's result) may hold
-- a secret (`stepwarden reseal`).
SELECT task_id, seq, kind, name, event_id, payload::text AS doc FROM stepwarden_waits
WHERE (task_id, seq) > (%(after)s, %(after_seq)s)
  AND (payload::text LIKE '%%"$secret"%%' OR payload::text LIKE '%%"$sealed"%%')
ORDER BY task_id, seq
LIMIT %(limit)s

-- name: reseal_schedule_rows
-- Schedules after `after` whose input may hold a secret (`stepwarden reseal`).
SELECT name, input::text AS doc FROM stepwarden_schedules
WHERE name > %(after)s
  AND (input::text LIKE '%%"$secret"%%' OR input::text LIKE '%%"$sealed"%%')
ORDER BY name
LIMIT %(limit)s

-- name: reseal_outbox_rows
-- Status messages after `after_id` whose detail may hold a secret (`stepwarden reseal`).
SELECT id, task_id, detail::text AS doc FROM stepwarden_outbox
WHERE id > %(after_id)s
  AND (detail::text LIKE '%%"$secret"%%' OR detail::text LIKE '%%"$sealed"%%')
ORDER BY id
LIMIT %(limit)s

-- name: reseal_inbox
-- Events' payloads sealed anew, where still the text read.
UPDATE stepwarden_inbox AS i SET payload = d.doc::json
FROM unnest(%(id)s::bigint[], %(old)s::text[], %(doc)s::text[]) AS d(id, old, doc)
WHERE i.id = d.id AND i.payload::text = d.old

-- name: reseal_waits
-- Waits' payloads sealed anew, where still the text read.
UPDATE stepwarden_waits AS w SET payload = d.doc::json
FROM unnest(%(task_id)s::text[], %(seq)s::int[], %(old)s::text[], %(doc)s::text[])
     AS d(task_id, seq, old, doc)
WHERE w.task_id = d.task_id AND w.seq = d.seq AND w.payload::text = d.old

-- name: reseal_schedules
-- Schedules' inputs sealed anew, where still the text read.
UPDATE stepwarden_schedules AS s SET input = d.doc::json
FROM unnest(%(name)s::text[], %(old)s::text[], %(doc)s::text[]) AS d(name, old, doc)
WHERE s.name = d.name AND s.input::text = d.old

-- name: reseal_outbox
-- Status messages' details sealed anew, where still the text read.
UPDATE stepwarden_outbox AS o SET detail = d.doc::json
FROM unnest(%(id)s::bigint[], %(old)s::text[], %(doc)s::text[]) AS d(id, old, doc)
WHERE o.id = d.id AND o.detail::text = d.old

-- name: why_task
-- A task, the store's clock, and how many tasks of its (workflow, version) are ahead of it in
-- the claim order (pending, or compensating and unheld, eligible now, ranked before it); for
-- a pending task, how many of its own tenant's are ahead of it, its tenant's weight, and the
-- weights of the tenants with pending tasks of its (workflow, version) eligible now, its own
-- among them, added up (`rules.fair_shares`): the facts of `rules.task_gate`, read through
-- the claim indexes.
SELECT t.*, now() AS now,
       (SELECT count(*) FROM stepwarden_tasks AS x
        WHERE x.process_state = 'pending' AND x.workflow = t.workflow
          AND x.version = t.version AND x.tenant = t.tenant AND x.eligible_at <= now()
          AND x.ranked_at < t.ranked_at) AS tenant_ahead,
       coalesce((SELECT n.weight FROM stepwarden_tenants AS n WHERE n.tenant = t.tenant), 1)
         AS tenant_weight,
       (SELECT sum(coalesce(n.weight, 1))
        FROM (SELECT DISTINCT x.tenant FROM stepwarden_tasks AS x
              WHERE x.process_state = 'pending' AND x.workflow = t.workflow
                AND x.version = t.version AND x.eligible_at <= now()
              UNION SELECT t.tenant) AS d
        LEFT JOIN stepwarden_tenants AS n ON n.tenant = d.tenant) AS weights,
       (SELECT count(*) FROM stepwarden_tasks AS x
        WHERE x.process_state = 'pending' AND x.workflow = t.workflow
          AND x.version = t.version AND x.eligible_at <= now() AND x.ranked_at < t.ranked_at)
       + (SELECT count(*) FROM stepwarden_tasks AS x
          WHERE x.process_state = 'compensating' AND x.locked_by IS NULL
            AND x.workflow = t.workflow AND x.version = t.version AND x.eligible_at <= now()
            AND x.ranked_at < t.ranked_at) AS ahead
FROM stepwarden_tasks AS t WHERE t.task_id = %(task_id)s

-- name: why_waits
-- A task's open waits (timers, events, children), each child's state beside its wait.
SELECT w.position, w.kind, w.name, w.wake_at, c.process_state AS child_state
FROM stepwarden_waits AS w
LEFT JOIN stepwarden_tasks AS c ON w.kind = 'child' AND c.task_id = w.name
WHERE w.task_id = %(task_id)s AND w.state = 'open' AND w.kind IN ('timer', 'event', 'child')
ORDER BY w.seq

-- name: why_marks
-- The newest operator action that paused a task and its newest alert (kind, at, detail).
(SELECT kind, at, detail::text AS detail FROM stepwarden_events
 WHERE task_id = %(task_id)s AND kind = 'operator' AND detail->>'action' = 'pause'
 ORDER BY id DESC LIMIT 1)
UNION ALL
(SELECT kind, at, detail::text AS detail FROM stepwarden_events
 WHERE task_id = %(task_id)s AND kind = 'alert'
 ORDER BY id DESC LIMIT 1)

-- name: why_steps
-- A task's open steps, each with the store's clock and how many requests of its agent are
-- queued (in time) ahead of it.
SELECT s.*, now() AS now,
       (SELECT count(*) FROM stepwarden_steps AS q
        WHERE q.state = 'not_started' AND q.agent = s.agent AND q.ranked_at < s.ranked_at
          AND q.complete_by > now()) AS ahead
FROM stepwarden_steps AS s
WHERE s.task_id = %(task_id)s AND s.state IN ('not_started', 'running')
ORDER BY s.seq

-- name: why_limit
-- What takes up an operation's limits for a limit key ('' for none): its running steps (the
-- first of their tasks, oldest claim first), and its starts within the rate's period `per`
-- with the oldest of them.
SELECT (SELECT count(*) FROM stepwarden_steps
        WHERE state = 'running' AND agent = %(agent)s AND operation = %(operation)s
          AND coalesce(limit_key, '') = %(limit_key)s) AS running,
       (SELECT coalesce(json_agg(task_id), '[]')::text FROM (
            SELECT task_id FROM stepwarden_steps
            WHERE state = 'running' AND agent = %(agent)s AND operation = %(operation)s
              AND coalesce(limit_key, '') = %(limit_key)s
            ORDER BY claimed_at, task_id LIMIT %(tasks)s) AS r) AS running_tasks,
       (SELECT count(*) FROM stepwarden_starts
        WHERE agent = %(agent)s AND operation = %(operation)s AND limit_key = %(limit_key)s
          AND at > now() - make_interval(secs => %(per)s::float8)) AS started,
       (SELECT min(at) FROM stepwarden_starts
        WHERE agent = %(agent)s AND operation = %(operation)s AND limit_key = %(limit_key)s
          AND at > now() - make_interval(secs => %(per)s::float8)) AS oldest_start

-- name: stale_tasks
-- The unfinished tasks of a workflow (not those waiting for an operator) that have not moved
-- for `after` seconds and raised no task_stuck alert since they last moved, the longest
-- unmoved first: what the supervisor looks at for the task_stuck alert.
SELECT t.task_id FROM stepwarden_tasks AS t
WHERE t.workflow = %(workflow)s
  AND t.process_state IN ('pending', 'processing', 'waiting', 'paused', 'compensating')
  AND t.updated_at <= now() - make_interval(secs => %(after)s::float8)
  AND NOT EXISTS (
      SELECT 1 FROM stepwarden_events AS e
      WHERE e.task_id = t.task_id AND e.kind = 'alert' AND e.at >= t.updated_at
        AND e.detail->>'reason' = 'task_stuck')
ORDER BY t.updated_at
LIMIT %(limit)s

-- name: stuck_alerted
-- Whether the task raised a task_stuck alert for this reason that holds it.
SELECT count(*) AS n FROM stepwarden_events
WHERE task_id = %(task_id)s AND kind = 'alert'
  AND detail->>'reason' = 'task_stuck' AND detail->>'wait_reason' = %(wait_reason)s
