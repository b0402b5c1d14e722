-- The named queries of the SQLite driver (store/sqlite.py). `:now` is the transaction's
-- reading of the clock; a list parameter is JSON text (read with json_each). A batch query
-- runs once for each row of the batch, with `:ord` its position. A query of several
-- statements runs the first, then the others once for each row the first returned, with
-- that row's columns as parameters too.

-- name: insert_tasks
-- Record a task in the state the caller decided (rules.start_state: pending, or waiting for
-- a delayed start at start_at, an epoch, or start_after seconds from now), with the version of its workflow it runs and its rank for claims
-- (ranked_at: now less its priority's head start); an existing task_id is left untouched. A
-- child task names its parent and its place in the parent's workflow.
INSERT INTO stepwarden_tasks (task_id, workflow, input, priority, complete_within, max_failures,
                              on_failure, reply_to, eligible_at, created_at, updated_at,
                              process_state, wake_at, waiting_for, version, parent_id,
                              parent_position, ranked_at, trace_context, submitted_by,
                              input_digest, tenant, tags)
VALUES (:task_id, :workflow, :input, :priority, :complete_within, :max_failures, :on_failure,
        :reply_to, :now, :now, :now,
        :process_state,
        CASE WHEN :waiting_for IS NOT NULL THEN coalesce(:start_at, :now + :start_after) END,
        :waiting_for, :version,
        :parent_id, :parent_position, :now - :head_start, :trace_context, :submitted_by,
        :input_digest, :tenant, :tags)
ON CONFLICT (task_id) DO NOTHING
RETURNING task_id

-- name: any_pending
-- A cheap read before taking the write lock: is any task of the given (workflow, version)
-- pairs (the JSON arrays workflows and versions, side by side) eligible?
WITH w AS (
    SELECT n.value AS workflow, v.value AS version
    FROM json_each(:workflows) AS n JOIN json_each(:versions) AS v ON v.key = n.key
)
SELECT 1 FROM w
WHERE EXISTS (SELECT 1 FROM stepwarden_tasks AS t INDEXED BY stepwarden_tasks_pending
              WHERE t.process_state = 'pending' AND t.workflow = w.workflow
                AND t.version = w.version AND t.eligible_at <= :now)
   OR EXISTS (SELECT 1 FROM stepwarden_tasks AS t INDEXED BY stepwarden_tasks_compensate
              WHERE t.process_state = 'compensating' AND t.locked_by IS NULL
                AND t.workflow = w.workflow AND t.version = w.version
                AND t.eligible_at <= :now)
LIMIT 1

-- name: claim_tasks
-- Claim eligible tasks of the given (workflow, version) pairs (the JSON arrays workflows and
-- versions, side by side) by rank (ranked_at: priority with aging, rules.head_start), a new
-- attempt each: pending -> processing, and compensating tasks no scheduler holds. Each pair
-- is read through the claim indexes by (workflow, version, ranked_at), up to the limit: the
-- tasks of other versions are never read.
WITH w AS (
    SELECT DISTINCT n.value AS workflow, v.value AS version
    FROM json_each(:workflows) AS n JOIN json_each(:versions) AS v ON v.key = n.key
), candidates AS (
    SELECT t.task_id, t.ranked_at
    FROM w JOIN stepwarden_tasks AS t ON t.rowid IN (
        SELECT x.rowid FROM stepwarden_tasks AS x INDEXED BY stepwarden_tasks_pending
        WHERE x.process_state = 'pending' AND x.workflow = w.workflow
          AND x.version = w.version AND x.eligible_at <= :now
        ORDER BY x.ranked_at
        LIMIT :limit)
    UNION ALL
    SELECT t.task_id, t.ranked_at
    FROM w JOIN stepwarden_tasks AS t ON t.rowid IN (
        SELECT x.rowid FROM stepwarden_tasks AS x INDEXED BY stepwarden_tasks_compensate
        WHERE x.process_state = 'compensating' AND x.locked_by IS NULL
          AND x.workflow = w.workflow AND x.version = w.version AND x.eligible_at <= :now
        ORDER BY x.ranked_at
        LIMIT :limit)
)
UPDATE stepwarden_tasks
SET locked_by = :scheduler, attempt = attempt + 1,
    process_state = CASE process_state WHEN 'pending' THEN 'processing' ELSE process_state END,
    complete_by = :now + complete_within, updated_at = :now
WHERE task_id IN (SELECT task_id FROM candidates ORDER BY ranked_at LIMIT :limit)
  AND (process_state = 'pending' OR (process_state = 'compensating' AND locked_by IS NULL))
RETURNING *, complete_by - :now AS remaining

-- name: fair_tenants
-- The tenants with work waiting for the given (workflow, version) pairs (the JSON arrays
-- workflows and versions, side by side; migration 0023), of least pass first: the first
-- `scan` rows of each pair by (pass, tenant), read through the index on (workflow, version,
-- pass, tenant). With each, whether the tenant has pending tasks of the pair (`live`: one
-- probe of the index of migration 0021), its weight and pass (none without a row: weight
-- 1), and the fair clock. `rules.least_pass` takes from them the tenants a claim serves, or
-- asks for a larger `scan`.
WITH w AS (
    SELECT DISTINCT n.value AS workflow, v.value AS version
    FROM json_each(:workflows) AS n JOIN json_each(:versions) AS v ON v.key = n.key
), r AS (
    SELECT k.tenant, k.workflow, k.version, k.pass AS key
    FROM w JOIN stepwarden_tenant_work AS k ON (k.tenant, k.workflow, k.version) IN (
        SELECT x.tenant, x.workflow, x.version
        FROM stepwarden_tenant_work AS x INDEXED BY stepwarden_tenant_work_pass
        WHERE x.workflow = w.workflow AND x.version = w.version
        ORDER BY x.pass, x.tenant
        LIMIT :scan)
)
SELECT r.tenant, r.workflow, r.version, r.key,
       EXISTS (SELECT 1 FROM stepwarden_tasks AS t INDEXED BY stepwarden_tasks_fair
               WHERE t.process_state = 'pending' AND t.workflow = r.workflow
                 AND t.version = r.version AND t.tenant = r.tenant) AS live,
       coalesce(n.weight, 1.0) AS weight, n.pass,
       (SELECT vtime FROM stepwarden_fair_clock WHERE id = 1) AS clock
FROM r LEFT JOIN stepwarden_tenants AS n ON n.tenant = r.tenant

-- name: claim_fair
-- claim_tasks with each tenant's share (rules.fair_shares: the JSON arrays tenants and
-- counts, side by side): of each tenant, up to its count of its eligible pending tasks by
-- rank, through the index of migration 0021; the compensating tasks no scheduler holds
-- first, by rank, as claim_tasks takes them; up to the limit in all.
WITH a AS (
    SELECT n.value AS tenant, c.value AS n
    FROM json_each(:tenants) AS n JOIN json_each(:counts) AS c ON c.key = n.key
), w AS (
    SELECT DISTINCT n.value AS workflow, v.value AS version
    FROM json_each(:workflows) AS n JOIN json_each(:versions) AS v ON v.key = n.key
), candidates AS (
    SELECT t.task_id, 0 AS k, t.ranked_at
    FROM w JOIN stepwarden_tasks AS t ON t.rowid IN (
        SELECT x.rowid FROM stepwarden_tasks AS x INDEXED BY stepwarden_tasks_compensate
        WHERE x.process_state = 'compensating' AND x.locked_by IS NULL
          AND x.workflow = w.workflow AND x.version = w.version AND x.eligible_at <= :now
        ORDER BY x.ranked_at
        LIMIT :limit)
    UNION ALL
    SELECT task_id, 1, ranked_at FROM (
        SELECT t.task_id, t.ranked_at, a.n,
               row_number() OVER (PARTITION BY a.tenant ORDER BY t.ranked_at) AS r
        FROM a JOIN w JOIN stepwarden_tasks AS t ON t.rowid IN (
            SELECT x.rowid FROM stepwarden_tasks AS x INDEXED BY stepwarden_tasks_fair
            WHERE x.process_state = 'pending' AND x.workflow = w.workflow
              AND x.version = w.version AND x.tenant = a.tenant AND x.eligible_at <= :now
            ORDER BY x.ranked_at
            LIMIT :limit)
    ) AS q
    WHERE q.r <= q.n
)
UPDATE stepwarden_tasks
SET locked_by = :scheduler, attempt = attempt + 1,
    process_state = CASE process_state WHEN 'pending' THEN 'processing' ELSE process_state END,
    complete_by = :now + complete_within, updated_at = :now
WHERE task_id IN (SELECT task_id FROM candidates ORDER BY k, ranked_at LIMIT :limit)
  AND (process_state = 'pending' OR (process_state = 'compensating' AND locked_by IS NULL))
RETURNING *, complete_by - :now AS remaining

-- name: advance_tenants
-- A tenant served by a claim: its pass moves on by its claims over its weight (delta), from
-- the fair clock at least (floor); a tenant without a row gets one, of weight 1.
INSERT INTO stepwarden_tenants (tenant, pass) VALUES (:tenant, :floor + :delta)
ON CONFLICT (tenant) DO UPDATE SET pass = max(pass, :floor) + :delta

-- name: advance_fair_clock
-- The fair clock moves on (never back) to the least pass of the tenants a claim found.
UPDATE stepwarden_fair_clock SET vtime = max(vtime, :clock) WHERE id = 1

-- name: lift_tenant_work
-- The rows of the given tenants with work waiting (the JSON array tenants; migration 0023),
-- of every pair: each pass moves up (never down) to the tenant's as the claims order them,
-- max(fair clock, its pass); after a claim moved the passes of the tenants it served and
-- the clock.
UPDATE stepwarden_tenant_work AS k
SET pass = max((SELECT vtime FROM stepwarden_fair_clock WHERE id = 1),
               coalesce((SELECT n.pass FROM stepwarden_tenants AS n WHERE n.tenant = k.tenant),
                        0.0))
WHERE k.tenant IN (SELECT value FROM json_each(:tenants))
  AND k.pass < max((SELECT vtime FROM stepwarden_fair_clock WHERE id = 1),
                   coalesce((SELECT n.pass FROM stepwarden_tenants AS n
                             WHERE n.tenant = k.tenant), 0.0))

-- name: hold_idle_tenant_work
-- Of the given rows of tenants with work waiting (the JSON arrays tenant, workflow and
-- version, side by side), those a claim found no pending task behind, for
-- drop_idle_tenant_work next (one writer at a time: every one of them).
SELECT k.tenant, k.workflow, k.version
FROM json_each(:tenant) AS a
JOIN json_each(:workflow) AS b ON b.key = a.key
JOIN json_each(:version) AS v ON v.key = a.key
JOIN stepwarden_tenant_work AS k
  ON k.tenant = a.value AND k.workflow = b.value AND k.version = v.value

-- name: drop_idle_tenant_work
-- The rows held by hold_idle_tenant_work, each deleted if its tenant has no pending task of
-- its pair.
DELETE FROM stepwarden_tenant_work
WHERE (tenant, workflow, version) IN (
        SELECT a.value, b.value, v.value
        FROM json_each(:tenant) AS a
        JOIN json_each(:workflow) AS b ON b.key = a.key
        JOIN json_each(:version) AS v ON v.key = a.key)
  AND NOT EXISTS (SELECT 1 FROM stepwarden_tasks AS t INDEXED BY stepwarden_tasks_fair
                  WHERE t.process_state = 'pending'
                    AND t.workflow = stepwarden_tenant_work.workflow
                    AND t.version = stepwarden_tenant_work.version
                    AND t.tenant = stepwarden_tenant_work.tenant)

-- name: set_tenant_weight
-- A tenant's weight, kept with its pass (a new tenant's pass: the fair clock's).
INSERT INTO stepwarden_tenants (tenant, weight, pass)
VALUES (:tenant, :weight, (SELECT vtime FROM stepwarden_fair_clock WHERE id = 1))
ON CONFLICT (tenant) DO UPDATE SET weight = excluded.weight

-- name: tenant_weights
-- Every tenant's row: its weight and its pass; and the fair clock.
SELECT n.tenant, n.weight, n.pass, (SELECT vtime FROM stepwarden_fair_clock WHERE id = 1) AS clock
FROM stepwarden_tenants AS n ORDER BY n.tenant

-- name: waits_of_tasks
-- The recorded waits of the given tasks (their positions, kinds and names).
SELECT task_id, seq, position, kind, name FROM stepwarden_waits
WHERE task_id IN (SELECT value FROM json_each(:task_ids))

