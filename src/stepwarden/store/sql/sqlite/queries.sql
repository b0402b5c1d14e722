-- name: insert_task
-- Record a pending task; an existing task_id is left untouched.
INSERT INTO stepwarden_tasks (task_id, workflow, input, priority, complete_within, max_failures,
                              on_failure, reply_to, eligible_at, created_at, updated_at)
VALUES (:task_id, :workflow, :input, :priority, :complete_within, :max_failures, :on_failure,
        :reply_to, :now, :now, :now)
ON CONFLICT (task_id) DO NOTHING

-- name: any_pending
-- A cheap read before taking the write lock.
SELECT 1 FROM stepwarden_tasks
WHERE process_state = 'pending' AND eligible_at <= :now
  AND workflow IN (SELECT value FROM json_each(:workflows))
UNION ALL
SELECT 1 FROM stepwarden_tasks
WHERE process_state = 'compensating' AND locked_by IS NULL AND eligible_at <= :now
  AND workflow IN (SELECT value FROM json_each(:workflows))
LIMIT 1

-- name: claim_tasks
-- Claim eligible tasks by priority then age, a new attempt each: pending -> processing, and
-- compensating tasks no scheduler holds.
UPDATE stepwarden_tasks
SET locked_by = :scheduler, attempt = attempt + 1,
    process_state = CASE process_state WHEN 'pending' THEN 'processing' ELSE process_state END,
    complete_by = :now + complete_within, updated_at = :now
WHERE task_id IN (
    SELECT task_id FROM (
        SELECT task_id, priority, created_at FROM stepwarden_tasks
        WHERE process_state = 'pending' AND eligible_at <= :now
          AND workflow IN (SELECT value FROM json_each(:workflows))
        UNION ALL
        SELECT task_id, priority, created_at FROM stepwarden_tasks
        WHERE process_state = 'compensating' AND locked_by IS NULL AND eligible_at <= :now
          AND workflow IN (SELECT value FROM json_each(:workflows)))
    ORDER BY priority DESC, created_at
    LIMIT :limit)
  AND (process_state = 'pending' OR (process_state = 'compensating' AND locked_by IS NULL))
RETURNING *

-- name: steps_of_tasks
SELECT * FROM stepwarden_steps
WHERE task_id IN (SELECT value FROM json_each(:task_ids))
ORDER BY task_id, seq

-- name: dispatch_new
-- Record a step and queue its request, only while the task is held under this attempt.
-- The step's complete_by never passes the task's.
INSERT INTO stepwarden_steps (task_id, seq, name, agent, operation, state, attempt, task_attempt,
                              priority, complete_by, idempotency_key, input, created_at,
                              dispatched_at, compensation, compensation_input, compensates,
                              complete_within, pickup_within, give_up_by, limit_key)
SELECT :task_id, :seq, :name, :agent, :operation, 'not_started', 1, :task_attempt, :priority,
       MIN(:now + :complete_within, t.complete_by, coalesce(:now + :total_within, 1e300)),
       :idempotency_key, :input, :now, :now, :compensation, :compensation_input, :compensates,
       :complete_within, :pickup_within, :now + :total_within, :limit_key
FROM stepwarden_tasks t
WHERE t.task_id = :task_id AND t.attempt = :task_attempt AND t.locked_by = :scheduler
  AND t.process_state IN ('processing', 'compensating')
ON CONFLICT (task_id, seq) DO NOTHING
RETURNING attempt, complete_by

-- name: dispatch_again
-- Re-dispatch an expired step: a new attempt, the same idempotency key.
UPDATE stepwarden_steps
SET state = 'not_started', attempt = attempt + 1, task_attempt = :task_attempt,
    locked_by = NULL, claimed_at = NULL, dispatched_at = :now, complete_within = :complete_within,
    complete_by = MIN(:now + :complete_within,
                      (SELECT complete_by FROM stepwarden_tasks WHERE task_id = :task_id),
                      coalesce(give_up_by, 1e300))
