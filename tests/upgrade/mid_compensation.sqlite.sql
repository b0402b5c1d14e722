BEGIN TRANSACTION;
CREATE TABLE stepwarden_agents (
    instance     TEXT NOT NULL,
    agent        TEXT NOT NULL,
    operations   TEXT NOT NULL,
    capacity     INTEGER NOT NULL,
    inflight     INTEGER NOT NULL DEFAULT 0,
    breaker      TEXT NOT NULL DEFAULT 'closed',
    breaker_detail TEXT NOT NULL DEFAULT '{}',
    started_at   REAL NOT NULL,
    heartbeat_at REAL NOT NULL,
    expires_at   REAL NOT NULL,
    PRIMARY KEY (instance, agent)
);
INSERT INTO "stepwarden_agents" VALUES('agent-b72d3a285bf74c0f','inventory','["release","reserve"]',100,0,'closed','{}',1.79574288999129819868e+09,1.79574288999129819868e+09,1.79574289499129819865e+09);
INSERT INTO "stepwarden_agents" VALUES('agent-b72d3a285bf74c0f','payments','["charge","refund"]',100,0,'closed','{}',1.79574288999191856381e+09,1.79574288999191856381e+09,1.79574289499191856386e+09);
INSERT INTO "stepwarden_agents" VALUES('agent-b72d3a285bf74c0f','shipping','["ship"]',100,0,'closed','{}',1.79574288999244856832e+09,1.79574288999244856832e+09,1.79574289499244856829e+09);
CREATE TABLE stepwarden_awaited (
    task_id TEXT PRIMARY KEY
);
CREATE TABLE stepwarden_events (
    id      INTEGER PRIMARY KEY AUTOINCREMENT,
    task_id TEXT,
    at      REAL NOT NULL,
    kind    TEXT NOT NULL,
    detail  TEXT NOT NULL
);
INSERT INTO "stepwarden_events" VALUES(1,'o1',1.79574289001622986795e+09,'step_failed','{"seq":3,"attempt":1,"error":"PermanentError: no courier"}');
INSERT INTO "stepwarden_events" VALUES(2,'o1',1.79574289001622986795e+09,'alert','{"reason":"task_error","error":"step ''shipping.ship'' failed: PermanentError: no courier","then":"compensating"}');
CREATE TABLE stepwarden_inbox (
    id         INTEGER PRIMARY KEY AUTOINCREMENT,
    task_id    TEXT NOT NULL REFERENCES stepwarden_tasks (task_id) ON DELETE CASCADE,
    event_id   TEXT NOT NULL,
    name       TEXT NOT NULL,
    payload    TEXT NOT NULL,
    sent_at    REAL NOT NULL,
    taken_by   INTEGER,
    UNIQUE (task_id, event_id)
);
CREATE TABLE stepwarden_leases (
    name       TEXT PRIMARY KEY,
    holder     TEXT NOT NULL,
    term       INTEGER NOT NULL,
    expires_at REAL NOT NULL
, renewed_at REAL);
INSERT INTO "stepwarden_leases" VALUES('supervisor','supervisor-b72d3a285bf74c0f',1,1.79574289521677947045e+09,1.79574289021677947048e+09);
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
INSERT INTO "stepwarden_outbox" VALUES(1,'alerts','o1','alert','{"reason":"task_error","error":"step ''shipping.ship'' failed: PermanentError: no courier","then":"compensating"}',1.79574289001622986795e+09,1,NULL,'["log"]',1.79574289019477844244e+09);
CREATE TABLE stepwarden_schedulers (
    instance     TEXT PRIMARY KEY,
    workflows    TEXT NOT NULL,
    capacity     INTEGER NOT NULL,
    held         INTEGER NOT NULL DEFAULT 0,
    started_at   REAL NOT NULL,
    heartbeat_at REAL NOT NULL,
    expires_at   REAL NOT NULL
, versions TEXT NOT NULL DEFAULT '[]');
INSERT INTO "stepwarden_schedulers" VALUES('scheduler-b72d3a285bf74c0f','["order"]',1000,0,1.79574288999056792259e+09,1.79574288999056792259e+09,1.79574289499056792256e+09,'[["order",1]]');
CREATE TABLE stepwarden_schedules (
    name       TEXT PRIMARY KEY,
    workflow   TEXT NOT NULL,
    cron       TEXT,
    every      REAL,
    input      TEXT NOT NULL,
    timezone   TEXT NOT NULL,
    complete_within REAL NOT NULL,
    max_failures    INTEGER NOT NULL,
    on_failure      TEXT NOT NULL,
    catch_up   TEXT NOT NULL,
    paused     INTEGER NOT NULL DEFAULT 0,
    next_at    REAL NOT NULL,
    last_tick  REAL,
    updated_at REAL NOT NULL
, version INTEGER NOT NULL DEFAULT 1);
CREATE TABLE stepwarden_schema (version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at REAL NOT NULL);
INSERT INTO "stepwarden_schema" VALUES(1,'0001_initial.sql',1.79574288997576260572e+09);
INSERT INTO "stepwarden_schema" VALUES(2,'0002_compensation.sql',1.79574288997658586502e+09);
INSERT INTO "stepwarden_schema" VALUES(3,'0003_outbox.sql',1.79574288997705626491e+09);
INSERT INTO "stepwarden_schema" VALUES(4,'0004_agents.sql',1.79574288997925925258e+09);
INSERT INTO "stepwarden_schema" VALUES(5,'0005_abandoned.sql',1.79574288997954535488e+09);
INSERT INTO "stepwarden_schema" VALUES(6,'0006_schedulers.sql',1.79574288998001861577e+09);
INSERT INTO "stepwarden_schema" VALUES(7,'0007_waiting.sql',1.79574288998078536992e+09);
INSERT INTO "stepwarden_schema" VALUES(8,'0008_schedules.sql',1.79574288998092341422e+09);
INSERT INTO "stepwarden_schema" VALUES(9,'0009_positions.sql',1.79574288998166918755e+09);
INSERT INTO "stepwarden_schema" VALUES(10,'0010_call_stopped.sql',1.79574288998223829264e+09);
INSERT INTO "stepwarden_schema" VALUES(11,'0011_versions.sql',1.79574288998348093027e+09);
INSERT INTO "stepwarden_schema" VALUES(12,'0012_children.sql',1.79574288998579549786e+09);
INSERT INTO "stepwarden_schema" VALUES(13,'0013_awaited.sql',1.79574288998625326155e+09);
INSERT INTO "stepwarden_schema" VALUES(14,'0014_aging.sql',1.79574288998727917671e+09);
INSERT INTO "stepwarden_schema" VALUES(15,'0015_step_deadline.sql',1.79574288998729252814e+09);
CREATE TABLE stepwarden_starts (
    agent     TEXT NOT NULL,
    operation TEXT NOT NULL,
    limit_key TEXT NOT NULL,
    at        REAL NOT NULL
);
CREATE TABLE stepwarden_steps (
    task_id         TEXT NOT NULL REFERENCES stepwarden_tasks (task_id) ON DELETE CASCADE,
    seq             INTEGER NOT NULL,
    name            TEXT NOT NULL,
    agent           TEXT NOT NULL,
    operation       TEXT NOT NULL,
    state           TEXT NOT NULL,
    attempt         INTEGER NOT NULL,
    task_attempt    INTEGER NOT NULL,
    priority        INTEGER NOT NULL,
    complete_by     REAL NOT NULL,
    idempotency_key TEXT NOT NULL,
    input           TEXT NOT NULL,
    result          TEXT,
    error           TEXT,
    locked_by       TEXT,
    tries           INTEGER NOT NULL DEFAULT 0,
    created_at      REAL NOT NULL,
    dispatched_at   REAL NOT NULL,
    claimed_at      REAL,
    finished_at     REAL, compensation TEXT, compensation_input TEXT, compensates INTEGER, complete_within REAL, reassignments INTEGER NOT NULL DEFAULT 0, heartbeat TEXT, heartbeat_at REAL, pickup_within REAL, give_up_by REAL, limit_key TEXT, abandoned INTEGER NOT NULL DEFAULT 0, position TEXT, call_stopped_at REAL, ranked_at REAL NOT NULL DEFAULT 0,
    PRIMARY KEY (task_id, seq)
);
INSERT INTO "stepwarden_steps" VALUES('o1',1,'inventory.reserve','inventory','reserve','completed',1,1,0,1.79574292000170540814e+09,'o1/1','[{"id":1}]','"reserved"',NULL,'agent-b72d3a285bf74c0f',1,1.7957428900052170754e+09,1.7957428900052170754e+09,1.7957428900052170754e+09,1.79574289000693225861e+09,'inventory.release','[{"id":1}]',NULL,30.0,0,NULL,NULL,NULL,NULL,NULL,0,'1',NULL,1.7957428900052170754e+09);
INSERT INTO "stepwarden_steps" VALUES('o1',2,'payments.charge','payments','charge','completed',1,1,0,1.79574292000170540814e+09,'o1/2','[{"id":1}]','"charged"',NULL,'agent-b72d3a285bf74c0f',1,1.79574289000693225861e+09,1.79574289000693225861e+09,1.79574289000693225861e+09,1.79574289001345300674e+09,'payments.refund','[{"id":1}]',NULL,30.0,0,NULL,NULL,NULL,NULL,NULL,0,'2',NULL,1.79574289000693225861e+09);
INSERT INTO "stepwarden_steps" VALUES('o1',3,'shipping.ship','shipping','ship','failed',1,1,0,1.79574292000170540814e+09,'o1/3','[{"id":1}]',NULL,'PermanentError: no courier','agent-b72d3a285bf74c0f',1,1.79574289001345300674e+09,1.79574289001345300674e+09,1.79574289001345300674e+09,1.79574289001622986795e+09,NULL,NULL,NULL,30.0,0,NULL,NULL,NULL,NULL,NULL,0,'3',NULL,1.79574289001345300674e+09);
INSERT INTO "stepwarden_steps" VALUES('o1',4,'compensate payments.charge','payments','refund','completed',1,2,0,1.79574292001857590671e+09,'o1/4','[{"id":1}]','"refunded"',NULL,'agent-b72d3a285bf74c0f',1,1.79574289002277016642e+09,1.79574289002277016642e+09,1.79574289002277016642e+09,1.79574289002406930928e+09,NULL,NULL,2,30.0,0,NULL,NULL,NULL,NULL,NULL,0,NULL,NULL,1.79574289002277016642e+09);
INSERT INTO "stepwarden_steps" VALUES('o1',5,'compensate inventory.reserve','inventory','release','running',1,2,0,1.79574292001857590671e+09,'o1/5','[{"id":1}]',NULL,NULL,'agent-b72d3a285bf74c0f',0,1.79574289002406930928e+09,1.79574289002406930928e+09,1.79574289002406930928e+09,NULL,NULL,NULL,1,30.0,0,NULL,NULL,NULL,NULL,NULL,0,NULL,NULL,1.79574289002406930928e+09);
CREATE TABLE stepwarden_tasks (
    task_id         TEXT PRIMARY KEY,
    workflow        TEXT NOT NULL,
    input           TEXT NOT NULL,
    locked_by       TEXT,
    complete_by     REAL,
    process_state   TEXT NOT NULL DEFAULT 'pending',
    failure_count   INTEGER NOT NULL DEFAULT 0,
    max_failures    INTEGER NOT NULL,
    attempt         INTEGER NOT NULL DEFAULT 0,
    priority        INTEGER NOT NULL DEFAULT 0,
    complete_within REAL NOT NULL,
    eligible_at     REAL NOT NULL,
    result          TEXT,
    error           TEXT,
    created_at      REAL NOT NULL,
    updated_at      REAL NOT NULL,
    finished_at     REAL
, on_failure TEXT NOT NULL DEFAULT 'compensate', reply_to TEXT, compensation_failures INTEGER NOT NULL DEFAULT 0, wake_at REAL, waiting_for TEXT, backoff_until REAL, version INTEGER NOT NULL DEFAULT 1, parent_id TEXT, parent_position TEXT, awaited INTEGER NOT NULL DEFAULT 0, ranked_at REAL NOT NULL DEFAULT 0);
INSERT INTO "stepwarden_tasks" VALUES('o1','order','{"id":1}','scheduler-b72d3a285bf74c0f',1.79574292001857590671e+09,'compensating',0,3,2,0,30.0,1.79574289001622986795e+09,NULL,'step ''shipping.ship'' failed: PermanentError: no courier',1.79574288999786567692e+09,1.79574289001857590681e+09,NULL,'compensate',NULL,0,NULL,NULL,1.79574289001622986795e+09,1,NULL,NULL,0,1.79574288999786567692e+09);
CREATE TABLE "stepwarden_waits" (
    task_id     TEXT NOT NULL REFERENCES stepwarden_tasks (task_id) ON DELETE CASCADE,
    seq         INTEGER NOT NULL,
    kind        TEXT NOT NULL,
    name        TEXT NOT NULL,
    wake_at     REAL,
    state       TEXT NOT NULL DEFAULT 'open',
    event_id    TEXT,
    payload     TEXT,
    created_at  REAL NOT NULL,
    finished_at REAL,
    position    TEXT,
    PRIMARY KEY (task_id, seq)
);
CREATE INDEX stepwarden_tasks_state ON stepwarden_tasks (process_state, workflow);
CREATE INDEX stepwarden_steps_expiry ON stepwarden_steps (complete_by)
    WHERE state IN ('not_started', 'running');