-- name: steps_of_tasks
SELECT * FROM stepwarden_steps
WHERE task_id IN (SELECT value FROM json_each(:task_ids))
ORDER BY task_id, seq

-- name: dispatch_new
-- Record a step and queue its request (not_started), or hand it at once to the agent instance
-- named in claimed_by (running), only while the task is held under this attempt; ranked for
-- claims at now less its priority's head start, with its task's tenant (the fair share of
-- the agents' queue). The step's complete_by never passes the task's.
INSERT INTO stepwarden_steps (task_id, seq, name, agent, operation, state, attempt, task_attempt,
                              priority, complete_by, idempotency_key, input, created_at,
                              dispatched_at, compensation, compensation_input, compensates,
                              complete_within, pickup_within, give_up_by, limit_key, position,
                              locked_by, claimed_at, ranked_at, trace_context, tenant)
SELECT :task_id, :seq, :name, :agent, :operation,
       CASE WHEN :claimed_by IS NULL THEN 'not_started' ELSE 'running' END, 1, :task_attempt,
       :priority,
       stepwarden_step_deadline(:now, :complete_within, t.complete_by, :now + :total_within,
                                NULL),
       :idempotency_key, :input, :now, :now, :compensation, :compensation_input, :compensates,
       :complete_within, :pickup_within, :now + :total_within, :limit_key, :position,
       :claimed_by, CASE WHEN :claimed_by IS NOT NULL THEN :now END, :now - :head_start,
       :trace_context, t.tenant
FROM stepwarden_tasks t
WHERE t.task_id = :task_id AND t.attempt = :task_attempt AND t.locked_by = :scheduler
  AND t.process_state IN ('processing', 'compensating')
ON CONFLICT (task_id, seq) DO NOTHING
RETURNING :ord AS ord, attempt, complete_by - :now AS remaining

-- name: savepoint_dependents
-- A scheduler's group commit: the writes that depend on the outcomes written before this.
SAVEPOINT stepwarden_dependents

-- name: rollback_dependents
-- An outcome was refused: undo what depends on the outcomes, to write it again without it.
ROLLBACK TO stepwarden_dependents

-- name: dispatch_again
-- Re-dispatch an expired step: a new attempt, the same idempotency key.
UPDATE stepwarden_steps
SET state = 'not_started', attempt = attempt + 1, task_attempt = :task_attempt,
    locked_by = NULL, claimed_at = NULL, call_stopped_at = NULL, dispatched_at = :now,
    ranked_at = :now - (dispatched_at - ranked_at),
    complete_within = :complete_within, trace_context = :trace_context,
    complete_by = stepwarden_step_deadline(
        :now, :complete_within,
        (SELECT complete_by FROM stepwarden_tasks WHERE task_id = :task_id), give_up_by, NULL)
WHERE task_id = :task_id AND seq = :seq AND attempt = :expected_attempt
  AND state IN ('not_started', 'running')
  AND EXISTS (SELECT 1 FROM stepwarden_tasks t
              WHERE t.task_id = :task_id AND t.attempt = :task_attempt AND t.locked_by = :scheduler
                AND t.process_state IN ('processing', 'compensating'))
RETURNING :ord AS ord, attempt, complete_by - :now AS remaining

-- name: dispatch_adopt
-- Take over a step an earlier attempt of the task dispatched, while it is still in time.
-- A step still queued takes the trace context of this dispatch, when it has one.
UPDATE stepwarden_steps
SET task_attempt = :task_attempt,
    trace_context = CASE WHEN state = 'not_started' THEN coalesce(:trace_context, trace_context)
                         ELSE trace_context END
WHERE task_id = :task_id AND seq = :seq AND attempt = :expected_attempt
  AND state IN ('not_started', 'running') AND complete_by > :now
  AND EXISTS (SELECT 1 FROM stepwarden_tasks t
              WHERE t.task_id = :task_id AND t.attempt = :task_attempt AND t.locked_by = :scheduler
                AND t.process_state IN ('processing', 'compensating'))
RETURNING :ord AS ord, attempt, complete_by - :now AS remaining

-- name: finished_steps
-- The step, when it is completed or failed.
SELECT * FROM stepwarden_steps
WHERE task_id = :task_id AND seq = :seq AND state IN ('completed', 'failed')

-- name: compensation_facts
-- The facts rules.compensable_tasks decides on: each given task's on_failure, with its steps
-- that have a compensation (one row with no step for a task that has none).
SELECT t.task_id, s.state, s.abandoned, s.compensation, s.compensates, t.on_failure
FROM stepwarden_tasks t
LEFT JOIN stepwarden_steps s ON s.task_id = t.task_id AND s.compensation IS NOT NULL
WHERE t.task_id IN (SELECT value FROM json_each(:task_ids))
ORDER BY t.task_id, s.seq

-- name: finish_tasks
-- End the hold of a task, only under the attempt and scheduler that hold it in :held_as, into
-- the state the caller planned (rules.plan_finish), eligible after :hold seconds: a
-- compensation waits for the steps an agent may still be calling
-- (rules.compensation_wait). Then the planned alert, and the open steps closed (abandoned;
-- locked_by kept: the instance whose call may still run).
UPDATE stepwarden_tasks
SET process_state = :state, result = :result, error = :error, locked_by = NULL,
    complete_by = NULL, updated_at = :now,
    compensation_failures = CASE WHEN :compensation_starts THEN 0
                                 ELSE compensation_failures END,
    eligible_at = :now + :hold, backoff_until = :now,
    finished_at = CASE WHEN :finished THEN :now END
WHERE task_id = :task_id AND attempt = :attempt AND locked_by = :scheduler
  AND process_state = :held_as
RETURNING :ord AS ord, task_id, process_state, parent_id,
          awaited OR EXISTS (SELECT 1 FROM stepwarden_awaited a
                             WHERE a.task_id = stepwarden_tasks.task_id) AS awaited;
INSERT INTO stepwarden_events (task_id, at, kind, detail)
SELECT :task_id, :now, 'alert',
       json_object('reason', :alert, 'error', :error, 'then', :process_state)
WHERE :alert IS NOT NULL;
UPDATE stepwarden_steps
SET state = 'failed', error = :abandoned_error, abandoned = 1, finished_at = :now
WHERE task_id = :task_id AND state IN ('not_started', 'running');

-- name: any_request
SELECT 1 FROM stepwarden_steps
WHERE state = 'not_started' AND agent = :agent AND complete_by > :now
  AND operation IN (SELECT value FROM json_each(:operations))
  AND (pickup_within IS NULL OR dispatched_at + pickup_within > :now)
LIMIT 1

-- name: claim_requests
-- Claim queued requests in time by rank (ranked_at: priority with aging, rules.head_start):
-- not_started -> running, locked_by the agent instance.
UPDATE stepwarden_steps
SET state = 'running', locked_by = :instance, claimed_at = :now
WHERE (task_id, seq) IN (
    SELECT task_id, seq FROM stepwarden_steps
    WHERE state = 'not_started' AND agent = :agent AND complete_by > :now
      AND operation IN (SELECT value FROM json_each(:operations))
      AND (pickup_within IS NULL OR dispatched_at + pickup_within > :now)
    ORDER BY ranked_at
    LIMIT :limit)
  AND state = 'not_started'
RETURNING task_id, seq, attempt, agent, operation, input, idempotency_key, complete_by,
          ranked_at, compensates, trace_context, complete_by - :now AS remaining,
          :now - dispatched_at AS queued,
          (SELECT t.workflow FROM stepwarden_tasks t
           WHERE t.task_id = stepwarden_steps.task_id) AS workflow

-- name: fair_request_tenants
-- The tenants with requests queued at an agent for the given operations (the JSON array
-- operations), with their weights (stepwarden_tenants; 1 without a row), their passes at this
-- agent (none without a row) and the agent's fair clock: the index of migration 0024 walked
-- from one tenant to the next, for each operation (one probe a tenant, never a read of their
-- requests).
WITH RECURSIVE o AS (
    SELECT DISTINCT value AS operation FROM json_each(:operations)
), walk(operation, tenant) AS (
    SELECT o.operation,
           (SELECT x.tenant FROM stepwarden_steps AS x INDEXED BY stepwarden_steps_fair
            WHERE x.state = 'not_started' AND x.agent = :agent AND x.operation = o.operation
            ORDER BY x.tenant LIMIT 1)
    FROM o
    UNION ALL
    SELECT walk.operation,
           (SELECT x.tenant FROM stepwarden_steps AS x INDEXED BY stepwarden_steps_fair
            WHERE x.state = 'not_started' AND x.agent = :agent
              AND x.operation = walk.operation AND x.tenant > walk.tenant
            ORDER BY x.tenant LIMIT 1)
    FROM walk WHERE walk.tenant IS NOT NULL
)
SELECT DISTINCT walk.tenant, coalesce(n.weight, 1.0) AS weight, p.pass,
       (SELECT vtime FROM stepwarden_agent_clock WHERE agent = :agent) AS clock
FROM walk
LEFT JOIN stepwarden_tenants AS n ON n.tenant = walk.tenant
LEFT JOIN stepwarden_agent_tenants AS p ON p.agent = :agent AND p.tenant = walk.tenant
WHERE walk.tenant IS NOT NULL

-- name: claim_fair_requests
-- claim_requests with each tenant's share (rules.fair_shares: the JSON arrays tenants and
-- counts, side by side): of each tenant, up to its count of its requests queued in time, by
-- rank, through the index of migration 0024; up to the limit in all.
WITH a AS (
    SELECT n.value AS tenant, c.value AS n
    FROM json_each(:tenants) AS n JOIN json_each(:counts) AS c ON c.key = n.key
), o AS (
    SELECT DISTINCT value AS operation FROM json_each(:operations)
), pick AS (
    SELECT task_id, seq, ranked_at FROM (
        SELECT s.task_id, s.seq, s.ranked_at, a.n,
               row_number() OVER (PARTITION BY a.tenant ORDER BY s.ranked_at) AS r
        FROM a JOIN o JOIN stepwarden_steps AS s ON s.rowid IN (
            SELECT x.rowid FROM stepwarden_steps AS x INDEXED BY stepwarden_steps_fair
            WHERE x.state = 'not_started' AND x.agent = :agent AND x.operation = o.operation
              AND x.tenant = a.tenant AND x.complete_by > :now
              AND (x.pickup_within IS NULL OR x.dispatched_at + x.pickup_within > :now)
            ORDER BY x.ranked_at
            LIMIT :limit)
    ) AS q
    WHERE q.r <= q.n
)
UPDATE stepwarden_steps
SET state = 'running', locked_by = :instance, claimed_at = :now
WHERE (task_id, seq) IN (SELECT task_id, seq FROM pick ORDER BY ranked_at LIMIT :limit)
  AND state = 'not_started'
RETURNING task_id, seq, attempt, agent, operation, input, idempotency_key, complete_by,
          ranked_at, compensates, trace_context, tenant, complete_by - :now AS remaining,
          :now - dispatched_at AS queued,
          (SELECT t.workflow FROM stepwarden_tasks t
           WHERE t.task_id = stepwarden_steps.task_id) AS workflow

-- name: advance_agent_tenants
-- A tenant served by a claim of an agent's requests: its pass at the agent moves on by its
-- claims over its weight (delta), from the agent's fair clock at least (floor).
INSERT INTO stepwarden_agent_tenants (agent, tenant, pass) VALUES (:agent, :tenant, :floor + :delta)
ON CONFLICT (agent, tenant) DO UPDATE SET pass = max(pass, :floor) + :delta

-- name: advance_agent_clock
-- An agent's fair clock moves on (never back) to the least pass of the tenants a claim found.
INSERT INTO stepwarden_agent_clock (agent, vtime) VALUES (:agent, :clock)
ON CONFLICT (agent) DO UPDATE SET vtime = max(vtime, excluded.vtime)

-- name: limits_lock
-- Claims within limits of one agent's operations go one at a time: BEGIN IMMEDIATE already
-- makes every write transaction exclusive.
SELECT 1 AS locked

-- name: limited_candidates
-- Queued requests of an agent in claim order, for a claim within the operations' limits.
SELECT task_id, seq, operation, limit_key, tenant, ranked_at FROM stepwarden_steps
WHERE state = 'not_started' AND agent = :agent AND complete_by > :now
  AND operation IN (SELECT value FROM json_each(:operations))
  AND (pickup_within IS NULL OR dispatched_at + pickup_within > :now)
