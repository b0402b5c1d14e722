--
-- PostgreSQL database dump
--


-- Dumped from database version 15.20 (Debian 15.20-0+deb12u1)
-- Dumped by pg_dump version 15.20 (Debian 15.20-0+deb12u1)

SET statement_timeout = 0;
SET lock_timeout = 0;
SET idle_in_transaction_session_timeout = 0;
SET client_encoding = 'UTF8';
SET standard_conforming_strings = on;
SELECT pg_catalog.set_config('search_path', '', false);
SET check_function_bodies = false;
SET xmloption = content;
SET client_min_messages = warning;
SET row_security = off;

--
-- Name: stepwarden_outbox_alert(); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.stepwarden_outbox_alert() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
BEGIN
    PERFORM stepwarden_outbox_put('alerts', NEW.task_id, 'alert', NEW.detail, true);
    RETURN NULL;
END $$;


--
-- Name: stepwarden_outbox_put(text, text, text, json, boolean); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.stepwarden_outbox_put(p_channel text, p_task text, p_kind text, p_detail json, p_due boolean) RETURNS void
    LANGUAGE plpgsql
    AS $$
BEGIN
    INSERT INTO stepwarden_outbox (channel, task_id, kind, detail, next_at)
    VALUES (p_channel, p_task, p_kind, p_detail, CASE WHEN p_due THEN now() END);
    PERFORM pg_notify('stepwarden_outbox', left(p_channel, 7000));
END $$;


--
-- Name: stepwarden_outbox_received(); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.stepwarden_outbox_received() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
BEGIN
    PERFORM stepwarden_outbox_put(NEW.reply_to, NEW.task_id, 'received',
        json_build_object('task_id', NEW.task_id, 'workflow', NEW.workflow), false);
    RETURN NULL;
END $$;


--
-- Name: stepwarden_outbox_state(); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.stepwarden_outbox_state() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
BEGIN
    PERFORM stepwarden_outbox_put(NEW.reply_to, NEW.task_id, NEW.process_state,
        json_build_object('task_id', NEW.task_id, 'state', NEW.process_state,
                          'result', NEW.result, 'error', NEW.error), false);
    RETURN NULL;
END $$;


--
-- Name: stepwarden_outbox_step(); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.stepwarden_outbox_step() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
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


--
-- Name: stepwarden_step_deadline(timestamp with time zone, interval, timestamp with time zone, timestamp with time zone, timestamp with time zone); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.stepwarden_step_deadline(p_now timestamp with time zone, p_complete_within interval, p_task_complete_by timestamp with time zone, p_give_up_by timestamp with time zone, p_not_before timestamp with time zone) RETURNS timestamp with time zone
    LANGUAGE sql STABLE PARALLEL SAFE
    AS $$
    SELECT GREATEST(p_not_before,
                    LEAST(p_now + p_complete_within, p_task_complete_by, p_give_up_by))
$$;


SET default_tablespace = '';

SET default_table_access_method = heap;

--
-- Name: stepwarden_agents; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.stepwarden_agents (
    instance text NOT NULL,
    agent text NOT NULL,
    operations json NOT NULL,
    capacity integer NOT NULL,
    inflight integer DEFAULT 0 NOT NULL,
    breaker text DEFAULT 'closed'::text NOT NULL,
    breaker_detail json DEFAULT '{}'::json NOT NULL,
    started_at timestamp with time zone DEFAULT now() NOT NULL,
    heartbeat_at timestamp with time zone DEFAULT now() NOT NULL,
    expires_at timestamp with time zone NOT NULL
);


--
-- Name: stepwarden_awaited; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.stepwarden_awaited (
    task_id text NOT NULL
);


--
-- Name: stepwarden_events; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.stepwarden_events (
    id bigint NOT NULL,
    task_id text,
    at timestamp with time zone DEFAULT now() NOT NULL,
    kind text NOT NULL,
    detail json NOT NULL
);