WHERE task_id = :task_id AND seq = :seq AND attempt = :expected_attempt
  AND state IN ('not_started', 'running')
  AND EXISTS (SELECT 1 FROM stepwarden_tasks t
              WHERE t.task_id = :task_id AND t.attempt = :task_attempt AND t.locked_by = :scheduler
                AND t.process_state IN ('processing', 'compensating'))
RETURNING attempt, complete_by

-- name: dispatch_adopt
-- Take over a step an earlier attempt of the task dispatched, while it is still in time.
UPDATE stepwarden_steps
SET task_attempt = :task_attempt
WHERE task_id = :task_id AND seq = :seq AND attempt = :expected_attempt
  AND state IN ('not_started', 'running') AND complete_by > :now
  AND EXISTS (SELECT 1 FROM stepwarden_tasks t
              WHERE t.task_id = :task_id AND t.attempt = :task_attempt AND t.locked_by = :scheduler
                AND t.process_state IN ('processing', 'compensating'))
RETURNING attempt, complete_by

-- name: finished_steps
SELECT * FROM stepwarden_steps
WHERE (task_id, seq) IN (SELECT json_extract(value, '$[0]'), json_extract(value, '$[1]')
                         FROM json_each(:keys))
  AND state IN ('completed', 'failed')

-- name: finish_task
-- End the hold of a task, only under the attempt and scheduler that hold it in :held_as.
-- An error becomes compensating (unless on_failure is 'stop'), eligible once the open steps'
-- complete_by has passed: an agent still calling may yet apply its effect until then.
UPDATE stepwarden_tasks
SET process_state = CASE WHEN :state = 'error' AND :compensable AND on_failure <> 'stop'
                         THEN 'compensating' ELSE :state END,
    result = :result, error = :error, locked_by = NULL, complete_by = NULL, updated_at = :now,
    failure_count = CASE WHEN :state = 'error' AND :compensable AND on_failure <> 'stop'
                         THEN 0 ELSE failure_count END,
    eligible_at = MAX(:now, coalesce((SELECT max(complete_by) FROM stepwarden_steps s
                                      WHERE s.task_id = :task_id
                                        AND s.state IN ('not_started', 'running')), 0)),
    finished_at = CASE WHEN :state = 'error' AND :compensable AND on_failure <> 'stop'
                       THEN NULL ELSE :now END
WHERE task_id = :task_id AND attempt = :attempt AND locked_by = :scheduler
  AND process_state = :held_as
RETURNING process_state

-- name: close_open_steps
-- A finished task leaves no request behind: its open steps are closed, so no agent claims them
-- and a late answer to one changes nothing.
UPDATE stepwarden_steps
SET state = 'failed', error = :error, locked_by = NULL, finished_at = :now
WHERE task_id = :task_id AND state IN ('not_started', 'running')

-- name: compensable
-- Whether a task has a step to undo: one with a compensation that took effect or may have
-- (completed, open, or abandoned while open).
SELECT EXISTS (
    SELECT 1 FROM stepwarden_steps
    WHERE task_id = :task_id AND compensation IS NOT NULL AND compensates IS NULL
      AND (state IN ('completed', 'not_started', 'running')
           OR (state = 'failed' AND error LIKE 'abandoned:%'))) AS compensable

-- name: any_request
SELECT 1 FROM stepwarden_steps
WHERE state = 'not_started' AND agent = :agent AND complete_by > :now
  AND operation IN (SELECT value FROM json_each(:operations))
  AND (pickup_within IS NULL OR dispatched_at + pickup_within > :now)
LIMIT 1