ORDER BY ranked_at
LIMIT :scan

-- name: limited_fair_candidates
-- Queued requests of an agent of each of the given tenants (the JSON array tenants), up to
-- scan of each in claim order, through the index of migration 0024: a fair claim within the
-- operations' limits picks each tenant's share from them.
WITH a AS (
    SELECT DISTINCT value AS tenant FROM json_each(:tenants)
), o AS (
    SELECT DISTINCT value AS operation FROM json_each(:operations)
)
SELECT task_id, seq, operation, limit_key, tenant, ranked_at FROM (
    SELECT s.task_id, s.seq, s.operation, s.limit_key, s.tenant, s.ranked_at,
           row_number() OVER (PARTITION BY a.tenant ORDER BY s.ranked_at) AS r
    FROM a JOIN o JOIN stepwarden_steps AS s ON s.rowid IN (
        SELECT x.rowid FROM stepwarden_steps AS x INDEXED BY stepwarden_steps_fair
        WHERE x.state = 'not_started' AND x.agent = :agent AND x.operation = o.operation
          AND x.tenant = a.tenant AND x.complete_by > :now
          AND (x.pickup_within IS NULL OR x.dispatched_at + x.pickup_within > :now)
        ORDER BY x.ranked_at
        LIMIT :scan)
) AS q
WHERE q.r <= :scan

-- name: running_counts
-- Steps running now, by operation and limit key ('' for none).
SELECT operation, coalesce(limit_key, '') AS limit_key, count(*) AS n FROM stepwarden_steps
WHERE state = 'running' AND agent = :agent
  AND operation IN (SELECT value FROM json_each(:operations))
GROUP BY operation, coalesce(limit_key, '')

-- name: forget_starts
-- Starts of a rate-limited operation older than its period are forgotten.
DELETE FROM stepwarden_starts WHERE agent = :agent AND operation = :operation
  AND at <= :now - :per

-- name: start_counts
-- Starts of a rate-limited operation within its period, by limit key.
SELECT operation, limit_key, count(*) AS n FROM stepwarden_starts
WHERE agent = :agent AND operation = :operation AND at > :now - :per
GROUP BY operation, limit_key

-- name: claim_chosen
-- Claim a request chosen within limits, and note the start of a rate-limited one.
UPDATE stepwarden_steps
SET state = 'running', locked_by = :instance, claimed_at = :now
WHERE task_id = :task_id AND seq = :seq AND state = 'not_started'
RETURNING task_id, seq, attempt, agent, operation, input, idempotency_key, complete_by,
          ranked_at, compensates, limit_key, trace_context, tenant,
          complete_by - :now AS remaining, :now - dispatched_at AS queued,
          (SELECT t.workflow FROM stepwarden_tasks t
           WHERE t.task_id = stepwarden_steps.task_id) AS workflow;
INSERT INTO stepwarden_starts (agent, operation, limit_key, at)
SELECT :agent, :operation, coalesce(:limit_key, ''), :now
WHERE :operation IN (SELECT value FROM json_each(:rated));

-- name: hand_back
-- A claimed request back in the queue, untried here, fenced like an outcome.
UPDATE stepwarden_steps
SET state = 'not_started', locked_by = NULL, claimed_at = NULL,
    reassignments = reassignments + 1
WHERE task_id = :task_id AND seq = :seq AND attempt = :attempt AND state = 'running'
  AND locked_by = :instance AND complete_by > :now
RETURNING :ord AS ord, task_id, seq, agent;
INSERT INTO stepwarden_events (task_id, at, kind, detail)
VALUES (:task_id, :now, 'handed_back',
        json_object('seq', :seq, 'attempt', :attempt, 'from', :instance, 'reason', :reason));

-- name: note_run
-- Record the trace context of a task's run (its span) while the run holds the task, for the
-- next run to link to (stepwarden.tracing).
UPDATE stepwarden_tasks SET run_trace = :run_trace
WHERE task_id = :task_id AND attempt = :attempt AND locked_by = :scheduler
RETURNING task_id

-- name: held_tags
-- The tags of a task while its scheduler holds it under this attempt (no row: not held so).
SELECT tags FROM stepwarden_tasks
WHERE task_id = :task_id AND attempt = :attempt AND locked_by = :scheduler

-- name: set_tags
-- A held task's tags, as its workflow tagged it (Context.tag); stepwarden_task_tags
-- follows by trigger (migration 0022).
UPDATE stepwarden_tasks SET tags = :tags
WHERE task_id = :task_id AND attempt = :attempt AND locked_by = :scheduler
RETURNING task_id

-- name: heartbeat_step
-- Extend a running step's complete_by by its complete_within from now: never shorter than
-- it is, never past its task's complete_by nor its total timeout.
UPDATE stepwarden_steps
SET heartbeat = :detail, heartbeat_at = :now,
    complete_by = stepwarden_step_deadline(
        :now, coalesce(complete_within, complete_by - dispatched_at),
        coalesce((SELECT t.complete_by FROM stepwarden_tasks t WHERE t.task_id = :task_id),
                 complete_by),
        give_up_by, complete_by)
WHERE task_id = :task_id AND seq = :seq AND attempt = :attempt AND state = 'running'
  AND locked_by = :instance AND complete_by > :now
RETURNING complete_by - :now AS remaining

-- name: call_facts
-- The facts rules.call_lost and rules.plan_call_stopped decide on, for each step of the
-- batch: its agent, state, attempt, holder, abandonment and stop, the seconds left before
-- its complete_by, and its task's state, holder and attempt.
SELECT s.task_id, s.seq, s.agent, s.state, s.attempt, s.locked_by, s.abandoned,
       s.call_stopped_at IS NOT NULL AS call_stopped, s.complete_by - :now AS remaining,
       t.process_state, t.locked_by AS task_locked_by, t.attempt AS task_attempt
FROM stepwarden_steps s JOIN stepwarden_tasks t ON t.task_id = s.task_id
WHERE s.task_id = :task_id AND s.seq = :seq

-- name: held_steps
-- The steps of an agent that an instance of it holds: running, locked by it, before their
-- complete_by; as claim_requests returns them, with the facts rules.call_lost decides on.
SELECT s.task_id, s.seq, s.attempt, s.agent, s.operation, s.input, s.idempotency_key,
       s.complete_by, s.ranked_at, s.compensates, s.trace_context,
       s.complete_by - :now AS remaining,
       s.state, s.locked_by, s.abandoned, s.call_stopped_at IS NOT NULL AS call_stopped,
       t.process_state
FROM stepwarden_steps s JOIN stepwarden_tasks t ON t.task_id = s.task_id
WHERE s.state = 'running' AND s.agent = :agent AND s.locked_by = :instance AND s.complete_by > :now

-- name: lock_tasks
-- Tasks a flow decides on, locked until commit (BEGIN IMMEDIATE already holds every write).
SELECT task_id FROM stepwarden_tasks WHERE task_id IN (SELECT value FROM json_each(:task_ids))

-- name: stop_calls
-- An agent's word that its call of a step ended, as the caller planned
-- (rules.plan_call_stopped), fenced by the attempt, the instance and the state it read:
-- `stopped` notes when (call_stopped_at); `requeue` and `hand_back` put a step still running
-- back to not_started (requeue: past its complete_by, for the task's next scheduler to
-- dispatch again). Then its `call_stopped` event.
UPDATE stepwarden_steps
SET call_stopped_at = CASE WHEN :plan = 'stopped' THEN :now END,
    state = CASE WHEN :plan = 'stopped' THEN state ELSE 'not_started' END,
    locked_by = CASE WHEN :plan = 'stopped' THEN locked_by END,
    claimed_at = CASE WHEN :plan = 'stopped' THEN claimed_at END,
    complete_by = CASE WHEN :plan = 'requeue' THEN MIN(complete_by, :now) ELSE complete_by END
WHERE task_id = :task_id AND seq = :seq AND attempt = :attempt AND locked_by = :instance
  AND state = :state AND call_stopped_at IS NULL
RETURNING :ord AS ord, task_id, seq;
INSERT INTO stepwarden_events (task_id, at, kind, detail)
VALUES (:task_id, :now, 'call_stopped',
        json_object('seq', :seq, 'attempt', :attempt, 'from', :instance, 'reason', :reason,
                    'then', :plan));

-- name: hold_facts
-- The facts rules.compensation_wait decides on: the steps of the given tasks an agent may
-- still be calling (open, or abandoned), the seconds left before their complete_by, and
-- whether their call was reported stopped.
SELECT task_id, seq, complete_by - :now AS remaining,
       call_stopped_at IS NOT NULL AS call_stopped
FROM stepwarden_steps
WHERE task_id IN (SELECT value FROM json_each(:task_ids))
  AND (state IN ('not_started', 'running') OR abandoned)
ORDER BY task_id, seq

-- name: compensate_sooner
-- A compensating task no scheduler holds (under the attempt read) is eligible after :hold
-- seconds (what its steps still hold it up for, rules.compensation_wait), never sooner than
-- the end of its backoff (backoff_until; a task without one keeps its eligible_at), never
-- later than it was.
UPDATE stepwarden_tasks
SET eligible_at = MIN(eligible_at, MAX(:now + :hold, backoff_until))
WHERE task_id = :task_id AND attempt = :attempt AND process_state = 'compensating'
  AND locked_by IS NULL AND backoff_until IS NOT NULL
RETURNING :ord AS ord, task_id, eligible_at <= :now AS due

-- name: agent_beat
INSERT INTO stepwarden_agents (instance, agent, operations, capacity, inflight, breaker,
                               breaker_detail, started_at, heartbeat_at, expires_at)
VALUES (:instance, :agent, :operations, :capacity, :inflight, :breaker, :breaker_detail, :now,
        :now, :now + :ttl)
ON CONFLICT (instance, agent) DO UPDATE
SET operations = excluded.operations, capacity = excluded.capacity,
    inflight = excluded.inflight, breaker = excluded.breaker,
    breaker_detail = excluded.breaker_detail, heartbeat_at = excluded.heartbeat_at,
    expires_at = excluded.expires_at

-- name: agent_leave
UPDATE stepwarden_agents SET expires_at = MIN(expires_at, :now)
WHERE instance = :instance AND agent IN (SELECT value FROM json_each(:agents))

-- name: agent_room
-- The capacity of the alive agent instances, and what takes it up: the held tasks (each about
-- to queue a step, or waiting for one) or the steps queued or running in time, the more; of
-- these, only what alive instances hold: not a task of a scheduler instance found gone, nor
-- a step running under an agent instance gone (the supervisor gives both back).
SELECT (SELECT sum(capacity) FROM stepwarden_agents WHERE expires_at > :now) AS capacity,
       MAX((SELECT count(*) FROM stepwarden_tasks t INDEXED BY stepwarden_tasks_expiry
            WHERE t.complete_by IS NOT NULL
              AND NOT EXISTS (SELECT 1 FROM stepwarden_schedulers g
                              WHERE g.instance = t.locked_by AND g.expires_at <= :now)),
           (SELECT count(*) FROM stepwarden_steps s INDEXED BY stepwarden_steps_expiry
            WHERE s.state IN ('not_started', 'running') AND s.complete_by > :now
              AND (s.state = 'not_started'
                   OR EXISTS (SELECT 1 FROM stepwarden_agents a
                              WHERE a.instance = s.locked_by AND a.agent = s.agent
                                AND a.expires_at > :now)))) AS open

-- name: list_agents
SELECT *, expires_at > :now AS alive FROM stepwarden_agents ORDER BY agent, started_at, instance

-- name: read_step
SELECT *, complete_by - :now AS remaining FROM stepwarden_steps
WHERE task_id = :task_id AND seq = :seq

-- name: read_held_step
-- A step, the seconds until its complete_by, and whether its task is still held under this
-- attempt by this scheduler: a drive's look at a step it waits for, once its complete_by
-- has passed (the supervisor then either fails the step or takes the task from the drive).
SELECT s.*, s.complete_by - :now AS remaining,
       EXISTS (SELECT 1 FROM stepwarden_tasks t
               WHERE t.task_id = s.task_id AND t.attempt = :attempt
                 AND t.locked_by = :scheduler
                 AND t.process_state IN ('processing', 'compensating')) AS held
FROM stepwarden_steps s
WHERE s.task_id = :task_id AND s.seq = :seq

