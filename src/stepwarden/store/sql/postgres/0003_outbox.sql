-- The outbox: alerts for the operator's sinks and status messages for the applications'
-- reply channels, written by triggers in the transaction that makes the change, so that none
-- is lost and none is written for a change that did not commit. Each row also notifies
-- `stepwarden_outbox` (delivered on commit) with its channel.
CREATE TABLE stepwarden_outbox (
    id           bigserial PRIMARY KEY,
    channel      text NOT NULL,
    task_id      text,
    kind         text NOT NULL,
    detail       json NOT NULL,
    at           timestamptz NOT NULL DEFAULT now(),
    attempts     integer NOT NULL DEFAULT 0,
    next_at      timestamptz,
    delivered_to json NOT NULL DEFAULT '[]',
    delivered_at timestamptz
);
-- Alerts not yet delivered to every sink (next_at is cleared once they are).
CREATE INDEX stepwarden_outbox_due ON stepwarden_outbox (next_at) WHERE next_at IS NOT NULL;
CREATE INDEX stepwarden_outbox_channel ON stepwarden_outbox (channel, id);
CREATE INDEX stepwarden_outbox_task ON stepwarden_outbox (task_id, id);
-- Retention: finished tasks by age.
CREATE INDEX stepwarden_tasks_finished ON stepwarden_tasks (finished_at)
    WHERE finished_at IS NOT NULL;

CREATE FUNCTION stepwarden_outbox_put(p_channel text, p_task text, p_kind text, p_detail json,
                                      p_due boolean) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO stepwarden_outbox (channel, task_id, kind, detail, next_at)
    VALUES (p_channel, p_task, p_kind, p_detail, CASE WHEN p_due THEN now() END);
    PERFORM pg_notify('stepwarden_outbox', left(p_channel, 7000));
END $$;

CREATE FUNCTION stepwarden_outbox_alert() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM stepwarden_outbox_put('alerts', NEW.task_id, 'alert', NEW.detail, true);
    RETURN NULL;
END $$;
CREATE TRIGGER stepwarden_outbox_alert AFTER INSERT ON stepwarden_events
FOR EACH ROW WHEN (NEW.kind = 'alert') EXECUTE FUNCTION stepwarden_outbox_alert();

CREATE FUNCTION stepwarden_outbox_received() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM stepwarden_outbox_put(NEW.reply_to, NEW.task_id, 'received',
        json_build_object('task_id', NEW.task_id, 'workflow', NEW.workflow), false);
    RETURN NULL;
END $$;
CREATE TRIGGER stepwarden_outbox_received AFTER INSERT ON stepwarden_tasks
FOR EACH ROW WHEN (NEW.reply_to IS NOT NULL) EXECUTE FUNCTION stepwarden_outbox_received();

CREATE FUNCTION stepwarden_outbox_state() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM stepwarden_outbox_put(NEW.reply_to, NEW.task_id, NEW.process_state,
        json_build_object('task_id', NEW.task_id, 'state', NEW.process_state,
                          'result', NEW.result, 'error', NEW.error), false);
    RETURN NULL;
END $$;
CREATE TRIGGER stepwarden_outbox_state AFTER UPDATE OF process_state ON stepwarden_tasks
FOR EACH ROW WHEN (NEW.reply_to IS NOT NULL AND NEW.process_state <> OLD.process_state
                   AND NEW.process_state NOT IN ('pending', 'processing'))
EXECUTE FUNCTION stepwarden_outbox_state();

CREATE FUNCTION stepwarden_outbox_step() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    channel text;
BEGIN
    SELECT reply_to INTO channel FROM stepwarden_tasks WHERE task_id = NEW.task_id;
    IF channel IS NOT NULL THEN
        PERFORM stepwarden_outbox_put(channel, NEW.task_id, 'step_completed',
            json_build_object('task_id', NEW.task_id, 'seq', NEW.seq, 'name', NEW.name,
                              'compensates', NEW.compensates), false);
    END IF;
    RETURN NULL;
END $$;
CREATE TRIGGER stepwarden_outbox_step AFTER UPDATE OF state ON stepwarden_steps
FOR EACH ROW WHEN (NEW.state = 'completed' AND OLD.state <> 'completed')
EXECUTE FUNCTION stepwarden_outbox_step();