-- name: claim_requests
-- Claim queued requests in time: not_started -> running, locked_by the agent instance.
UPDATE stepwarden_steps
SET state = 'running', locked_by = :instance, claimed_at = :now
WHERE (task_id, seq) IN (
    SELECT task_id, seq FROM stepwarden_steps
    WHERE state = 'not_started' AND agent = :agent AND complete_by > :now
      AND operation IN (SELECT value FROM json_each(:operations))
      AND (pickup_within IS NULL OR dispatched_at + pickup_within > :now)
    ORDER BY priority DESC, dispatched_at
    LIMIT :limit)
  AND state = 'not_started'
RETURNING task_id, seq, attempt, agent, operation, input, idempotency_key, complete_by,
          compensates, priority, dispatched_at

-- name: limited_candidates
-- Queued requests of an agent in claim order, for a claim within the operations' limits.
SELECT task_id, seq, operation, limit_key FROM stepwarden_steps
WHERE state = 'not_started' AND agent = :agent AND complete_by > :now
  AND operation IN (SELECT value FROM json_each(:operations))
  AND (pickup_within IS NULL OR dispatched_at + pickup_within > :now)
ORDER BY priority DESC, dispatched_at
LIMIT :scan

-- name: running_counts
-- Steps running now, by operation and limit key ('' for none).
SELECT operation, coalesce(limit_key, '') AS limit_key, count(*) AS n FROM stepwarden_steps
WHERE state = 'running' AND agent = :agent
  AND operation IN (SELECT value FROM json_each(:operations))
GROUP BY operation, coalesce(limit_key, '')

-- name: start_counts
-- Starts of one rate-limited operation within its period, by limit key.
SELECT limit_key, count(*) AS n FROM stepwarden_starts
WHERE agent = :agent AND operation = :operation AND at > :since
GROUP BY limit_key

-- name: forget_starts
DELETE FROM stepwarden_starts WHERE agent = :agent AND operation = :operation AND at <= :since

-- name: record_start
INSERT INTO stepwarden_starts (agent, operation, limit_key, at)
VALUES (:agent, :operation, :limit_key, :now)

-- name: claim_one
UPDATE stepwarden_steps
SET state = 'running', locked_by = :instance, claimed_at = :now
WHERE task_id = :task_id AND seq = :seq AND state = 'not_started'
RETURNING task_id, seq, attempt, agent, operation, input, idempotency_key, complete_by,
          compensates, priority, dispatched_at, limit_key

-- name: complete_step
-- running -> completed | failed, only for the current attempt, its agent, before complete_by.
UPDATE stepwarden_steps
SET state = :state, result = :result, error = :error, tries = :tries, finished_at = :now
WHERE task_id = :task_id AND seq = :seq AND attempt = :attempt AND state = 'running'
  AND locked_by = :instance AND complete_by > :now

-- name: insert_event
INSERT INTO stepwarden_events (task_id, at, kind, detail) VALUES (:task_id, :now, :kind, :detail)

-- name: get_lease
SELECT holder, term, expires_at FROM stepwarden_leases WHERE name = :name

-- name: put_lease
INSERT INTO stepwarden_leases (name, holder, term, expires_at, renewed_at)
VALUES (:name, :holder, :term, :expires_at, :now)
ON CONFLICT (name) DO UPDATE
SET holder = excluded.holder, term = excluded.term, expires_at = excluded.expires_at,
    renewed_at = excluded.renewed_at

-- name: release_lease
UPDATE stepwarden_leases SET expires_at = 0 WHERE name = :name AND holder = :holder

-- name: holds_lease
SELECT 1 FROM stepwarden_leases
WHERE name = :name AND holder = :holder AND term = :term AND expires_at > :now

-- name: expired_tasks
SELECT task_id, attempt, failure_count, max_failures, process_state, on_failure, NULL AS seq
FROM stepwarden_tasks INDEXED BY stepwarden_tasks_expiry
WHERE complete_by < :now AND process_state IN ('processing', 'compensating')
ORDER BY complete_by
LIMIT :limit