-- name: gone_holders
-- Running steps in time whose agent instance is gone, whatever the state of their task
-- (held, released, waiting, paused...), with that task's state, holder and attempt, and
-- whether its holder is a scheduler instance found gone.
SELECT s.task_id, s.seq, s.attempt, s.agent, s.locked_by, t.attempt AS task_attempt,
       t.process_state AS task_state, t.locked_by AS task_locked_by,
       EXISTS (SELECT 1 FROM stepwarden_schedulers g
               WHERE g.instance = t.locked_by AND g.expires_at <= :now) AS task_holder_gone
FROM stepwarden_steps s INDEXED BY stepwarden_steps_holder
JOIN stepwarden_tasks t ON t.task_id = s.task_id
WHERE s.state = 'running' AND s.complete_by > :now
  AND NOT EXISTS (SELECT 1 FROM stepwarden_agents a
                  WHERE a.instance = s.locked_by AND a.agent = s.agent AND a.expires_at > :now)
LIMIT :limit

-- name: pickup_expired
-- Steps no agent claimed within their pick-up timeout.
SELECT task_id, seq, attempt, agent, locked_by, state, pickup_within FROM stepwarden_steps
WHERE state = 'not_started' AND pickup_within IS NOT NULL
  AND dispatched_at + pickup_within < :now
LIMIT :limit

-- name: total_expired
-- Open steps past their total timeout (`total`: seconds from the first dispatch).
SELECT task_id, seq, attempt, agent, locked_by, state, give_up_by - created_at AS total
FROM stepwarden_steps
WHERE state IN ('not_started', 'running') AND give_up_by IS NOT NULL AND give_up_by < :now
LIMIT :limit

-- name: reassign_steps
-- The running step of a gone agent instance back to not_started under a new attempt, as the
-- caller planned (rules.plan_gone_step), fenced by the attempt, state and holder read, and
-- named after the task's attempt read (its holder's, or the last one's, whose next claim
-- adopts it): `in_time`, with a full complete_by of its own (never past the complete_by of
-- a task kept held), for another instance to claim; otherwise past its complete_by (its
-- task paused), for the scheduler resuming the task to dispatch again. A task held under
-- the attempt and state read by a scheduler instance found gone is released into
-- `released_as` (when given), failure_count unchanged, for a scheduler to take up again at
-- once (it adopts the step).
UPDATE stepwarden_steps
SET state = 'not_started', attempt = attempt + 1, reassignments = reassignments + 1,
    task_attempt = :task_attempt, locked_by = NULL, claimed_at = NULL, dispatched_at = :now,
    ranked_at = :now - (dispatched_at - ranked_at),
    complete_by = CASE WHEN :in_time THEN stepwarden_step_deadline(
        :now, coalesce(complete_within, complete_by - dispatched_at),
        (SELECT t.complete_by FROM stepwarden_tasks t
         WHERE t.task_id = :task_id AND :released_as IS NULL), give_up_by, NULL)
        ELSE MIN(complete_by, :now) END
WHERE task_id = :task_id AND seq = :seq AND attempt = :attempt AND state = 'running'
  AND locked_by = :instance
RETURNING :ord AS ord, task_id, seq, attempt;
UPDATE stepwarden_tasks
SET locked_by = NULL, complete_by = NULL, eligible_at = :now, updated_at = :now,
    process_state = :released_as
WHERE :released_as IS NOT NULL AND task_id = :task_id AND attempt = :task_attempt
  AND locked_by IS NOT NULL AND process_state = :held_as;
INSERT INTO stepwarden_events (task_id, at, kind, detail)
VALUES (:task_id, :now, 'reassigned',
        json_object('seq', :seq, 'attempt', :attempt, 'from', :instance, 'by', :holder,
                    'term', :term));

-- name: fail_steps
-- A step past its pick-up or total timeout fails with the error (and abandonment) the
-- caller worked out (rules.pickup_failure, rules.total_failure), fenced by the attempt and
-- state read.
UPDATE stepwarden_steps
SET state = 'failed', error = :error, abandoned = :abandoned, locked_by = NULL,
    finished_at = :now
WHERE task_id = :task_id AND seq = :seq AND attempt = :attempt AND state = :state
RETURNING :ord AS ord, task_id, seq, attempt;
INSERT INTO stepwarden_events (task_id, at, kind, detail)
VALUES (:task_id, :now, 'step_failed',
        json_object('seq', :seq, 'attempt', :attempt, 'error', :error, 'by', :holder,
                    'term', :term));

-- name: forget_agents
-- Agent instances gone for a while leave the registry.
DELETE FROM stepwarden_agents WHERE expires_at < :now - :forget_after

-- name: complete_steps
-- running -> completed | failed, only for the current attempt, its agent, before complete_by.
UPDATE stepwarden_steps
SET state = :state, result = :result, error = :error, tries = :tries, finished_at = :now
WHERE task_id = :task_id AND seq = :seq AND attempt = :attempt AND state = 'running'
  AND locked_by = :instance AND complete_by > :now
RETURNING :ord AS ord, task_id, seq;
INSERT INTO stepwarden_events (task_id, at, kind, detail)
SELECT :task_id, :now, 'step_failed', json_object('seq', :seq, 'attempt', :attempt, 'error', :error)
WHERE :state = 'failed';

-- name: lock_lease_row
-- A lease as it stands, whether it is live (BEGIN IMMEDIATE holds it until commit), and the
-- seconds until it lapses.
SELECT holder, term, expires_at > :now AS live, expires_at - :now AS lapses_in
FROM stepwarden_leases WHERE name = :name

-- name: look_lease
-- A lease as it stands (a standby's look, written beside its process's registry beats),
-- whether it is live, and the seconds until it lapses.
SELECT holder, term, expires_at > :now AS live, expires_at - :now AS lapses_in
FROM stepwarden_leases WHERE name = :name

-- name: next_expiry
-- Seconds until the soonest expiry to come of a registry row (an instance silent from now
-- on is gone then) and of the lease when another holds it; NULL when none is coming.
SELECT min(at) - :now AS seconds FROM (
    SELECT min(expires_at) AS at FROM stepwarden_schedulers WHERE expires_at > :now
    UNION ALL SELECT min(expires_at) FROM stepwarden_agents WHERE expires_at > :now
    UNION ALL SELECT expires_at FROM stepwarden_leases
    WHERE name = :name AND holder <> :holder AND expires_at > :now
)

-- name: put_lease
-- Take or renew a lease under the term the caller worked out (rules.lease_term), only while
-- the term read (`seen`) stands.
INSERT INTO stepwarden_leases (name, holder, term, expires_at, renewed_at)
VALUES (:name, :holder, :term, :now + :ttl, :now)
ON CONFLICT (name) DO UPDATE
SET holder = excluded.holder, term = excluded.term, expires_at = excluded.expires_at,
    renewed_at = excluded.renewed_at
WHERE stepwarden_leases.term = :seen
RETURNING term

-- name: release_lease
-- Let the lease lapse at once, so that the next taker gets a new term.
UPDATE stepwarden_leases SET expires_at = 0 WHERE name = :name AND holder = :holder

-- name: lock_lease
-- The sweep's fence: the lease, when held at this term (BEGIN IMMEDIATE holds it).
SELECT term FROM stepwarden_leases
WHERE name = :name AND holder = :holder AND term = :term AND expires_at > :now

-- name: expired_tasks
-- Held tasks (processing, compensating) whose complete_by passed.
SELECT task_id, attempt, failure_count, compensation_failures, max_failures, process_state,
       on_failure, NULL AS seq
FROM stepwarden_tasks INDEXED BY stepwarden_tasks_expiry
WHERE complete_by < :now AND process_state IN ('processing', 'compensating')
ORDER BY complete_by
LIMIT :limit

