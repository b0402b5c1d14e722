-- Priorities age (rules.head_start): claims take the eligible work of least `ranked_at`, its
-- submit (a task) or dispatch (a step) time less its priority's head start, one second a
-- level within ±3,600 s, written with each row; so a task of low priority is delayed by
-- higher ones, never starved. The claim indexes order by (workflow, version, ranked_at) and
-- (agent, ranked_at). The rows written before are ranked here by the same rule.
ALTER TABLE stepwarden_tasks ADD COLUMN ranked_at timestamptz NOT NULL DEFAULT now();
UPDATE stepwarden_tasks
SET ranked_at = created_at - make_interval(secs => LEAST(GREATEST(priority, -3600), 3600));
DROP INDEX stepwarden_tasks_pending;
CREATE INDEX stepwarden_tasks_pending ON stepwarden_tasks (workflow, version, ranked_at)
    WHERE process_state = 'pending';
DROP INDEX stepwarden_tasks_compensate;
CREATE INDEX stepwarden_tasks_compensate ON stepwarden_tasks (workflow, version, ranked_at)
    WHERE process_state = 'compensating' AND locked_by IS NULL;
ALTER TABLE stepwarden_steps ADD COLUMN ranked_at timestamptz NOT NULL DEFAULT now();
UPDATE stepwarden_steps
SET ranked_at = dispatched_at - make_interval(secs => LEAST(GREATEST(priority, -3600), 3600));
DROP INDEX stepwarden_steps_requests;
CREATE INDEX stepwarden_steps_requests ON stepwarden_steps (agent, ranked_at)
    WHERE state = 'not_started';