--
-- Name: stepwarden_events_id_seq; Type: SEQUENCE; Schema: public; Owner: -
--

CREATE SEQUENCE public.stepwarden_events_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1;


--
-- Name: stepwarden_events_id_seq; Type: SEQUENCE OWNED BY; Schema: public; Owner: -
--

ALTER SEQUENCE public.stepwarden_events_id_seq OWNED BY public.stepwarden_events.id;


--
-- Name: stepwarden_inbox; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.stepwarden_inbox (
    id bigint NOT NULL,
    task_id text NOT NULL,
    event_id text NOT NULL,
    name text NOT NULL,
    payload json NOT NULL,
    sent_at timestamp with time zone DEFAULT now() NOT NULL,
    taken_by integer
);


--
-- Name: stepwarden_inbox_id_seq; Type: SEQUENCE; Schema: public; Owner: -
--

CREATE SEQUENCE public.stepwarden_inbox_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1;


--
-- Name: stepwarden_inbox_id_seq; Type: SEQUENCE OWNED BY; Schema: public; Owner: -
--

ALTER SEQUENCE public.stepwarden_inbox_id_seq OWNED BY public.stepwarden_inbox.id;


--
-- Name: stepwarden_leases; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.stepwarden_leases (
    name text NOT NULL,
    holder text NOT NULL,
    term bigint NOT NULL,
    expires_at timestamp with time zone NOT NULL,
    renewed_at timestamp with time zone
);


--
-- Name: stepwarden_outbox; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.stepwarden_outbox (
    id bigint NOT NULL,
    channel text NOT NULL,
    task_id text,
    kind text NOT NULL,
    detail json NOT NULL,
    at timestamp with time zone DEFAULT now() NOT NULL,
    attempts integer DEFAULT 0 NOT NULL,
    next_at timestamp with time zone,
    delivered_to json DEFAULT '[]'::json NOT NULL,
    delivered_at timestamp with time zone
);


--
-- Name: stepwarden_outbox_id_seq; Type: SEQUENCE; Schema: public; Owner: -
--

CREATE SEQUENCE public.stepwarden_outbox_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1;


--
-- Name: stepwarden_outbox_id_seq; Type: SEQUENCE OWNED BY; Schema: public; Owner: -
--

ALTER SEQUENCE public.stepwarden_outbox_id_seq OWNED BY public.stepwarden_outbox.id;


--
-- Name: stepwarden_schedulers; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.stepwarden_schedulers (
    instance text NOT NULL,
    workflows json NOT NULL,
    capacity integer NOT NULL,
    held integer DEFAULT 0 NOT NULL,
    started_at timestamp with time zone DEFAULT now() NOT NULL,
    heartbeat_at timestamp with time zone DEFAULT now() NOT NULL,
    expires_at timestamp with time zone NOT NULL,
    versions json DEFAULT '[]'::json NOT NULL
);


--
-- Name: stepwarden_schedules; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.stepwarden_schedules (
    name text NOT NULL,
    workflow text NOT NULL,
    cron text,
    every double precision,
    input json NOT NULL,
    timezone text NOT NULL,
    complete_within double precision NOT NULL,
    max_failures integer NOT NULL,
    on_failure text NOT NULL,
    catch_up text NOT NULL,
    paused boolean DEFAULT false NOT NULL,
    next_at timestamp with time zone NOT NULL,
    last_tick timestamp with time zone,
    updated_at timestamp with time zone DEFAULT now() NOT NULL,
    version integer DEFAULT 1 NOT NULL
);


--
-- Name: stepwarden_schema; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.stepwarden_schema (
    version integer NOT NULL,
    name text NOT NULL,
    applied_at timestamp with time zone DEFAULT now() NOT NULL
);


--
-- Name: stepwarden_starts; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.stepwarden_starts (
    agent text NOT NULL,
    operation text NOT NULL,
    limit_key text NOT NULL,
    at timestamp with time zone DEFAULT now() NOT NULL
);