-- name: expired_steps
-- Open steps of the current attempt of held tasks whose complete_by passed. (A task the
-- sweep released, or an operator's retry reopened, is held again only once claimed.) A step
-- past its total timeout (give_up_by) is not one: it fails by `total_expired`, counting no
-- failure of its task.
SELECT t.task_id, t.attempt, t.failure_count, t.compensation_failures, t.max_failures,
       t.process_state, t.on_failure, s.seq
FROM stepwarden_steps s INDEXED BY stepwarden_steps_expiry
JOIN stepwarden_tasks t ON t.task_id = s.task_id
WHERE s.state IN ('not_started', 'running') AND s.complete_by < :now
  AND (s.give_up_by IS NULL OR s.give_up_by >= :now)
  AND t.process_state IN ('processing', 'compensating') AND t.locked_by IS NOT NULL
  AND s.task_attempt = t.attempt
ORDER BY s.complete_by
LIMIT :limit

-- name: reset_tasks
-- The supervisor's recovery of an expired task into the state the caller planned
-- (rules.plan_expiry), fenced by the attempt and state it read. When its open steps are
-- abandoned, the task waits :hold seconds for them too (rules.compensation_wait: an agent
-- still calling may yet apply its effect), and its backoff's end is kept (backoff_until).
-- Then its `expired` event, the planned alert, and its open steps closed when abandoned.
UPDATE stepwarden_tasks
SET failure_count = :failure_count, compensation_failures = :compensation_failures,
    locked_by = NULL, complete_by = NULL, process_state = :state,
    error = coalesce(:error, error),
    finished_at = CASE WHEN :finished THEN :now END, updated_at = :now,
    eligible_at = :now + MAX(:delay, :hold),
    backoff_until = CASE WHEN :abandon THEN :now + :delay ELSE backoff_until END
WHERE task_id = :task_id AND attempt = :attempt AND process_state = :held_as
  AND locked_by IS NOT NULL
RETURNING :ord AS ord, task_id, :seq AS seq, :expiries AS failure_count, process_state;
INSERT INTO stepwarden_events (task_id, at, kind, detail)
VALUES (:task_id, :now, 'expired',
        json_object('seq', :seq, 'attempt', :attempt, 'failure_count', :expiries,
                    'by', :holder, 'term', :term));
INSERT INTO stepwarden_events (task_id, at, kind, detail)
SELECT :task_id, :now, 'alert',
       json_object('reason', :alert, 'error', :error, 'then', :process_state)
WHERE :alert IS NOT NULL;
UPDATE stepwarden_steps
SET state = 'failed', error = :abandoned_error, abandoned = 1, finished_at = :now
WHERE :abandon AND task_id = :task_id AND state IN ('not_started', 'running');

-- name: set_aside
-- A task the sweep could not recover waits for an operator in the state the caller planned
-- (rules.plan_set_aside), fenced by the attempt and state read: a `set_aside` event, an
-- alert, and its open steps closed (abandoned).
UPDATE stepwarden_tasks
SET process_state = :state, error = :error, locked_by = NULL, complete_by = NULL,
    finished_at = :now, eligible_at = :now, updated_at = :now
WHERE task_id = :task_id AND attempt = :attempt AND process_state = :held_as
  AND locked_by IS NOT NULL
RETURNING :ord AS ord, task_id, failure_count, process_state;
INSERT INTO stepwarden_events (task_id, at, kind, detail)
VALUES (:task_id, :now, 'set_aside', json_object('error', :error, 'by', :holder, 'term', :term));
INSERT INTO stepwarden_events (task_id, at, kind, detail)
VALUES (:task_id, :now, 'alert',
        json_object('reason', :alert, 'error', :error, 'then', :process_state));
UPDATE stepwarden_steps
SET state = 'failed', error = :abandoned_error, abandoned = 1, finished_at = :now
WHERE task_id = :task_id AND state IN ('not_started', 'running');

-- name: set_fork
-- A fork just inserted (App.fork): the task it was forked from, and whose idempotency
-- keys its steps carry (records.idempotency_key).
UPDATE stepwarden_tasks
SET forked_from = :forked_from, keys_of = :keys_of, new_keys_from = :new_keys_from
WHERE task_id = :task_id

-- name: insert_forked_steps
-- A fork's kept steps: each a copy of its original's step, completed with its result and
-- its idempotency key, its input and result sealed again for the fork (new_id).
INSERT INTO stepwarden_steps (task_id, seq, name, agent, operation, state, attempt,
                              task_attempt, priority, complete_by, idempotency_key, input,
                              result, tries, created_at, dispatched_at, claimed_at,
                              finished_at, compensation, compensation_input, complete_within,
                              position, ranked_at, limit_key, tenant)
SELECT :new_id, s.seq, s.name, s.agent, s.operation, s.state, s.attempt, 0, s.priority,
       s.complete_by, s.idempotency_key, :input, :result, s.tries, s.created_at,
       s.dispatched_at, s.claimed_at, s.finished_at, s.compensation, :compensation_input,
       s.complete_within, s.position, s.ranked_at, s.limit_key,
       coalesce((SELECT f.tenant FROM stepwarden_tasks AS f WHERE f.task_id = :new_id),
                s.tenant)
FROM stepwarden_steps AS s
WHERE s.task_id = :task_id AND s.seq = :seq

-- name: get_task
SELECT * FROM stepwarden_tasks WHERE task_id = :task_id

-- name: mark_awaited
-- A waiter for the task's result marks its row awaited where a scheduler holds it
-- (rules.await_next). The task as marked; nothing when not marked.
UPDATE stepwarden_tasks SET awaited = 1
WHERE task_id = :task_id AND NOT awaited AND locked_by IS NOT NULL
RETURNING *

-- name: note_awaited
-- A waiter for the result of a task no scheduler holds notes its wait beside the row
-- (rules.await_next).
INSERT INTO stepwarden_awaited (task_id)
SELECT task_id FROM stepwarden_tasks WHERE task_id = :task_id
ON CONFLICT DO NOTHING

-- name: get_steps
SELECT * FROM stepwarden_steps WHERE task_id = :task_id ORDER BY seq

-- name: list_tasks
-- The tasks a filter matches (records.TaskFilter, for `stepwarden tasks`), oldest first
-- (created_at, then task id), those after the cursor :after only (NULL: from the first): a
-- task id, whose created_at is read here, or taken from :after_at on a shard that does not
-- hold it; :states a JSON array (NULL: any), times as epochs.
SELECT * FROM stepwarden_tasks AS t
WHERE 1
  AND (:after IS NULL
       OR t.created_at > coalesce((SELECT a.created_at FROM stepwarden_tasks AS a
                                   WHERE a.task_id = :after), :after_at)
       OR (t.created_at = coalesce((SELECT a.created_at FROM stepwarden_tasks AS a
                                    WHERE a.task_id = :after), :after_at)
           AND t.task_id > :after))
  AND (:states IS NULL OR t.process_state IN (SELECT value FROM json_each(:states)))
  AND (:workflow IS NULL OR t.workflow = :workflow)
  AND (:version IS NULL OR t.version = :version)
  AND (:tenant IS NULL OR t.tenant = :tenant)
  AND (:error IS NULL OR instr(t.error, :error) > 0)
  AND (:created_after IS NULL OR t.created_at >= :created_after)
  AND (:created_before IS NULL OR t.created_at < :created_before)
  AND (:finished_after IS NULL OR t.finished_at >= :finished_after)
  AND (:finished_before IS NULL OR t.finished_at < :finished_before)
ORDER BY t.created_at, t.task_id
LIMIT :limit

-- name: select_tasks
-- The tasks a filter matches (records.TaskFilter, for a bulk action), by task id from after :after
-- (a cursor: each batch goes on from the last id of the one before); :states a JSON array
-- (NULL: any), :tags a JSON object (NULL: none asked), times as epochs.
SELECT * FROM stepwarden_tasks AS t
WHERE t.task_id > :after
  AND (:states IS NULL OR t.process_state IN (SELECT value FROM json_each(:states)))
  AND (:workflow IS NULL OR t.workflow = :workflow)
  AND (:version IS NULL OR t.version = :version)
  AND (:tenant IS NULL OR t.tenant = :tenant)
  AND (:error IS NULL OR instr(t.error, :error) > 0)
  AND (:created_after IS NULL OR t.created_at >= :created_after)
  AND (:created_before IS NULL OR t.created_at < :created_before)
  AND (:finished_after IS NULL OR t.finished_at >= :finished_after)
  AND (:finished_before IS NULL OR t.finished_at < :finished_before)
  AND (:tags IS NULL OR NOT EXISTS (SELECT 1 FROM json_each(:tags) AS w
                                    WHERE NOT EXISTS (SELECT 1 FROM stepwarden_task_tags AS m
                                                      WHERE m.task_id = t.task_id
                                                        AND m.key = w.key
                                                        AND m.value = w.value)))
ORDER BY t.task_id
LIMIT :limit

-- name: list_tagged_tasks
-- list_tasks of the tasks that have every tag of :tags (a JSON object), read through the
-- tags' index on (key, value) from one of them (:key, :value).
SELECT t.* FROM stepwarden_task_tags AS g INDEXED BY stepwarden_task_tags_key_value
JOIN stepwarden_tasks AS t ON t.task_id = g.task_id
WHERE g.key = :key AND g.value = :value
  AND (:after IS NULL
       OR t.created_at > coalesce((SELECT a.created_at FROM stepwarden_tasks AS a
                                   WHERE a.task_id = :after), :after_at)
       OR (t.created_at = coalesce((SELECT a.created_at FROM stepwarden_tasks AS a
                                    WHERE a.task_id = :after), :after_at)
           AND t.task_id > :after))
  AND (:states IS NULL OR t.process_state IN (SELECT value FROM json_each(:states)))
  AND (:workflow IS NULL OR t.workflow = :workflow)
  AND (:version IS NULL OR t.version = :version)
  AND (:tenant IS NULL OR t.tenant = :tenant)
  AND (:error IS NULL OR instr(t.error, :error) > 0)
  AND (:created_after IS NULL OR t.created_at >= :created_after)
  AND (:created_before IS NULL OR t.created_at < :created_before)
  AND (:finished_after IS NULL OR t.finished_at >= :finished_after)
  AND (:finished_before IS NULL OR t.finished_at < :finished_before)
  AND NOT EXISTS (SELECT 1 FROM json_each(:tags) AS w
                  WHERE NOT EXISTS (SELECT 1 FROM stepwarden_task_tags AS m
                                    WHERE m.task_id = t.task_id AND m.key = w.key
                                      AND m.value = w.value))
ORDER BY t.created_at, t.task_id
LIMIT :limit

-- name: client_unfinished
-- The tasks an application API client submitted that have not finished, for its quota,
-- through the partial index of migration 0019 (its states: `states.FINISHED_TASK_STATES`;
-- a unit test keeps them the same).
SELECT count(*) AS unfinished FROM stepwarden_tasks INDEXED BY stepwarden_tasks_submitted_by
WHERE submitted_by = :client
  AND process_state NOT IN ('processed', 'error', 'compensated', 'compensation_failed',
                            'cancelled')

-- name: client_agents
-- The alive agent registrations of a client (its instances are named CLIENT/...), and
-- whether this instance's for this agent is one of them.
SELECT count(*) AS alive,
       coalesce(max(instance = :instance AND agent = :agent), 0) AS known
FROM stepwarden_agents
WHERE substr(instance, 1, length(:prefix)) = :prefix AND expires_at > :now

-- name: count_tasks
SELECT process_state, count(*) AS n FROM stepwarden_tasks GROUP BY process_state

-- name: events
-- Events, optionally of one task and one kind, in order; each filter read through its index.
SELECT id, task_id, at, kind, detail FROM stepwarden_events
WHERE task_id = :task_id AND (:kind IS NULL OR kind = :kind)
UNION ALL
SELECT id, task_id, at, kind, detail FROM stepwarden_events
WHERE :task_id IS NULL AND kind = :kind
UNION ALL
SELECT id, task_id, at, kind, detail FROM stepwarden_events
WHERE :task_id IS NULL AND :kind IS NULL
ORDER BY id
LIMIT :limit

-- name: history
-- A page of one task's events, newest first, below an id (its index read backwards).
SELECT id, task_id, at, kind, detail FROM stepwarden_events
WHERE task_id = :task_id AND (:before IS NULL OR id < :before)
ORDER BY id DESC
LIMIT :limit

-- name: wait_read_task
-- A wait reads the task it parks (the write lock is held: a send waits for it).
SELECT process_state, attempt, locked_by FROM stepwarden_tasks WHERE task_id = :task_id

-- name: read_wait
-- The wait at a position of a task's workflow, and whether its time has come.
SELECT task_id, kind, name, state, event_id, payload, wake_at <= :now AS due
FROM stepwarden_waits
WHERE task_id = :task_id AND seq = :seq

-- name: insert_wait
-- A new wait at its position: it fires (or times out) at `until` (an epoch) or `delay`
-- seconds from now.
INSERT INTO stepwarden_waits (task_id, seq, position, kind, name, wake_at, created_at)
VALUES (:task_id, :seq, :position, :kind, :name, coalesce(:until, :now + :delay), :now)
RETURNING task_id, kind, name, state, event_id, payload, wake_at <= :now AS due

-- name: end_wait
-- An open wait ends: done (a timer fired, an event taken) or timed_out.
UPDATE stepwarden_waits
SET state = :state, event_id = :event_id, payload = :payload, finished_at = :now
WHERE task_id = :task_id AND seq = :seq AND state = 'open'

-- name: take_event
-- The oldest event of this name sent to the task that no wait has taken (once the wait has
-- timed out, only one sent before its timeout), taken by the wait at `seq`.
UPDATE stepwarden_inbox SET taken_by = :seq
WHERE id = (SELECT i.id FROM stepwarden_inbox i
            WHERE i.task_id = :task_id AND i.name = :name AND i.taken_by IS NULL
              AND (NOT :timed_out OR i.sent_at <= (
                  SELECT w.wake_at FROM stepwarden_waits w
                  WHERE w.task_id = :task_id AND w.seq = :seq))
            ORDER BY i.id LIMIT 1)
RETURNING event_id, payload

-- name: park_task
-- The task waits: released by its scheduler (fenced by attempt and hold), no deadline
-- running, until the earliest wake_at of the waits it parks on (none when it waits only for
-- children), or an event, or a child's end.
UPDATE stepwarden_tasks
SET process_state = 'waiting', locked_by = NULL, complete_by = NULL,
    wake_at = (SELECT min(wake_at) FROM stepwarden_waits
               WHERE task_id = :task_id AND seq IN (SELECT value FROM json_each(:seqs))),
    waiting_for = :waiting_for, updated_at = :now
WHERE task_id = :task_id AND process_state = 'processing' AND attempt = :attempt
  AND locked_by = :scheduler
RETURNING task_id, wake_at

-- name: park_waits
-- The waits a park is asked for, and whether each can end now: ended already (a child's end
-- is recorded in its wait), its time come (a timer fired, a wait timed out), or an event
-- kept for its name.
SELECT w.seq, w.position, w.kind, w.name, w.state, coalesce(w.wake_at <= :now, 0) AS due,
       EXISTS (SELECT 1 FROM stepwarden_inbox i
               WHERE i.task_id = w.task_id AND i.name = w.name AND i.taken_by IS NULL
                 AND w.kind = 'event') AS kept
FROM stepwarden_waits w
WHERE w.task_id = :task_id AND w.seq IN (SELECT value FROM json_each(:seqs))
ORDER BY w.seq

-- name: send_read_task
-- A send reads the task it is for (the write lock is held: a wait waits for it).
SELECT process_state, waiting_for FROM stepwarden_tasks WHERE task_id = :task_id

-- name: inbox_kept
-- The events a task keeps (taken by a wait or not), and whether this event_id is one of
-- them (the write lock is held: no concurrent send is counted out).
SELECT count(*) AS kept, coalesce(max(event_id = :event_id), 0) AS sent_before
FROM stepwarden_inbox WHERE task_id = :task_id

-- name: insert_inbox
-- An event for a task; an event_id already sent is not sent again.
INSERT INTO stepwarden_inbox (task_id, event_id, name, payload, sent_at)
VALUES (:task_id, :event_id, :name, :payload, :now)
ON CONFLICT (task_id, event_id) DO NOTHING
RETURNING id

-- name: wake_task
-- A waiting task with an open wait for this event is pending again, at once.
UPDATE stepwarden_tasks
SET process_state = 'pending', eligible_at = :now, wake_at = NULL, waiting_for = NULL,
    updated_at = :now
WHERE task_id = :task_id AND process_state = 'waiting'
  AND EXISTS (SELECT 1 FROM stepwarden_waits w
              WHERE w.task_id = :task_id AND w.kind = 'event' AND w.name = :name
                AND w.state = 'open')
RETURNING task_id

-- name: submit_found
-- The tasks of the given ids that a submit found taken: what a re-submit is compared by.
SELECT task_id, workflow, version, submitted_by, input_digest, tenant FROM stepwarden_tasks
WHERE task_id IN (SELECT value FROM json_each(:task_ids))

-- name: child_read
-- A task a child wait would create (or did): whose child it is, if anyone's, and its workflow.
SELECT task_id, parent_id, parent_position, workflow FROM stepwarden_tasks
WHERE task_id = :task_id

-- name: wake_parents
-- Of the given tasks, those that ended and have a parent: each one's end is recorded in its
-- parent's open wait for it (done with its result, or failed with its state and error), and
-- the parent, waiting, is pending again at once, with a `woke` event (one, naming the first
-- child, when several of its children end together).
SELECT c.parent_id, c.task_id AS child_id, c.process_state AS child_state,
       p.process_state = 'waiting' AS woke
FROM stepwarden_tasks c
JOIN stepwarden_waits w ON w.task_id = c.parent_id AND w.kind = 'child' AND w.name = c.task_id
                       AND w.state = 'open'
JOIN stepwarden_tasks p ON p.task_id = c.parent_id
WHERE c.task_id IN (SELECT value FROM json_each(:task_ids))
  AND c.process_state IN ('processed', 'error', 'compensated', 'compensation_failed',
                          'cancelled')
ORDER BY c.parent_id, c.task_id;
UPDATE stepwarden_waits
SET state = CASE WHEN :child_state = 'processed' THEN 'done' ELSE 'failed' END,
    payload = (SELECT CASE WHEN c.process_state = 'processed' THEN c.result
                           ELSE json_object('state', c.process_state, 'error', c.error) END
               FROM stepwarden_tasks c WHERE c.task_id = :child_id),
    finished_at = :now
WHERE task_id = :parent_id AND kind = 'child' AND name = :child_id AND state = 'open';
UPDATE stepwarden_tasks
SET process_state = 'pending', eligible_at = :now, wake_at = NULL, waiting_for = NULL,
    updated_at = :now
WHERE task_id = :parent_id AND process_state = 'waiting';
INSERT INTO stepwarden_events (task_id, at, kind, detail)
SELECT :parent_id, :now, 'woke',
       json_object('waited_for', 'child:' || :child_id, 'child', :child_id,
                   'state', :child_state)
WHERE changes() > 0;

-- name: descendants
-- The children of the given tasks, theirs, and so on, deepest first (the write lock is
-- held: nothing changes them meanwhile).
WITH RECURSIVE d(task_id, depth) AS (
    SELECT task_id, 1 FROM stepwarden_tasks
    WHERE parent_id IN (SELECT value FROM json_each(:task_ids))
    UNION ALL
    SELECT t.task_id, d.depth + 1 FROM stepwarden_tasks t JOIN d ON t.parent_id = d.task_id
    WHERE d.depth < 1000
), x AS (
    SELECT task_id, max(depth) AS depth FROM d GROUP BY task_id
)
SELECT t.task_id, t.parent_id, t.process_state, t.created_at, x.depth
FROM stepwarden_tasks t JOIN x ON x.task_id = t.task_id
ORDER BY x.depth DESC, t.task_id

-- name: children_states
-- A task's children as a cascade reads them (rules.plan_cascade): their states, newest last.
SELECT task_id, parent_id, process_state, created_at FROM stepwarden_tasks
WHERE parent_id = :task_id
ORDER BY created_at, task_id

-- name: children_of
-- A task's children, oldest first.
SELECT * FROM stepwarden_tasks WHERE parent_id = :task_id
ORDER BY created_at, task_id
LIMIT :limit

-- name: due_waiting
-- Waiting tasks whose wake_at has come (read through the index of waiting tasks by
-- wake_at: the cost is what is due, not what waits).
SELECT task_id, waiting_for FROM stepwarden_tasks INDEXED BY stepwarden_tasks_waking
WHERE process_state = 'waiting' AND wake_at <= :now
ORDER BY wake_at
LIMIT :limit

-- name: wake_due
-- A waiting task whose wake_at has come is pending again, with its `woke` event.
UPDATE stepwarden_tasks
SET process_state = 'pending', eligible_at = :now, wake_at = NULL, waiting_for = NULL,
    updated_at = :now
WHERE task_id = :task_id AND process_state = 'waiting'
RETURNING :ord AS ord, task_id, :waiting_for AS waiting_for;
INSERT INTO stepwarden_events (task_id, at, kind, detail)
VALUES (:task_id, :now, 'woke', json_object('waited_for', :waiting_for, 'by', :by, 'term', :term));

-- name: list_waits
-- The waits of a task, by position.
SELECT * FROM stepwarden_waits WHERE task_id = :task_id ORDER BY seq

-- name: db_now
-- The store's clock, as an epoch.
SELECT :now AS now

-- name: upsert_schedules
-- The application's schedules as its code declares them (the version of the workflow their
-- tasks run included); a schedule whose timing changed starts again from the next tick the
-- caller worked out, one that did not keeps its own (and whether an operator paused it).
INSERT INTO stepwarden_schedules AS s (name, workflow, cron, every, input, timezone, catch_up,
                                       complete_within, max_failures, on_failure, next_at,
                                       updated_at, version, tenant)
