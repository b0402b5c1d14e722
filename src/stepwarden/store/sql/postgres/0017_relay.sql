-- Status messages for a broker: a task whose reply_to names one (amqp://, nats://, redis://:
-- `relay.SCHEMES`) has its status messages written due (next_at), and the supervisor
-- leader's relay delivers them in id order per task, recording each delivery once the broker
-- acknowledged it; a failed one is due again later (next_at), with its error.
ALTER TABLE stepwarden_outbox ADD COLUMN error text;
-- The relay's messages not yet delivered, by task (alerts have their own index, by next_at).
CREATE INDEX stepwarden_outbox_relay ON stepwarden_outbox (task_id, id)
    WHERE next_at IS NOT NULL AND channel <> 'alerts';

CREATE OR REPLACE FUNCTION stepwarden_outbox_put(p_channel text, p_task text, p_kind text,
                                                 p_detail json, p_due boolean)
RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO stepwarden_outbox (channel, task_id, kind, detail, next_at)
    VALUES (p_channel, p_task, p_kind, p_detail,
            CASE WHEN p_due OR p_channel ~ '^(amqp|nats|redis)://' THEN now() END);
    PERFORM pg_notify('stepwarden_outbox', left(p_channel, 7000));
END $$;
