-- Status messages for a broker: a task whose reply_to names one (amqp://, nats://, redis://:
-- `relay.SCHEMES`) has its status messages written due (next_at), and the supervisor
-- leader's relay delivers them in id order per task, recording each delivery once the broker
-- acknowledged it; a failed one is due again later (next_at), with its error.
ALTER TABLE stepwarden_outbox ADD COLUMN error TEXT;
-- The relay's messages not yet delivered, by task (alerts have their own index, by next_at).
CREATE INDEX stepwarden_outbox_relay ON stepwarden_outbox (task_id, id)
    WHERE next_at IS NOT NULL AND channel <> 'alerts';

-- A status message is due at once when its channel is a broker destination.
CREATE TRIGGER stepwarden_outbox_relayed AFTER INSERT ON stepwarden_outbox
WHEN NEW.next_at IS NULL AND (NEW.channel LIKE 'amqp://%' OR NEW.channel LIKE 'nats://%'
                              OR NEW.channel LIKE 'redis://%')
BEGIN
    UPDATE stepwarden_outbox SET next_at = NEW.at WHERE id = NEW.id;
END;