VALUES (:name, :workflow, :cron, :every, :input, :timezone, :catch_up, :complete_within,
        :max_failures, :on_failure, :next_at, :now, :version, :tenant)
ON CONFLICT (name) DO UPDATE
SET workflow = excluded.workflow, input = excluded.input, catch_up = excluded.catch_up,
    complete_within = excluded.complete_within, max_failures = excluded.max_failures,
    on_failure = excluded.on_failure, version = excluded.version, tenant = excluded.tenant,
    cron = excluded.cron, every = excluded.every, timezone = excluded.timezone,
    next_at = CASE WHEN s.cron IS NOT excluded.cron OR s.every IS NOT excluded.every
                     OR s.timezone <> excluded.timezone
                   THEN excluded.next_at ELSE s.next_at END,
    updated_at = :now

-- name: due_schedules
-- Schedules not paused whose next tick has come, with the store's clock.
SELECT name, workflow, version, cron, every, input, timezone, catch_up, complete_within,
       max_failures, on_failure, tenant, next_at, :now AS now
FROM stepwarden_schedules INDEXED BY stepwarden_schedules_due
WHERE NOT paused AND next_at <= :now
ORDER BY next_at
LIMIT :limit

-- name: advance_schedules
-- A schedule moves on to the next tick the caller worked out.
UPDATE stepwarden_schedules
SET next_at = :next_at, last_tick = coalesce(:last_tick, last_tick), updated_at = :now
WHERE name = :name

-- name: set_aside_schedules
-- A schedule whose ticks cannot be worked out is paused, for an operator to see.
UPDATE stepwarden_schedules SET paused = 1, updated_at = :now
WHERE name = :name

-- name: list_schedules
SELECT * FROM stepwarden_schedules ORDER BY name

-- name: lock_schedule
-- A schedule an operator pauses or resumes (under the write lock), with the store's clock.
SELECT name, workflow, version, cron, every, input, timezone, catch_up, complete_within,
       max_failures, on_failure, tenant, paused, next_at, :now AS now
FROM stepwarden_schedules
WHERE name = :name

-- name: pause_schedule
-- An operator pauses (or resumes) a schedule, from the next tick the caller worked out.
UPDATE stepwarden_schedules SET paused = :paused, next_at = :next_at, updated_at = :now
WHERE name = :name

-- name: op_read_task
-- An operator action reads the task it acts on (under the write lock).
SELECT process_state, attempt FROM stepwarden_tasks WHERE task_id = :task_id

-- name: op_move_task
-- An operator action moves the task from the state and attempt it read. Releasing a held task
-- fences out its scheduler; a compensation waits :hold seconds for the steps an agent may
-- still be calling (rules.compensation_wait).
UPDATE stepwarden_tasks
SET process_state = :to, locked_by = NULL, complete_by = NULL, wake_at = NULL,
    waiting_for = NULL,
    failure_count = CASE WHEN :reset_failures THEN 0 ELSE failure_count END,
    compensation_failures = CASE WHEN :reset_compensation_failures THEN 0
                                 ELSE compensation_failures END,
    eligible_at = :now + :hold,
    backoff_until = CASE WHEN :wait_open THEN :now ELSE backoff_until END,
    finished_at = CASE WHEN :final THEN :now ELSE NULL END, updated_at = :now
WHERE task_id = :task_id AND process_state = :from AND attempt = :attempt

-- name: close_open_steps
-- A task leaving the held states by an operator's hand leaves no request behind: its open
-- steps are closed (abandoned), so no agent claims them and a late answer changes nothing
-- (locked_by kept: the instance whose call may still run, until it says it stopped).
UPDATE stepwarden_steps
SET state = 'failed', error = :error, abandoned = 1, finished_at = :now
WHERE task_id = :task_id AND state IN ('not_started', 'running')

-- name: op_reopen_steps
-- Resubmission: the failed steps (of the forward path, or the compensations) are open again,
-- already past complete_by, so that the scheduler taking the task up re-dispatches each under
-- a new attempt and the same idempotency key, and no agent claims them before.
UPDATE stepwarden_steps
SET state = 'not_started', complete_by = :now, locked_by = NULL, error = NULL, abandoned = 0,
    finished_at = NULL, call_stopped_at = NULL
WHERE task_id = :task_id AND state = 'failed'
  AND ((:compensations AND compensates IS NOT NULL) OR (NOT :compensations AND compensates IS NULL))
RETURNING seq

-- name: op_skip_step
-- Mark a step that is not completed as completed with the operator's result.
UPDATE stepwarden_steps
SET state = 'completed', result = :result, error = NULL, abandoned = 0, locked_by = NULL,
    finished_at = :now
WHERE task_id = :task_id AND seq = :seq AND state <> 'completed'
RETURNING seq

-- name: outbox_read
-- Outbox messages of a channel or a task, after an id, oldest first.
SELECT id, channel, task_id, kind, detail, at, attempts, delivered_to FROM stepwarden_outbox
WHERE (:channel IS NULL OR channel = :channel) AND (:task_id IS NULL OR task_id = :task_id)
  AND id > :after
ORDER BY id
LIMIT :limit

-- name: outbox_due
-- Alerts due for delivery, oldest first.
SELECT id, channel, task_id, kind, detail, at, attempts, delivered_to
FROM stepwarden_outbox INDEXED BY stepwarden_outbox_due
WHERE next_at <= :now AND channel = 'alerts'
ORDER BY next_at, id
LIMIT :limit

-- name: outbox_delivered
-- Record a delivery round of one alert: the sinks reached so far; done, or due again later.
UPDATE stepwarden_outbox
SET delivered_to = :delivered_to, attempts = attempts + 1,
    next_at = CASE WHEN :done THEN NULL ELSE :now + :retry_in END,
    delivered_at = CASE WHEN :done THEN :now END
WHERE id = :id AND next_at IS NOT NULL

-- name: relay_due
-- The relay's due status messages (for a broker), in id order: of the tasks whose first
-- undelivered message is due and at most :upto, their messages up to :upto. A task whose
-- first message waits for its next try holds back the others. (SQLite has one writer at a
-- time: ids are given in the order of the commits, and :upto is the newest.)
WITH heads AS (
    SELECT task_id, min(id) AS id, next_at FROM stepwarden_outbox
    WHERE next_at IS NOT NULL AND channel <> 'alerts'
    GROUP BY task_id
), due AS (
    SELECT task_id FROM heads WHERE next_at <= :now AND id <= :upto
    ORDER BY next_at, id
    LIMIT :tasks
)
SELECT o.id, o.channel, o.task_id, o.kind, o.detail, o.at, o.attempts, o.delivered_to
FROM stepwarden_outbox o JOIN due ON o.task_id = due.task_id
WHERE o.next_at IS NOT NULL AND o.channel <> 'alerts' AND o.id <= :upto
ORDER BY o.id
LIMIT :limit

-- name: relay_fence
-- The newest undelivered status message for a broker (`upto`), and a fence when it is above
-- :safe: always passed on SQLite, whose commits come in the order of the ids.
SELECT coalesce(max(id), 0) AS upto, CASE WHEN coalesce(max(id), 0) > :safe THEN 0 END AS fence
FROM stepwarden_outbox
WHERE next_at IS NOT NULL AND channel <> 'alerts'

-- name: relay_passed
SELECT 1 AS passed

-- name: relay_delivered
-- Status messages the broker acknowledged: delivered (once per id); those of a task purged
-- meanwhile (kept past its retention until delivered: the purge deletes delivered ones only)
-- deleted.
SELECT o.id, o.task_id IS NOT NULL AND NOT EXISTS (
    SELECT 1 FROM stepwarden_tasks t WHERE t.task_id = o.task_id) AS purged