-- name: expired_steps
-- Open steps of the current attempt of held tasks whose complete_by passed. (A task the
-- sweep released, or an operator's retry reopened, is held again only once claimed.)
SELECT t.task_id, t.attempt, t.failure_count, t.max_failures, t.process_state, t.on_failure,
       s.seq
FROM stepwarden_steps s INDEXED BY stepwarden_steps_expiry
JOIN stepwarden_tasks t ON t.task_id = s.task_id
WHERE s.state IN ('not_started', 'running') AND s.complete_by < :now
  AND t.process_state IN ('processing', 'compensating') AND t.locked_by IS NOT NULL
  AND s.task_attempt = t.attempt
ORDER BY s.complete_by
LIMIT :limit

-- name: reset_task
-- The supervisor's recovery of an expired task into :state (worked out by the caller from
-- the row it read in this transaction), fenced by the attempt and state it read. When the
-- open steps are to be abandoned (:wait_open), the task waits for their complete_by too: an
-- agent still calling may yet apply its effect until then.
UPDATE stepwarden_tasks
SET failure_count = :failure_count, locked_by = NULL, complete_by = NULL,
    process_state = :state, error = coalesce(:error, error),
    finished_at = :finished_at, updated_at = :now,
    eligible_at = CASE WHEN :wait_open
                       THEN MAX(:eligible_at,
                                coalesce((SELECT max(s.complete_by) FROM stepwarden_steps s
                                          WHERE s.task_id = :task_id
                                            AND s.state IN ('not_started', 'running')), 0))
                       ELSE :eligible_at END
WHERE task_id = :task_id AND attempt = :attempt AND process_state = :held_as
  AND locked_by IS NOT NULL
RETURNING failure_count, process_state

-- name: get_task
SELECT * FROM stepwarden_tasks WHERE task_id = :task_id

-- name: get_steps
SELECT * FROM stepwarden_steps WHERE task_id = :task_id ORDER BY seq

-- name: count_tasks
SELECT process_state, count(*) AS n FROM stepwarden_tasks GROUP BY process_state

-- name: op_read_task
-- An operator action reads the task it acts on (under the write lock).
SELECT process_state, attempt FROM stepwarden_tasks WHERE task_id = :task_id

-- name: op_move_task
-- An operator action moves the task from the state and attempt it read. Releasing a held task
-- fences out its scheduler; a compensation waits for the open steps' complete_by.
UPDATE stepwarden_tasks
SET process_state = :to, locked_by = NULL, complete_by = NULL,
    failure_count = CASE WHEN :reset_failures THEN 0 ELSE failure_count END,
    eligible_at = CASE WHEN :wait_open
                       THEN MAX(:now, coalesce((SELECT max(s.complete_by) FROM stepwarden_steps s
                                                WHERE s.task_id = :task_id
                                                  AND s.state IN ('not_started', 'running')),
                                               0))
                       ELSE :now END,
    finished_at = CASE WHEN :final THEN :now ELSE NULL END, updated_at = :now
WHERE task_id = :task_id AND process_state = :from AND attempt = :attempt

-- name: op_reopen_steps
-- Resubmission: the failed steps (of the forward path, or the compensations) are open again,
-- already past complete_by, so that the scheduler taking the task up re-dispatches each under
-- a new attempt and the same idempotency key, and no agent claims them before.
UPDATE stepwarden_steps
SET state = 'not_started', complete_by = :now, locked_by = NULL, error = NULL,
    finished_at = NULL
WHERE task_id = :task_id AND state = 'failed'
  AND ((:compensations AND compensates IS NOT NULL) OR (NOT :compensations AND compensates IS NULL))
RETURNING seq

-- name: op_skip_step
-- Mark a step that is not completed as completed with the operator's result.
UPDATE stepwarden_steps
SET state = 'completed', result = :result, error = NULL, locked_by = NULL, finished_at = :now
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
WHERE next_at <= :now
ORDER BY next_at, id
LIMIT :limit

