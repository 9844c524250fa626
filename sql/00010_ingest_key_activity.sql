-- Ingest (issue #3): what `onceflow idempotency-check` shows an operator
-- about a misbehaving client. Each key record counts the retries answered
-- with its stored response (replays) and the requests refused because they
-- reused the key for a different request (conflicts). The counters are
-- updated in the transaction that answers the request, under the key's
-- advisory lock, and never change the stored response or the command.

-- +goose Up
ALTER TABLE idempotency_keys
    ADD COLUMN replays      int NOT NULL DEFAULT 0,
    ADD COLUMN conflicts    int NOT NULL DEFAULT 0,
    ADD COLUMN last_seen_at timestamptz;   -- the last replay or conflict

-- +goose Down
ALTER TABLE idempotency_keys
    DROP COLUMN last_seen_at,
    DROP COLUMN conflicts,
    DROP COLUMN replays;