FROM stepwarden_outbox o WHERE o.id = :id AND o.next_at IS NOT NULL;
UPDATE stepwarden_outbox
SET next_at = NULL, attempts = attempts + 1, delivered_at = :now, error = NULL,
    delivered_to = '["relay"]'
WHERE id = :id AND NOT :purged;
DELETE FROM stepwarden_outbox WHERE id = :id AND :purged;

-- name: relay_failed
-- A status message the broker did not take: tried again in :retry_in seconds.
UPDATE stepwarden_outbox
SET attempts = attempts + 1, error = :error, next_at = :now + :retry_in
WHERE id = :id AND next_at IS NOT NULL

-- name: relay_refused
-- Status messages the relay never sends (their destination is not one it may send to): done,
-- never delivered, with their error; those of a task purged meanwhile deleted.
SELECT o.id, o.task_id IS NOT NULL AND NOT EXISTS (
    SELECT 1 FROM stepwarden_tasks t WHERE t.task_id = o.task_id) AS purged
FROM stepwarden_outbox o WHERE o.id = :id AND o.next_at IS NOT NULL;
UPDATE stepwarden_outbox SET next_at = NULL, attempts = attempts + 1, error = :error
WHERE id = :id AND NOT :purged;
DELETE FROM stepwarden_outbox WHERE id = :id AND :purged;

-- name: relay_backlog
-- Per broker destination: status messages not yet delivered, the oldest one's age, those
-- tried and failed, the next try and the newest error.
SELECT o.channel, count(*) AS pending, :now - min(o.at) AS lag,
       sum(o.attempts > 0) AS failing, max(o.attempts) AS attempts,
       min(CASE WHEN o.attempts > 0 THEN o.next_at END) - :now AS retry_in,
       (SELECT e.error FROM stepwarden_outbox e
        WHERE e.channel = o.channel AND e.next_at IS NOT NULL AND e.error IS NOT NULL
        ORDER BY e.id DESC LIMIT 1) AS error
FROM stepwarden_outbox o
WHERE o.next_at IS NOT NULL AND o.channel <> 'alerts'
GROUP BY o.channel
ORDER BY o.channel

-- name: purge
-- Finished tasks (processed, compensated, cancelled) older than the retention (of one tenant,
-- or of all), oldest first,
-- deleted with their events, delivered outbox messages and noted waits, and their steps (ON
-- DELETE CASCADE).
SELECT task_id FROM stepwarden_tasks INDEXED BY stepwarden_tasks_finished
WHERE finished_at < :now - :older_than
  AND process_state IN ('processed', 'compensated', 'cancelled')
  AND (:tenant IS NULL OR tenant = :tenant)
ORDER BY finished_at
LIMIT :limit;
DELETE FROM stepwarden_events WHERE task_id = :task_id;
DELETE FROM stepwarden_outbox WHERE task_id = :task_id AND next_at IS NULL;
DELETE FROM stepwarden_awaited WHERE task_id = :task_id;
DELETE FROM stepwarden_tasks WHERE task_id = :task_id;

-- name: insert_events
INSERT INTO stepwarden_events (task_id, at, kind, detail) VALUES (:task_id, :now, :kind, :detail)

-- name: find_tasks
-- The dashboard (to the end of this file): read-only queries of the operator's dashboard
-- and its metrics.
-- Tasks newest first, optionally of one state, one workflow, one version and one tenant,
-- whose id contains :search.
SELECT * FROM stepwarden_tasks
WHERE (:state IS NULL OR process_state = :state)
  AND (:workflow IS NULL OR workflow = :workflow)
  AND (:version IS NULL OR version = :version)
  AND (:tenant IS NULL OR tenant = :tenant)
  AND (:search IS NULL OR instr(task_id, :search) > 0)
ORDER BY created_at DESC, task_id DESC
LIMIT :limit

-- name: find_tagged_tasks
-- find_tasks (and its tenant) of the tasks that have every tag of :tags (a JSON object), read through the
-- tags' index on (key, value) from one of them (:key, :value).
SELECT t.* FROM stepwarden_task_tags AS g INDEXED BY stepwarden_task_tags_key_value
JOIN stepwarden_tasks AS t ON t.task_id = g.task_id
WHERE g.key = :key AND g.value = :value
  AND (:state IS NULL OR t.process_state = :state)
  AND (:workflow IS NULL OR t.workflow = :workflow)
  AND (:version IS NULL OR t.version = :version)
  AND (:tenant IS NULL OR t.tenant = :tenant)
  AND (:search IS NULL OR instr(t.task_id, :search) > 0)
  AND NOT EXISTS (SELECT 1 FROM json_each(:tags) AS w
                  WHERE NOT EXISTS (SELECT 1 FROM stepwarden_task_tags AS m
                                    WHERE m.task_id = t.task_id AND m.key = w.key
                                      AND m.value = w.value))
ORDER BY t.created_at DESC, t.task_id DESC
LIMIT :limit

-- name: workflow_names
SELECT DISTINCT workflow FROM stepwarden_tasks ORDER BY workflow

-- name: newest_outbox
SELECT * FROM stepwarden_outbox WHERE channel = :channel ORDER BY id DESC LIMIT :limit

-- name: oldest_pending
SELECT :now - min(created_at) AS age FROM stepwarden_tasks WHERE process_state = 'pending'

-- name: read_lease
SELECT name, holder, term, expires_at, expires_at - :now AS remaining,
       :now - renewed_at AS since_renewed
FROM stepwarden_leases WHERE name = :name

-- name: activity
-- Tasks processed and step failures per :bucket seconds over the last :window, by bucket
-- number, with the clock read (`now`); one row with no bucket when nothing happened.
SELECT :now AS now, a.b, a.processed, a.failed FROM (SELECT 1) LEFT JOIN (
    SELECT b, sum(processed) AS processed, sum(failed) AS failed FROM (
        SELECT CAST(finished_at / :bucket AS INTEGER) AS b, 1 AS processed, 0 AS failed
        FROM stepwarden_tasks
        WHERE finished_at >= :now - :window AND process_state = 'processed'
        UNION ALL
        SELECT CAST(at / :bucket AS INTEGER), 0, 1
        FROM stepwarden_events
        WHERE kind IN ('step_failed', 'expired') AND at >= :now - :window
    )
    GROUP BY b
) AS a ON 1
ORDER BY a.b

-- name: step_stats
-- Per agent and operation: steps started, completed, failed and reassigned; the completed
-- steps' durations (claimed to finished) counted under each bound of base.DURATION_BUCKETS.
SELECT agent, operation,
       sum(CASE WHEN claimed_at IS NOT NULL THEN 1 ELSE 0 END) AS started,
       sum(CASE WHEN state = 'completed' THEN 1 ELSE 0 END) AS completed,
       sum(CASE WHEN state = 'failed' THEN 1 ELSE 0 END) AS failed,
       sum(reassignments) AS reassignments,
       sum(CASE WHEN attempt > 1 THEN 1 ELSE 0 END) AS retried,
       coalesce(sum(d), 0.0) AS duration_sum,
       sum(CASE WHEN d <= 0.005 THEN 1 ELSE 0 END) AS b0,
       sum(CASE WHEN d <= 0.01 THEN 1 ELSE 0 END) AS b1,
       sum(CASE WHEN d <= 0.025 THEN 1 ELSE 0 END) AS b2,
       sum(CASE WHEN d <= 0.05 THEN 1 ELSE 0 END) AS b3,
       sum(CASE WHEN d <= 0.1 THEN 1 ELSE 0 END) AS b4,
       sum(CASE WHEN d <= 0.25 THEN 1 ELSE 0 END) AS b5,
       sum(CASE WHEN d <= 0.5 THEN 1 ELSE 0 END) AS b6,
       sum(CASE WHEN d <= 1.0 THEN 1 ELSE 0 END) AS b7,
       sum(CASE WHEN d <= 2.5 THEN 1 ELSE 0 END) AS b8,
       sum(CASE WHEN d <= 5.0 THEN 1 ELSE 0 END) AS b9,
       sum(CASE WHEN d <= 10.0 THEN 1 ELSE 0 END) AS b10,
       sum(CASE WHEN d <= 30.0 THEN 1 ELSE 0 END) AS b11,
       sum(CASE WHEN d <= 60.0 THEN 1 ELSE 0 END) AS b12
FROM (
    SELECT agent, operation, state, claimed_at, reassignments, attempt,
           CASE WHEN state = 'completed' AND claimed_at IS NOT NULL
                THEN max(finished_at - claimed_at, 0.0) END AS d
    FROM stepwarden_steps
)
GROUP BY agent, operation ORDER BY agent, operation

-- name: count_events
SELECT count(*) AS n FROM stepwarden_events WHERE kind = :kind

-- name: scheduler_beat
-- A scheduler instance registers or refreshes its row (the workflows and versions it runs);
-- it is gone at expires_at.
INSERT INTO stepwarden_schedulers (instance, workflows, versions, capacity, held, started_at,
                                   heartbeat_at, expires_at)
VALUES (:instance, :workflows, :versions, :capacity, :held, :now, :now, :now + :ttl)
ON CONFLICT (instance) DO UPDATE
SET workflows = excluded.workflows, versions = excluded.versions, capacity = excluded.capacity,
    held = excluded.held, heartbeat_at = excluded.heartbeat_at, expires_at = excluded.expires_at

-- name: scheduler_leave
UPDATE stepwarden_schedulers SET expires_at = MIN(expires_at, :now) WHERE instance = :instance

-- name: list_schedulers
SELECT *, expires_at > :now AS alive FROM stepwarden_schedulers ORDER BY started_at, instance

-- name: held_by
-- The tasks one scheduler instance holds, and whether their complete_by is still to come.
SELECT task_id, attempt, locked_by, process_state, complete_by > :now AS in_time
FROM stepwarden_tasks INDEXED BY stepwarden_tasks_holder
WHERE locked_by = :scheduler AND process_state IN ('processing', 'compensating')

-- name: gone_scheduler_tasks
-- Tasks held by scheduler instances whose registry row has expired.
SELECT t.task_id, t.attempt, t.locked_by, t.process_state
FROM stepwarden_schedulers s
JOIN stepwarden_tasks t INDEXED BY stepwarden_tasks_holder ON t.locked_by = s.instance
WHERE s.expires_at <= :now AND t.process_state IN ('processing', 'compensating')
LIMIT :limit

-- name: release_tasks
-- A held task given back, unheld, into the state the caller worked out (rules.release_state),
-- fenced by the attempt and the hold read; eligible at once, failure_count unchanged; then
-- its `released` event (who held it, who released it, why).
UPDATE stepwarden_tasks
SET process_state = :state, locked_by = NULL, complete_by = NULL, eligible_at = :now,
    updated_at = :now
WHERE task_id = :task_id AND attempt = :attempt AND locked_by = :scheduler
  AND process_state = :held_as
RETURNING :ord AS ord, task_id, attempt, :scheduler AS scheduler, process_state;
INSERT INTO stepwarden_events (task_id, at, kind, detail)
VALUES (:task_id, :now, 'released',
        json_object('attempt', :attempt, 'from', :scheduler, 'by', :by, 'term', :term,
                    'reason', :reason));

-- name: version_backlog
-- The tasks waiting for a scheduler (pending; compensating, unheld) by workflow and version,
-- of the given workflows (a JSON array; all, when null), with the submit time of the oldest:
-- read through the claim indexes.
SELECT workflow, version, sum(pending) AS pending, sum(compensating) AS compensating,
       min(oldest) AS oldest
FROM (
    SELECT workflow, version, count(*) AS pending, 0 AS compensating,
           min(created_at) AS oldest
    FROM stepwarden_tasks INDEXED BY stepwarden_tasks_pending
    WHERE process_state = 'pending'
      AND (:workflows IS NULL OR workflow IN (SELECT value FROM json_each(:workflows)))
    GROUP BY workflow, version
    UNION ALL
    SELECT workflow, version, 0, count(*), min(created_at)
    FROM stepwarden_tasks INDEXED BY stepwarden_tasks_compensate
    WHERE process_state = 'compensating' AND locked_by IS NULL
      AND (:workflows IS NULL OR workflow IN (SELECT value FROM json_each(:workflows)))
    GROUP BY workflow, version
)
GROUP BY workflow, version
ORDER BY workflow, version

-- name: forget_schedulers
-- Scheduler instances gone for a while leave the registry.
DELETE FROM stepwarden_schedulers WHERE expires_at < :now - :forget_after

