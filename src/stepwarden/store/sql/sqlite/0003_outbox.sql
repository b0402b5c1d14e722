-- The outbox: alerts for the operator's sinks and status messages for the applications'
-- reply channels, written by triggers in the transaction that makes the change, so that none
-- is lost and none is written for a change that did not commit.
CREATE TABLE stepwarden_outbox (
    id           INTEGER PRIMARY KEY AUTOINCREMENT,
    channel      TEXT NOT NULL,
    task_id      TEXT,
    kind         TEXT NOT NULL,
    detail       TEXT NOT NULL,
    at           REAL NOT NULL,
    attempts     INTEGER NOT NULL DEFAULT 0,
    next_at      REAL,
    delivered_to TEXT NOT NULL DEFAULT '[]',
    delivered_at REAL
);
-- Alerts not yet delivered to every sink (next_at is cleared once they are).
CREATE INDEX stepwarden_outbox_due ON stepwarden_outbox (next_at) WHERE next_at IS NOT NULL;
CREATE INDEX stepwarden_outbox_channel ON stepwarden_outbox (channel, id);
CREATE INDEX stepwarden_outbox_task ON stepwarden_outbox (task_id, id);
-- Retention: finished tasks by age.
CREATE INDEX stepwarden_tasks_finished ON stepwarden_tasks (finished_at)
    WHERE finished_at IS NOT NULL;

CREATE TRIGGER stepwarden_outbox_alert AFTER INSERT ON stepwarden_events
WHEN NEW.kind = 'alert'
BEGIN
    INSERT INTO stepwarden_outbox (channel, task_id, kind, detail, at, next_at)
    VALUES ('alerts', NEW.task_id, 'alert', NEW.detail, NEW.at, NEW.at);
END;

CREATE TRIGGER stepwarden_outbox_received AFTER INSERT ON stepwarden_tasks
WHEN NEW.reply_to IS NOT NULL
BEGIN
    INSERT INTO stepwarden_outbox (channel, task_id, kind, detail, at)
    VALUES (NEW.reply_to, NEW.task_id, 'received',
            json_object('task_id', NEW.task_id, 'workflow', NEW.workflow), NEW.created_at);
END;

CREATE TRIGGER stepwarden_outbox_state AFTER UPDATE OF process_state ON stepwarden_tasks
WHEN NEW.reply_to IS NOT NULL AND NEW.process_state <> OLD.process_state
     AND NEW.process_state NOT IN ('pending', 'processing')
BEGIN
    INSERT INTO stepwarden_outbox (channel, task_id, kind, detail, at)
    VALUES (NEW.reply_to, NEW.task_id, NEW.process_state,
            json_object('task_id', NEW.task_id, 'state', NEW.process_state,
                        'result', json(NEW.result), 'error', NEW.error),
            NEW.updated_at);
END;

CREATE TRIGGER stepwarden_outbox_step AFTER UPDATE OF state ON stepwarden_steps
WHEN NEW.state = 'completed' AND OLD.state <> 'completed'
BEGIN
    INSERT INTO stepwarden_outbox (channel, task_id, kind, detail, at)
    SELECT t.reply_to, NEW.task_id, 'step_completed',
           json_object('task_id', NEW.task_id, 'seq', NEW.seq, 'name', NEW.name,
                       'compensates', NEW.compensates),
           coalesce(NEW.finished_at, t.updated_at)
    FROM stepwarden_tasks t
    WHERE t.task_id = NEW.task_id AND t.reply_to IS NOT NULL;
END;