--
-- Name: stepwarden_steps; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.stepwarden_steps (
    task_id text NOT NULL,
    seq integer NOT NULL,
    name text NOT NULL,
    agent text NOT NULL,
    operation text NOT NULL,
    state text NOT NULL,
    attempt integer NOT NULL,
    task_attempt integer NOT NULL,
    priority integer NOT NULL,
    complete_by timestamp with time zone NOT NULL,
    idempotency_key text NOT NULL,
    input json NOT NULL,
    result json,
    error text,
    locked_by text,
    tries integer DEFAULT 0 NOT NULL,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    dispatched_at timestamp with time zone DEFAULT now() NOT NULL,
    claimed_at timestamp with time zone,
    finished_at timestamp with time zone,
    compensation text,
    compensation_input json,
    compensates integer,
    complete_within double precision,
    reassignments integer DEFAULT 0 NOT NULL,
    heartbeat json,
    heartbeat_at timestamp with time zone,
    pickup_within double precision,
    give_up_by timestamp with time zone,
    limit_key text,
    abandoned boolean DEFAULT false NOT NULL,
    "position" text,
    call_stopped_at timestamp with time zone,
    ranked_at timestamp with time zone DEFAULT now() NOT NULL
);


--
-- Name: stepwarden_tasks; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.stepwarden_tasks (
    task_id text NOT NULL,
    workflow text NOT NULL,
    input json NOT NULL,
    locked_by text,
    complete_by timestamp with time zone,
    process_state text DEFAULT 'pending'::text NOT NULL,
    failure_count integer DEFAULT 0 NOT NULL,
    max_failures integer NOT NULL,
    attempt integer DEFAULT 0 NOT NULL,
    priority integer DEFAULT 0 NOT NULL,
    complete_within double precision NOT NULL,
    eligible_at timestamp with time zone DEFAULT now() NOT NULL,
    result json,
    error text,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    updated_at timestamp with time zone DEFAULT now() NOT NULL,
    finished_at timestamp with time zone,
    on_failure text DEFAULT 'compensate'::text NOT NULL,
    reply_to text,
    compensation_failures integer DEFAULT 0 NOT NULL,
    wake_at timestamp with time zone,
    waiting_for text,
    backoff_until timestamp with time zone,
    version integer DEFAULT 1 NOT NULL,
    parent_id text,
    parent_position text,
    awaited boolean DEFAULT false NOT NULL,
    ranked_at timestamp with time zone DEFAULT now() NOT NULL
);


--
-- Name: stepwarden_waits; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.stepwarden_waits (
    task_id text NOT NULL,
    seq integer NOT NULL,
    kind text NOT NULL,
    name text NOT NULL,
    wake_at timestamp with time zone,
    state text DEFAULT 'open'::text NOT NULL,
    event_id text,
    payload json,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    finished_at timestamp with time zone,
    "position" text
);


--
-- Name: stepwarden_events id; Type: DEFAULT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.stepwarden_events ALTER COLUMN id SET DEFAULT nextval('public.stepwarden_events_id_seq'::regclass);


--
-- Name: stepwarden_inbox id; Type: DEFAULT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.stepwarden_inbox ALTER COLUMN id SET DEFAULT nextval('public.stepwarden_inbox_id_seq'::regclass);


--
-- Name: stepwarden_outbox id; Type: DEFAULT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.stepwarden_outbox ALTER COLUMN id SET DEFAULT nextval('public.stepwarden_outbox_id_seq'::regclass);


--
-- Data for Name: stepwarden_agents; Type: TABLE DATA; Schema: public; Owner: -
--