-- name: shard_name
-- Shards are PostgreSQL's (placement.py): on SQLite these read and write empty tables.
SELECT name FROM stepwarden_shard_name

-- name: shard_map
SELECT generation, shards, slots FROM stepwarden_shard_map ORDER BY generation

-- name: lock_shard_map
-- A write transaction of SQLite's holds the whole database already.
SELECT 1 AS locked

-- name: name_shard
INSERT INTO stepwarden_shard_name (name) VALUES (:name) ON CONFLICT (only_one) DO NOTHING

-- name: put_shard_generation
INSERT INTO stepwarden_shard_map (generation, shards, slots, created_at)
VALUES (:generation, :shards, :slots, :now)
ON CONFLICT (generation) DO NOTHING

-- name: any_task
SELECT EXISTS (SELECT 1 FROM stepwarden_tasks) AS present

-- name: inputs_without_digest
-- Tasks stored before their input's digest was recorded (migration 0019), in task_id order
-- after `after`, a batch at a time (`Store.migrate`).
SELECT task_id, input FROM stepwarden_tasks
WHERE task_id > :after AND input_digest IS NULL
ORDER BY task_id
LIMIT :limit

-- name: set_input_digests
-- The digests of tasks stored before migration 0019, where none was recorded since.
UPDATE stepwarden_tasks SET input_digest = :input_digest
WHERE task_id = :task_id AND input_digest IS NULL

-- name: sealing_keys
-- The keys that sealed secrets in this store, with their checks (`sealing.Keyring.verify`).
SELECT key_id, check_value FROM stepwarden_keys ORDER BY added_at, key_id

-- name: add_sealing_key
-- A key that seals in this store from now on, with its check; one of its id already known
-- is kept (the check read back says whether the keyring's key is that one).
INSERT INTO stepwarden_keys (key_id, check_value, added_at) VALUES (:key_id, :check_value, :now)
ON CONFLICT (key_id) DO NOTHING

-- name: drop_sealing_keys
-- Keys that no longer seal anything here (`stepwarden reseal` moved every value off them).
DELETE FROM stepwarden_keys WHERE key_id IN (SELECT value FROM json_each(:key_ids))

-- name: reseal_tasks
-- Tasks after `after` (task_id order) whose input or result may hold a secret, or whose
-- input's digest is not keyed: what `stepwarden reseal` looks at, a batch at a time.
SELECT task_id, input, result, input_digest FROM stepwarden_tasks
WHERE task_id > :after
  AND (instr(input, '"$secret"') OR instr(input, '"$sealed"')
       OR instr(result, '"$secret"') OR instr(result, '"$sealed"')
       OR input_digest IS NULL OR input_digest NOT LIKE 'k.%')
ORDER BY task_id
LIMIT :limit

-- name: reseal_task
-- A task's payloads sealed anew, each where it is still the text read (a write since wins,
-- and the next pass looks again).
UPDATE stepwarden_tasks SET
    input = CASE WHEN input = :old_input THEN :input ELSE input END,
    result = CASE WHEN result IS :old_result THEN :result ELSE result END,
    input_digest = CASE WHEN input = :old_input THEN :input_digest ELSE input_digest END
WHERE task_id = :task_id

-- name: reseal_steps
-- Steps after (`after`, `after_seq`) whose payloads may hold a secret (`stepwarden reseal`).
SELECT task_id, seq, input, result, compensation_input, heartbeat FROM stepwarden_steps
WHERE (task_id, seq) > (:after, :after_seq)
  AND (instr(input, '"$secret"') OR instr(input, '"$sealed"')
       OR instr(result, '"$secret"') OR instr(result, '"$sealed"')
       OR instr(compensation_input, '"$secret"') OR instr(compensation_input, '"$sealed"')
       OR instr(heartbeat, '"$secret"') OR instr(heartbeat, '"$sealed"'))
ORDER BY task_id, seq
LIMIT :limit

-- name: reseal_step
-- A step's payloads sealed anew, each where it is still the text read.
UPDATE stepwarden_steps SET
    input = CASE WHEN input = :old_input THEN :input ELSE input END,
    result = CASE WHEN result IS :old_result THEN :result ELSE result END,
    compensation_input = CASE WHEN compensation_input IS :old_comp THEN :comp
                              ELSE compensation_input END,
    heartbeat = CASE WHEN heartbeat IS :old_beat THEN :beat ELSE heartbeat END
WHERE task_id = :task_id AND seq = :seq

-- name: reseal_inbox_rows
-- Events sent (the inbox) after `after_id` whose payload may hold a secret (`stepwarden
-- reseal`).
SELECT id, task_id, event_id, payload AS doc FROM stepwarden_inbox
WHERE id > :after_id AND (instr(payload, '"$secret"') OR instr(payload, '"$sealed"'))
ORDER BY id
LIMIT :limit

-- name: reseal_wait_rows
-- Waits after (`after`, `after_seq`) whose payload (an event's, a child's result) may hold
-- a secret (`stepwarden reseal`).
SELECT task_id, seq, kind, name, event_id, payload AS doc FROM stepwarden_waits
WHERE (task_id, seq) > (:after, :after_seq)
  AND (instr(payload, '"$secret"') OR instr(payload, '"$sealed"'))
ORDER BY task_id, seq
LIMIT :limit

-- name: reseal_schedule_rows
-- Schedules after `after` whose input may hold a secret (`stepwarden reseal`).
SELECT name, input AS doc FROM stepwarden_schedules
WHERE name > :after AND (instr(input, '"$secret"') OR instr(input, '"$sealed"'))
ORDER BY name
LIMIT :limit

-- name: reseal_outbox_rows
-- Status messages after `after_id` whose detail may hold a secret (`stepwarden reseal`).
SELECT id, task_id, detail AS doc FROM stepwarden_outbox
WHERE id > :after_id AND (instr(detail, '"$secret"') OR instr(detail, '"$sealed"'))
ORDER BY id
LIMIT :limit

-- name: reseal_inbox
-- Events' payloads sealed anew, where still the text read.
UPDATE stepwarden_inbox SET payload = :doc WHERE id = :id AND payload = :old

-- name: reseal_waits
-- Waits' payloads sealed anew, where still the text read.
UPDATE stepwarden_waits SET payload = :doc WHERE task_id = :task_id AND seq = :seq AND payload = :old

-- name: reseal_schedules
-- Schedules' inputs sealed anew, where still the text read.
UPDATE stepwarden_schedules SET input = :doc WHERE name = :name AND input = :old

-- name: reseal_outbox
-- Status messages' details sealed anew, where still the text read.
UPDATE stepwarden_outbox SET detail = :doc WHERE id = :id AND detail = :old

-- name: why_task
-- A task, the store's clock, and how many tasks of its (workflow, version) are ahead of it in
-- the claim order (pending, or compensating and unheld, eligible now, ranked before it); for
-- a pending task, how many of its own tenant's are ahead of it, its tenant's weight, and the
-- weights of the tenants with pending tasks of its (workflow, version) eligible now, its own
-- among them, added up (`rules.fair_shares`): the facts of `rules.task_gate`, read through
-- the claim indexes.
SELECT t.*, :now AS now,
       (SELECT count(*) FROM stepwarden_tasks AS x
        WHERE x.process_state = 'pending' AND x.workflow = t.workflow
          AND x.version = t.version AND x.tenant = t.tenant AND x.eligible_at <= :now
          AND x.ranked_at < t.ranked_at) AS tenant_ahead,
       coalesce((SELECT n.weight FROM stepwarden_tenants AS n WHERE n.tenant = t.tenant), 1)
         AS tenant_weight,
       (SELECT sum(coalesce(n.weight, 1))
        FROM (SELECT DISTINCT x.tenant FROM stepwarden_tasks AS x
              WHERE x.process_state = 'pending' AND x.workflow = t.workflow
                AND x.version = t.version AND x.eligible_at <= :now
              UNION SELECT t.tenant) AS d
        LEFT JOIN stepwarden_tenants AS n ON n.tenant = d.tenant) AS weights,
       (SELECT count(*) FROM stepwarden_tasks AS x INDEXED BY stepwarden_tasks_pending
        WHERE x.process_state = 'pending' AND x.workflow = t.workflow
          AND x.version = t.version AND x.eligible_at <= :now AND x.ranked_at < t.ranked_at)
       + (SELECT count(*) FROM stepwarden_tasks AS x INDEXED BY stepwarden_tasks_compensate
          WHERE x.process_state = 'compensating' AND x.locked_by IS NULL
            AND x.workflow = t.workflow AND x.version = t.version AND x.eligible_at <= :now
            AND x.ranked_at < t.ranked_at) AS ahead
FROM stepwarden_tasks AS t WHERE t.task_id = :task_id

-- name: why_waits
-- A task's open waits (timers, events, children), each child's state beside its wait.
SELECT w.position, w.kind, w.name, w.wake_at, c.process_state AS child_state
FROM stepwarden_waits AS w
LEFT JOIN stepwarden_tasks AS c ON w.kind = 'child' AND c.task_id = w.name
WHERE w.task_id = :task_id AND w.state = 'open' AND w.kind IN ('timer', 'event', 'child')
ORDER BY w.seq

-- name: why_marks
-- The newest operator action that paused a task and its newest alert (kind, at, detail).
SELECT * FROM (
    SELECT kind, at, detail FROM stepwarden_events
    WHERE task_id = :task_id AND kind = 'operator'
      AND json_extract(detail, '$.action') = 'pause'
    ORDER BY id DESC LIMIT 1)
UNION ALL
SELECT * FROM (
    SELECT kind, at, detail FROM stepwarden_events
    WHERE task_id = :task_id AND kind = 'alert'
    ORDER BY id DESC LIMIT 1)

-- name: why_steps
-- A task's open steps, each with the store's clock and how many requests of its agent are
-- queued (in time) ahead of it.
SELECT s.*, :now AS now,
       (SELECT count(*) FROM stepwarden_steps AS q INDEXED BY stepwarden_steps_requests
        WHERE q.state = 'not_started' AND q.agent = s.agent AND q.ranked_at < s.ranked_at
          AND q.complete_by > :now) AS ahead
FROM stepwarden_steps AS s
WHERE s.task_id = :task_id AND s.state IN ('not_started', 'running')
ORDER BY s.seq

-- name: why_limit
-- What takes up an operation's limits for a limit key ('' for none): its running steps (the
-- first of their tasks, oldest claim first), and its starts within the rate's period `per`
-- with the oldest of them.
SELECT (SELECT count(*) FROM stepwarden_steps
        WHERE state = 'running' AND agent = :agent AND operation = :operation
          AND coalesce(limit_key, '') = :limit_key) AS running,
       (SELECT json_group_array(task_id) FROM (
            SELECT task_id FROM stepwarden_steps
            WHERE state = 'running' AND agent = :agent AND operation = :operation
              AND coalesce(limit_key, '') = :limit_key
            ORDER BY claimed_at, task_id LIMIT :tasks)) AS running_tasks,
       (SELECT count(*) FROM stepwarden_starts
        WHERE agent = :agent AND operation = :operation AND limit_key = :limit_key
          AND at > :now - :per) AS started,
       (SELECT min(at) FROM stepwarden_starts
        WHERE agent = :agent AND operation = :operation AND limit_key = :limit_key
          AND at > :now - :per) AS oldest_start

-- name: stale_tasks
-- The unfinished tasks of a workflow (not those waiting for an operator) that have not moved
-- for `after` seconds and raised no task_stuck alert since they last moved, the longest
-- unmoved first: what the supervisor looks at for the task_stuck alert.
SELECT t.task_id FROM stepwarden_tasks AS t
WHERE t.workflow = :workflow
  AND t.process_state IN ('pending', 'processing', 'waiting', 'paused', 'compensating')
  AND t.updated_at <= :now - :after
  AND NOT EXISTS (
      SELECT 1 FROM stepwarden_events AS e INDEXED BY stepwarden_events_task
      WHERE e.task_id = t.task_id AND e.kind = 'alert' AND e.at >= t.updated_at
        AND json_extract(e.detail, '$.reason') = 'task_stuck')
ORDER BY t.updated_at
LIMIT :limit

-- name: stuck_alerted
-- Whether the task raised a task_stuck alert for this reason that holds it.
SELECT count(*) AS n FROM stepwarden_events INDEXED BY stepwarden_events_task
WHERE task_id = :task_id AND kind = 'alert'
  AND json_extract(detail, '$.reason') = 'task_stuck'
  AND json_extract(detail, '$.wait_reason') = :wait_reason
