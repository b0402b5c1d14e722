-- Abandonment as data: a step closed (failed) while it was open because its task stopped
-- holding it, or past its total timeout after it ran, may have taken effect and is
-- compensated. Steps abandoned before this column existed said so in their error.
ALTER TABLE stepwarden_steps ADD COLUMN abandoned INTEGER NOT NULL DEFAULT 0;
UPDATE stepwarden_steps SET abandoned = 1
WHERE state = 'failed' AND error LIKE 'abandoned:%';