INSERT INTO public.stepwarden_agents VALUES ('agent-6b745fdc1098422a', 'inventory', '["release","reserve"]', 100, 0, 'closed', '{}', '2026-11-27 01:28:11.45183+00', '2026-11-27 01:28:11.45183+00', '2026-11-27 01:28:16.45183+00');
INSERT INTO public.stepwarden_agents VALUES ('agent-6b745fdc1098422a', 'payments', '["charge","refund"]', 100, 0, 'closed', '{}', '2026-11-27 01:28:11.45553+00', '2026-11-27 01:28:11.45553+00', '2026-11-27 01:28:16.45553+00');
INSERT INTO public.stepwarden_agents VALUES ('agent-6b745fdc1098422a', 'shipping', '["ship"]', 100, 0, 'closed', '{}', '2026-11-27 01:28:11.458515+00', '2026-11-27 01:28:11.458515+00', '2026-11-27 01:28:16.458515+00');


--
-- Data for Name: stepwarden_awaited; Type: TABLE DATA; Schema: public; Owner: -
--



--
-- Data for Name: stepwarden_events; Type: TABLE DATA; Schema: public; Owner: -
--

INSERT INTO public.stepwarden_events VALUES (1, 'o1', '2026-11-27 01:28:11.514187+00', 'step_failed', '{"seq" : 3, "attempt" : 1, "error" : "PermanentError: no courier"}');
INSERT INTO public.stepwarden_events VALUES (2, 'o1', '2026-11-27 01:28:11.514187+00', 'alert', '{"reason" : "task_error", "error" : "step ''shipping.ship'' failed: PermanentError: no courier", "then" : "compensating"}');


--
-- Data for Name: stepwarden_inbox; Type: TABLE DATA; Schema: public; Owner: -
--



--
-- Data for Name: stepwarden_leases; Type: TABLE DATA; Schema: public; Owner: -
--

INSERT INTO public.stepwarden_leases VALUES ('supervisor', 'supervisor-6b745fdc1098422a', 1, '2026-11-27 01:28:16.719312+00', '2026-11-27 01:28:11.719312+00');


--
-- Data for Name: stepwarden_outbox; Type: TABLE DATA; Schema: public; Owner: -
--

INSERT INTO public.stepwarden_outbox VALUES (1, 'alerts', 'o1', 'alert', '{"reason" : "task_error", "error" : "step ''shipping.ship'' failed: PermanentError: no courier", "then" : "compensating"}', '2026-11-27 01:28:11.514187+00', 1, NULL, '["log"]', '2026-11-27 01:28:11.654448+00');


--
-- Data for Name: stepwarden_schedulers; Type: TABLE DATA; Schema: public; Owner: -
--

INSERT INTO public.stepwarden_schedulers VALUES ('scheduler-6b745fdc1098422a', '["order"]', 1000, 0, '2026-11-27 01:28:11.448105+00', '2026-11-27 01:28:11.448105+00', '2026-11-27 01:28:16.448105+00', '[["order",1]]');


--
-- Data for Name: stepwarden_schedules; Type: TABLE DATA; Schema: public; Owner: -
--



--
-- Data for Name: stepwarden_schema; Type: TABLE DATA; Schema: public; Owner: -
--