-- name: outbox_delivered
-- Record a delivery round of one alert: the sinks reached so far; done, or due again later.
UPDATE stepwarden_outbox
SET delivered_to = :delivered_to, attempts = attempts + 1,
    next_at = CASE WHEN :done THEN NULL ELSE :now + :retry_in END,
    delivered_at = CASE WHEN :done THEN :now END
WHERE id = :id AND next_at IS NOT NULL

-- name: purge_pick
-- Finished tasks (processed, compensated, cancelled) older than the retention, oldest first.
SELECT task_id FROM stepwarden_tasks INDEXED BY stepwarden_tasks_finished
WHERE finished_at < :before AND process_state IN ('processed', 'compensated', 'cancelled')
ORDER BY finished_at
LIMIT :limit

-- name: purge_events
DELETE FROM stepwarden_events WHERE task_id IN (SELECT value FROM json_each(:task_ids))

-- name: purge_outbox
DELETE FROM stepwarden_outbox WHERE task_id IN (SELECT value FROM json_each(:task_ids))
  AND next_at IS NULL

-- name: purge_tasks
-- Their steps go with them (ON DELETE CASCADE).
DELETE FROM stepwarden_tasks WHERE task_id IN (SELECT value FROM json_each(:task_ids))

-- name: read_step
SELECT * FROM stepwarden_steps WHERE task_id = :task_id AND seq = :seq

-- name: hand_back
-- A claimed request back in the queue, untried here, fenced like an outcome.
UPDATE stepwarden_steps
SET state = 'not_started', locked_by = NULL, claimed_at = NULL,
    reassignments = reassignments + 1
WHERE task_id = :task_id AND seq = :seq AND attempt = :attempt AND state = 'running'
  AND locked_by = :instance AND complete_by > :now
RETURNING agent

-- name: heartbeat_step
-- Extend a running step's complete_by by its complete_within from now: never shorter than
-- it is, never past its task's complete_by nor its total timeout.
UPDATE stepwarden_steps
SET heartbeat = :detail, heartbeat_at = :now,
    complete_by = MAX(complete_by,
                      MIN(:now + coalesce(complete_within, complete_by - dispatched_at),
                          coalesce((SELECT t.complete_by FROM stepwarden_tasks t
                                    WHERE t.task_id = :task_id), complete_by),
                          coalesce(give_up_by, 1e300)))
WHERE task_id = :task_id AND seq = :seq AND attempt = :attempt AND state = 'running'
  AND locked_by = :instance AND complete_by > :now
RETURNING complete_by

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
-- to queue a step, or waiting for one) or the steps queued or running in time, the more.
SELECT (SELECT sum(capacity) FROM stepwarden_agents WHERE expires_at > :now) AS capacity,
       MAX((SELECT count(*) FROM stepwarden_tasks INDEXED BY stepwarden_tasks_expiry
            WHERE complete_by IS NOT NULL),
           (SELECT count(*) FROM stepwarden_steps INDEXED BY stepwarden_steps_expiry
            WHERE state IN ('not_started', 'running') AND complete_by > :now)) AS open

-- name: list_agents
SELECT *, expires_at > :now AS alive FROM stepwarden_agents ORDER BY agent, started_at, instance

-- name: gone_holders
-- Running steps of the current attempt of held tasks whose agent instance is gone.
SELECT s.task_id, s.seq, s.attempt, s.agent, s.locked_by, t.attempt AS task_attempt
FROM stepwarden_steps s INDEXED BY stepwarden_steps_holder
JOIN stepwarden_tasks t ON t.task_id = s.task_id
WHERE s.state = 'running' AND s.task_attempt = t.attempt AND t.locked_by IS NOT NULL
  AND t.process_state IN ('processing', 'compensating') AND s.complete_by > :now
  AND NOT EXISTS (SELECT 1 FROM stepwarden_agents a
                  WHERE a.instance = s.locked_by AND a.agent = s.agent AND a.expires_at > :now)
