-- The keys that sealed secrets in this store (`sealing`): each key's id, and a known text
-- sealed under it (`check`), by which a keyring's key of that id is known to be the right
-- one. Never a key: the keys are the operator's, in the processes that need them.
CREATE TABLE stepwarden_keys (
    key_id      text PRIMARY KEY,
    check_value text NOT NULL,
    added_at    timestamptz NOT NULL DEFAULT now()
);