INSERT INTO public.stepwarden_schema VALUES (1, '0001_initial.sql', '2026-11-27 01:28:11.234256+00');
INSERT INTO public.stepwarden_schema VALUES (2, '0002_compensation.sql', '2026-11-27 01:28:11.234256+00');
INSERT INTO public.stepwarden_schema VALUES (3, '0003_outbox.sql', '2026-11-27 01:28:11.234256+00');
INSERT INTO public.stepwarden_schema VALUES (4, '0004_agents.sql', '2026-11-27 01:28:11.234256+00');
INSERT INTO public.stepwarden_schema VALUES (5, '0005_abandoned.sql', '2026-11-27 01:28:11.234256+00');
INSERT INTO public.stepwarden_schema VALUES (6, '0006_schedulers.sql', '2026-11-27 01:28:11.234256+00');
INSERT INTO public.stepwarden_schema VALUES (7, '0007_waiting.sql', '2026-11-27 01:28:11.234256+00');
INSERT INTO public.stepwarden_schema VALUES (8, '0008_schedules.sql', '2026-11-27 01:28:11.234256+00');
INSERT INTO public.stepwarden_schema VALUES (9, '0009_positions.sql', '2026-11-27 01:28:11.234256+00');
INSERT INTO public.stepwarden_schema VALUES (10, '0010_call_stopped.sql', '2026-11-27 01:28:11.234256+00');
INSERT INTO public.stepwarden_schema VALUES (11, '0011_versions.sql', '2026-11-27 01:28:11.234256+00');
INSERT INTO public.stepwarden_schema VALUES (12, '0012_children.sql', '2026-11-27 01:28:11.234256+00');
INSERT INTO public.stepwarden_schema VALUES (13, '0013_awaited.sql', '2026-11-27 01:28:11.234256+00');
INSERT INTO public.stepwarden_schema VALUES (14, '0014_aging.sql', '2026-11-27 01:28:11.234256+00');
INSERT INTO public.stepwarden_schema VALUES (15, '0015_step_deadline.sql', '2026-11-27 01:28:11.234256+00');


--
-- Data for Name: stepwarden_starts; Type: TABLE DATA; Schema: public; Owner: -
--



--
-- Data for Name: stepwarden_steps; Type: TABLE DATA; Schema: public; Owner: -
--

INSERT INTO public.stepwarden_steps VALUES ('o1', 1, 'inventory.reserve', 'inventory', 'reserve', 'completed', 1, 1, 0, '2026-11-27 01:28:41.482258+00', 'o1/1', '[{"id":1}]', '"reserved"', NULL, 'agent-6b745fdc1098422a', 1, '2026-11-27 01:28:11.490255+00', '2026-11-27 01:28:11.490255+00', '2026-11-27 01:28:11.490255+00', '2026-11-27 01:28:11.496607+00', 'inventory.release', '[{"id":1}]', NULL, 30, 0, NULL, NULL, NULL, NULL, NULL, false, '1', NULL, '2026-11-27 01:28:11.490255+00');
INSERT INTO public.stepwarden_steps VALUES ('o1', 2, 'payments.charge', 'payments', 'charge', 'completed', 1, 1, 0, '2026-11-27 01:28:41.482258+00', 'o1/2', '[{"id":1}]', '"charged"', NULL, 'agent-6b745fdc1098422a', 1, '2026-11-27 01:28:11.496607+00', '2026-11-27 01:28:11.496607+00', '2026-11-27 01:28:11.496607+00', '2026-11-27 01:28:11.506516+00', 'payments.refund', '[{"id":1}]', NULL, 30, 0, NULL, NULL, NULL, NULL, NULL, false, '2', NULL, '2026-11-27 01:28:11.496607+00');
INSERT INTO public.stepwarden_steps VALUES ('o1', 3, 'shipping.ship', 'shipping', 'ship', 'failed', 1, 1, 0, '2026-11-27 01:28:41.482258+00', 'o1/3', '[{"id":1}]', NULL, 'PermanentError: no courier', 'agent-6b745fdc1098422a', 1, '2026-11-27 01:28:11.506516+00', '2026-11-27 01:28:11.506516+00', '2026-11-27 01:28:11.506516+00', '2026-11-27 01:28:11.514187+00', NULL, NULL, NULL, 30, 0, NULL, NULL, NULL, NULL, NULL, false, '3', NULL, '2026-11-27 01:28:11.506516+00');
INSERT INTO public.stepwarden_steps VALUES ('o1', 4, 'compensate payments.charge', 'payments', 'refund', 'completed', 1, 2, 0, '2026-11-27 01:28:41.522035+00', 'o1/4', '[{"id":1}]', '"refunded"', NULL, 'agent-6b745fdc1098422a', 1, '2026-11-27 01:28:11.528261+00', '2026-11-27 01:28:11.528261+00', '2026-11-27 01:28:11.528261+00', '2026-11-27 01:28:11.530221+00', NULL, NULL, 2, 30, 0, NULL, NULL, NULL, NULL, NULL, false, NULL, NULL, '2026-11-27 01:28:11.528261+00');
INSERT INTO public.stepwarden_steps VALUES ('o1', 5, 'compensate inventory.reserve', 'inventory', 'release', 'running', 1, 2, 0, '2026-11-27 01:28:41.522035+00', 'o1/5', '[{"id":1}]', NULL, NULL, 'agent-6b745fdc1098422a', 0, '2026-11-27 01:28:11.530221+00', '2026-11-27 01:28:11.530221+00', '2026-11-27 01:28:11.530221+00', NULL, NULL, NULL, 1, 30, 0, NULL, NULL, NULL, NULL, NULL, false, NULL, NULL, '2026-11-27 01:28:11.530221+00');