LIMIT :limit

-- name: reassign_step
-- Queue the step again for another instance: a new attempt with a full complete_by of its
-- own (its task is released with it, and takes a new complete_by when claimed again).
UPDATE stepwarden_steps
SET state = 'not_started', attempt = attempt + 1, reassignments = reassignments + 1,
    locked_by = NULL, claimed_at = NULL, dispatched_at = :now,
    complete_by = MIN(:now + coalesce(complete_within, complete_by - dispatched_at),
                      coalesce(give_up_by, 1e300))
WHERE task_id = :task_id AND seq = :seq AND attempt = :attempt AND state = 'running'
  AND locked_by = :instance
RETURNING attempt

-- name: release_reassigned
-- The task of a reassigned step is released too, failure_count unchanged, for a scheduler to
-- take up again at once (it adopts the step): its own scheduler may be gone with the agent.
UPDATE stepwarden_tasks
SET locked_by = NULL, complete_by = NULL, eligible_at = :now, updated_at = :now,
    process_state = CASE process_state WHEN 'processing' THEN 'pending' ELSE process_state END
WHERE task_id = :task_id AND attempt = :task_attempt AND locked_by IS NOT NULL
  AND process_state IN ('processing', 'compensating')

-- name: pickup_expired
SELECT task_id, seq, attempt, agent, locked_by, pickup_within FROM stepwarden_steps
WHERE state = 'not_started' AND pickup_within IS NOT NULL
  AND dispatched_at + pickup_within < :now
LIMIT :limit

-- name: give_up_expired
SELECT task_id, seq, attempt, agent, locked_by, state, give_up_by - created_at AS total
FROM stepwarden_steps
WHERE state IN ('not_started', 'running') AND give_up_by IS NOT NULL AND give_up_by < :now
LIMIT :limit

-- name: fail_step
UPDATE stepwarden_steps
SET state = 'failed', error = :error, locked_by = NULL, finished_at = :now
WHERE task_id = :task_id AND seq = :seq AND attempt = :attempt AND state = :state

-- name: forget_agents
DELETE FROM stepwarden_agents WHERE expires_at < :before

-- name: find_tasks
-- The dashboard (to the end of this file): read-only queries of the operator's dashboard
-- and its metrics.
-- Tasks newest first, optionally of one state and one workflow, whose id contains :search.
SELECT * FROM stepwarden_tasks
WHERE (:state IS NULL OR process_state = :state)
  AND (:workflow IS NULL OR workflow = :workflow)
  AND (:search IS NULL OR instr(task_id, :search) > 0)
ORDER BY created_at DESC, task_id DESC
LIMIT :limit

-- name: workflow_names
SELECT DISTINCT workflow FROM stepwarden_tasks ORDER BY workflow

-- name: newest_outbox
SELECT * FROM stepwarden_outbox WHERE channel = :channel ORDER BY id DESC LIMIT :limit

-- name: oldest_pending
SELECT min(created_at) AS oldest FROM stepwarden_tasks WHERE process_state = 'pending'

-- name: read_lease
SELECT name, holder, term, expires_at, renewed_at FROM stepwarden_leases WHERE name = :name

-- name: activity
-- Tasks processed and step failures per :bucket seconds since :since, by bucket number.
SELECT b, sum(processed) AS processed, sum(failed) AS failed FROM (
    SELECT CAST(finished_at / :bucket AS INTEGER) AS b, 1 AS processed, 0 AS failed
    FROM stepwarden_tasks
    WHERE finished_at >= :since AND process_state = 'processed'
    UNION ALL
    SELECT CAST(at / :bucket AS INTEGER), 0, 1
    FROM stepwarden_events
    WHERE kind IN ('step_failed', 'expired') AND at >= :since
)
GROUP BY b ORDER BY b

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
