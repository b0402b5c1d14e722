-- OpenTelemetry traces (stepwarden.tracing): the W3C trace context (traceparent and
-- tracestate, as the API's propagator writes them into a dict) recorded as JSON text with a
-- task at its submit (`trace_context`: the submit's span, the parent of every run of the
-- task), with the task at the start of each run (`run_trace`: the run's span, which the next
-- run links to) and with a step at each dispatch (`trace_context`: the dispatch's span, the
-- parent of the agent's call, in whatever process). NULL when tracing is off, as on every row
-- written before.
ALTER TABLE stepwarden_tasks ADD COLUMN trace_context TEXT;
ALTER TABLE stepwarden_tasks ADD COLUMN run_trace TEXT;
ALTER TABLE stepwarden_steps ADD COLUMN trace_context TEXT;
