-- Keys (issue #19): every API key gets an id, so that operators list and
-- revoke keys by it (`onceflow tenants keys list|create|revoke`) and never
-- type a key: one on a command line stays in the shell's history and in
-- every process listing. The id is not a secret; the key's hash stays the
-- primary key that ingest looks keys up by. Existing keys get ids too.

-- +goose Up
ALTER TABLE api_keys ADD COLUMN id bigint GENERATED ALWAYS AS IDENTITY;
ALTER TABLE api_keys ADD CONSTRAINT api_keys_id_key UNIQUE (id);

-- +goose Down
ALTER TABLE api_keys DROP COLUMN id;