CREATE INDEX stepwarden_events_task ON stepwarden_events (task_id, id);
CREATE INDEX stepwarden_events_kind ON stepwarden_events (kind, id);
CREATE INDEX stepwarden_tasks_expiry ON stepwarden_tasks (complete_by)
    WHERE complete_by IS NOT NULL;
CREATE INDEX stepwarden_outbox_due ON stepwarden_outbox (next_at) WHERE next_at IS NOT NULL;
CREATE INDEX stepwarden_outbox_channel ON stepwarden_outbox (channel, id);
CREATE INDEX stepwarden_outbox_task ON stepwarden_outbox (task_id, id);
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
CREATE INDEX stepwarden_steps_running ON stepwarden_steps (agent, operation, limit_key)
    WHERE state = 'running';
CREATE INDEX stepwarden_steps_holder ON stepwarden_steps (locked_by) WHERE state = 'running';
CREATE INDEX stepwarden_steps_pickup ON stepwarden_steps (dispatched_at)
    WHERE state = 'not_started' AND pickup_within IS NOT NULL;
CREATE INDEX stepwarden_steps_give_up ON stepwarden_steps (give_up_by)
    WHERE state IN ('not_started', 'running') AND give_up_by IS NOT NULL;
CREATE INDEX stepwarden_starts_key ON stepwarden_starts (agent, operation, limit_key, at);
CREATE INDEX stepwarden_tasks_holder ON stepwarden_tasks (locked_by) WHERE locked_by IS NOT NULL;
CREATE INDEX stepwarden_tasks_waking ON stepwarden_tasks (wake_at)
    WHERE process_state = 'waiting';
CREATE INDEX stepwarden_inbox_untaken ON stepwarden_inbox (task_id, name, id)
    WHERE taken_by IS NULL;
CREATE INDEX stepwarden_schedules_due ON stepwarden_schedules (next_at) WHERE NOT paused;
CREATE INDEX stepwarden_tasks_children ON stepwarden_tasks (parent_id, created_at)
    WHERE parent_id IS NOT NULL;
CREATE INDEX stepwarden_tasks_pending ON stepwarden_tasks (workflow, version, ranked_at)
    WHERE process_state = 'pending';
CREATE INDEX stepwarden_tasks_compensate ON stepwarden_tasks (workflow, version, ranked_at)
    WHERE process_state = 'compensating' AND locked_by IS NULL;
CREATE INDEX stepwarden_steps_requests ON stepwarden_steps (agent, ranked_at)
    WHERE state = 'not_started';
DELETE FROM "sqlite_sequence";
INSERT INTO "sqlite_sequence" VALUES('stepwarden_outbox',1);
INSERT INTO "sqlite_sequence" VALUES('stepwarden_events',2);
COMMIT;
