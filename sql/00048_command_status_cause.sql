-- command_status follows a command to the commands it led to (issue #43,
-- "Whole outcomes"): a transfer's debit sends a credit to its target, a
-- refused credit sends a refund back; an order's placement sends a
-- reservation to its item, which sends the confirmation or the rejection
-- back. Each event of a decision names the commands it sent (the
-- derived-command header, pipeline.Event.Derived), and the projector
-- records each as a row of its own, pending until its own outcome comes,
-- with the command that sent it: cause_command_id within
-- cause_aggregate_id (a command is its id within its aggregate; the
-- tenant is the row's, derived commands never leave it).
--
-- GET /v1/commands/{id} reads the tree under a command through the
-- index, from its root down, to answer the outcome of the whole
-- (docs/ingest.md#outcome); onceflow trace follows it the same way. The
-- index is partial: commands nothing derived (every command ingest
-- accepts) have no cause and are not in it, so ingest's inserts do not
-- maintain it. A rebuild's copy of the table (LIKE ... INCLUDING ALL)
-- takes the index under the name Postgres gives it, which is this one.
--
-- Rows written before this migration have no cause: a command decided
-- then shows no derived commands, as before.

-- +goose Up
ALTER TABLE command_status
    ADD COLUMN cause_command_id uuid,
    ADD COLUMN cause_aggregate_id text;
CREATE INDEX command_status_cause_command_id_tenant_cause_aggregate_id_idx
    ON command_status (cause_command_id, tenant, cause_aggregate_id)
    WHERE cause_command_id IS NOT NULL;

-- +goose Down
DROP INDEX command_status_cause_command_id_tenant_cause_aggregate_id_idx;
ALTER TABLE command_status
    DROP COLUMN cause_command_id,
    DROP COLUMN cause_aggregate_id;
