-- Abandonment as data: a step closed (failed) while it was open because its task stopped
-- holding it, or past its total timeout after it ran, may have taken effect and is
-- compensated. Steps abandoned before this column existed said so in their error.
ALTER TABLE stepwarden_steps ADD COLUMN abandoned boolean NOT NULL DEFAULT false;
UPDATE stepwarden_steps SET abandoned = true
WHERE state = 'failed' AND error LIKE 'abandoned:%';