--
-- Data for Name: stepwarden_tasks; Type: TABLE DATA; Schema: public; Owner: -
--

INSERT INTO public.stepwarden_tasks VALUES ('o1', 'order', '{"id":1}', 'scheduler-6b745fdc1098422a', '2026-11-27 01:28:41.522035+00', 'compensating', 0, 3, 2, 0, 30, '2026-11-27 01:28:11.514187+00', NULL, 'step ''shipping.ship'' failed: PermanentError: no courier', '2026-11-27 01:28:11.435876+00', '2026-11-27 01:28:11.522035+00', NULL, 'compensate', NULL, 0, NULL, NULL, '2026-11-27 01:28:11.514187+00', 1, NULL, NULL, false, '2026-11-27 01:28:11.435876+00');


--
-- Data for Name: stepwarden_waits; Type: TABLE DATA; Schema: public; Owner: -
--



--
-- Name: stepwarden_events_id_seq; Type: SEQUENCE SET; Schema: public; Owner: -
--

SELECT pg_catalog.setval('public.stepwarden_events_id_seq', 2, true);


--
-- Name: stepwarden_inbox_id_seq; Type: SEQUENCE SET; Schema: public; Owner: -
--

SELECT pg_catalog.setval('public.stepwarden_inbox_id_seq', 1, false);


--
-- Name: stepwarden_outbox_id_seq; Type: SEQUENCE SET; Schema: public; Owner: -
--

SELECT pg_catalog.setval('public.stepwarden_outbox_id_seq', 1, true);


--
-- Name: stepwarden_agents stepwarden_agents_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.stepwarden_agents
    ADD CONSTRAINT stepwarden_agents_pkey PRIMARY KEY (instance, agent);


--
-- Name: stepwarden_awaited stepwarden_awaited_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.stepwarden_awaited
    ADD CONSTRAINT stepwarden_awaited_pkey PRIMARY KEY (task_id);


--
-- Name: stepwarden_events stepwarden_events_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.stepwarden_events
    ADD CONSTRAINT stepwarden_events_pkey PRIMARY KEY (id);


--
-- Name: stepwarden_inbox stepwarden_inbox_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.stepwarden_inbox
    ADD CONSTRAINT stepwarden_inbox_pkey PRIMARY KEY (id);


--
-- Name: stepwarden_inbox stepwarden_inbox_task_id_event_id_key; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.stepwarden_inbox
    ADD CONSTRAINT stepwarden_inbox_task_id_event_id_key UNIQUE (task_id, event_id);


--
-- Name: stepwarden_leases stepwarden_leases_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.stepwarden_leases
    ADD CONSTRAINT stepwarden_leases_pkey PRIMARY KEY (name);


--
-- Name: stepwarden_outbox stepwarden_outbox_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.stepwarden_outbox
    ADD CONSTRAINT stepwarden_outbox_pkey PRIMARY KEY (id);


--
-- Name: stepwarden_schedulers stepwarden_schedulers_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.stepwarden_schedulers
    ADD CONSTRAINT stepwarden_schedulers_pkey PRIMARY KEY (instance);


