-- Cancellation that reaches the call. `call_stopped_at`: when the agent instance that held a
-- step (`locked_by`, under its `attempt`) reported that its call of the step has ended; set
-- on a step abandoned while it ran, it no longer holds up the compensation of its task
-- (rules.holds_up_compensation). A new claim or dispatch of the step clears it.
-- `backoff_until`: when a task sent to compensating may be claimed, but for the calls of its
-- abandoned steps (the end of its backoff, or the moment it was sent): the earliest its
-- eligible_at may come forward to when those calls stop. NULL on rows written before: their
-- compensation waits for the abandoned steps' complete_by, as it did.
ALTER TABLE stepwarden_steps ADD COLUMN call_stopped_at timestamptz;
ALTER TABLE stepwarden_tasks ADD COLUMN backoff_until timestamptz;
