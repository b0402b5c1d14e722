-- Parallel steps. A step's or a wait's place in its workflow (`position`) is what a replay
-- matches it by: "3" for the third thing the workflow body does, "3.2.1" for the first step
-- of the second branch of a `ctx.gather` at 3. `seq` stays the row's identity (and its
-- idempotency key's), numbered in the order things were recorded. Compensation steps have no
-- position: they are not part of the workflow's body. Rows recorded before parallel steps
-- were numbered in order, so their position is their seq.
ALTER TABLE stepwarden_steps ADD COLUMN position TEXT;
UPDATE stepwarden_steps SET position = CAST(seq AS TEXT) WHERE compensates IS NULL;
ALTER TABLE stepwarden_waits ADD COLUMN position TEXT;
UPDATE stepwarden_waits SET position = CAST(seq AS TEXT);