--
-- Name: stepwarden_schedules stepwarden_schedules_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.stepwarden_schedules
    ADD CONSTRAINT stepwarden_schedules_pkey PRIMARY KEY (name);


--
-- Name: stepwarden_schema stepwarden_schema_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.stepwarden_schema
    ADD CONSTRAINT stepwarden_schema_pkey PRIMARY KEY (version);


--
-- Name: stepwarden_steps stepwarden_steps_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.stepwarden_steps
    ADD CONSTRAINT stepwarden_steps_pkey PRIMARY KEY (task_id, seq);


--
-- Name: stepwarden_tasks stepwarden_tasks_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.stepwarden_tasks
    ADD CONSTRAINT stepwarden_tasks_pkey PRIMARY KEY (task_id);


--
-- Name: stepwarden_waits stepwarden_waits_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.stepwarden_waits
    ADD CONSTRAINT stepwarden_waits_pkey PRIMARY KEY (task_id, seq);


--
-- Name: stepwarden_events_kind; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX stepwarden_events_kind ON public.stepwarden_events USING btree (kind, id);


--
-- Name: stepwarden_events_task; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX stepwarden_events_task ON public.stepwarden_events USING btree (task_id, id);


--
-- Name: stepwarden_inbox_untaken; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX stepwarden_inbox_untaken ON public.stepwarden_inbox USING btree (task_id, name, id) WHERE (taken_by IS NULL);


--
-- Name: stepwarden_outbox_channel; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX stepwarden_outbox_channel ON public.stepwarden_outbox USING btree (channel, id);


--
-- Name: stepwarden_outbox_due; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX stepwarden_outbox_due ON public.stepwarden_outbox USING btree (next_at) WHERE (next_at IS NOT NULL);


--
-- Name: stepwarden_outbox_task; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX stepwarden_outbox_task ON public.stepwarden_outbox USING btree (task_id, id);


--
-- Name: stepwarden_schedules_due; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX stepwarden_schedules_due ON public.stepwarden_schedules USING btree (next_at) WHERE (NOT paused);


--
-- Name: stepwarden_starts_key; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX stepwarden_starts_key ON public.stepwarden_starts USING btree (agent, operation, limit_key, at);


--
-- Name: stepwarden_steps_expiry; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX stepwarden_steps_expiry ON public.stepwarden_steps USING btree (complete_by) WHERE (state = ANY (ARRAY['not_started'::text, 'running'::text]));


--
-- Name: stepwarden_steps_give_up; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX stepwarden_steps_give_up ON public.stepwarden_steps USING btree (give_up_by) WHERE ((state = ANY (ARRAY['not_started'::text, 'running'::text])) AND (give_up_by IS NOT NULL));


--
-- Name: stepwarden_steps_holder; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX stepwarden_steps_holder ON public.stepwarden_steps USING btree (locked_by) WHERE (state = 'running'::text);


--
-- Name: stepwarden_steps_pickup; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX stepwarden_steps_pickup ON public.stepwarden_steps USING btree (dispatched_at) WHERE ((state = 'not_started'::text) AND (pickup_within IS NOT NULL));


--
-- Name: stepwarden_steps_requests; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX stepwarden_steps_requests ON public.stepwarden_steps USING btree (agent, ranked_at) WHERE (state = 'not_started'::text);


--
-- Name: stepwarden_steps_running; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX stepwarden_steps_running ON public.stepwarden_steps USING btree (agent, operation, limit_key) WHERE (state = 'running'::text);


--
-- Name: stepwarden_tasks_children; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX stepwarden_tasks_children ON public.stepwarden_tasks USING btree (parent_id, created_at) WHERE (parent_id IS NOT NULL);


--
-- Name: stepwarden_tasks_compensate; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX stepwarden_tasks_compensate ON public.stepwarden_tasks USING btree (workflow, version, ranked_at) WHERE ((process_state = 'compensating'::text) AND (locked_by IS NULL));


--
-- Name: stepwarden_tasks_expiry; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX stepwarden_tasks_expiry ON public.stepwarden_tasks USING btree (complete_by) WHERE (complete_by IS NOT NULL);


--
-- Name: stepwarden_tasks_finished; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX stepwarden_tasks_finished ON public.stepwarden_tasks USING btree (finished_at) WHERE (finished_at IS NOT NULL);


--
-- Name: stepwarden_tasks_holder; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX stepwarden_tasks_holder ON public.stepwarden_tasks USING btree (locked_by) WHERE (locked_by IS NOT NULL);


--
-- Name: stepwarden_tasks_pending; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX stepwarden_tasks_pending ON public.stepwarden_tasks USING btree (workflow, version, ranked_at) WHERE (process_state = 'pending'::text);


--
-- Name: stepwarden_tasks_state; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX stepwarden_tasks_state ON public.stepwarden_tasks USING btree (process_state, workflow);


--
-- Name: stepwarden_tasks_waking; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX stepwarden_tasks_waking ON public.stepwarden_tasks USING btree (wake_at) WHERE (process_state = 'waiting'::text);


--
-- Name: stepwarden_events stepwarden_outbox_alert; Type: TRIGGER; Schema: public; Owner: -
--

CREATE TRIGGER stepwarden_outbox_alert AFTER INSERT ON public.stepwarden_events FOR EACH ROW WHEN ((new.kind = 'alert'::text)) EXECUTE FUNCTION public.stepwarden_outbox_alert();


--
-- Name: stepwarden_tasks stepwarden_outbox_received; Type: TRIGGER; Schema: public; Owner: -
--

CREATE TRIGGER stepwarden_outbox_received AFTER INSERT ON public.stepwarden_tasks FOR EACH ROW WHEN ((new.reply_to IS NOT NULL)) EXECUTE FUNCTION public.stepwarden_outbox_received();


--
-- Name: stepwarden_tasks stepwarden_outbox_state; Type: TRIGGER; Schema: public; Owner: -
--

CREATE TRIGGER stepwarden_outbox_state AFTER UPDATE OF process_state ON public.stepwarden_tasks FOR EACH ROW WHEN (((new.reply_to IS NOT NULL) AND (new.process_state <> old.process_state) AND (new.process_state <> ALL (ARRAY['pending'::text, 'processing'::text])))) EXECUTE FUNCTION public.stepwarden_outbox_state();


--
-- Name: stepwarden_steps stepwarden_outbox_step; Type: TRIGGER; Schema: public; Owner: -
--

CREATE TRIGGER stepwarden_outbox_step AFTER UPDATE OF state ON public.stepwarden_steps FOR EACH ROW WHEN (((new.state = 'completed'::text) AND (old.state <> 'completed'::text))) EXECUTE FUNCTION public.stepwarden_outbox_step();


--
-- Name: stepwarden_inbox stepwarden_inbox_task_id_fkey; Type: FK CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.stepwarden_inbox
    ADD CONSTRAINT stepwarden_inbox_task_id_fkey FOREIGN KEY (task_id) REFERENCES public.stepwarden_tasks(task_id) ON DELETE CASCADE;


--
-- Name: stepwarden_steps stepwarden_steps_task_id_fkey; Type: FK CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.stepwarden_steps
    ADD CONSTRAINT stepwarden_steps_task_id_fkey FOREIGN KEY (task_id) REFERENCES public.stepwarden_tasks(task_id) ON DELETE CASCADE;


--
-- Name: stepwarden_waits stepwarden_waits_task_id_fkey; Type: FK CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.stepwarden_waits
    ADD CONSTRAINT stepwarden_waits_task_id_fkey FOREIGN KEY (task_id) REFERENCES public.stepwarden_tasks(task_id) ON DELETE CASCADE;


--
-- PostgreSQL database dump complete
--


