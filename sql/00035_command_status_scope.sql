-- command_status (issue #13): a command is its id within its aggregate,
-- and no command is pending forever.
--
-- A command id is unique only within its aggregate: ingest mints a fresh
-- one per command, but a producer writing straight to {prefix}.commands
-- picks its own, and may send the same id to two aggregates, or use an id
-- another tenant already used. Those are two commands (their event ids
-- differ too: pipeline.EventID), so they get two rows here, which never
-- mix: the key is (command_id, tenant, aggregate_id). command_id leads it
-- because ingest's ids are UUIDv7, time-ordered, so its inserts append at
-- the right edge of the index; GET /v1/commands/{id} and the key report
-- look a command up by (command_id, tenant), a prefix of the key. The
-- aggregate id starts with its tenant, so the tenant column adds nothing
-- to uniqueness; it is in the key so that no lookup can ever match another
-- tenant's row, whatever the aggregate id says.
--
-- ingested marks the row ingest wrote when it accepted the command over
-- HTTP. When one tenant's producers used the same id on several aggregates,
-- GET /v1/commands/{id} without ?aggregate_id= answers ingest's command
-- (the one its 202 pointed to), else the earliest (docs/decisions/0002-get-command-answers-ingests-command.md).
-- Rows written before this migration say false: each was then the only
-- row of its id, and stays the earliest. A rebuild of command_status keeps
-- it on the rows it copies from the live table (pending, failed) only.
--
-- failed is a terminal status like accepted and rejected: the command went
-- to the DLQ (the projector records the processor's CommandFailed event) or
-- its outbox row went to outbox_dead (the relay records it in the same
-- transaction). A later accepted or rejected outcome of the same command
-- (a redrive that succeeded) replaces it; a failure never replaces them.
--
-- The index serves the relay's pending-command gauges (the oldest pending
-- command, how many) without reading the rest of the table, and a rebuild's
-- copy of the rows only the live table holds (pending, failed). Its name is the one Postgres
-- gives a copy of it (a rebuild's CREATE TABLE ... (LIKE ... INCLUDING
-- ALL)), so it survives a rebuild under the same name.
--
-- Changing the primary key rebuilds its index under an exclusive lock on
-- the table: reads of command statuses wait for it.

-- +goose Up
ALTER TABLE command_status
    ADD COLUMN ingested boolean NOT NULL DEFAULT false,
    DROP CONSTRAINT command_status_pkey,
    ADD PRIMARY KEY (command_id, tenant, aggregate_id),
    DROP CONSTRAINT command_status_status_check,
    ADD CONSTRAINT command_status_status_check CHECK (status IN ('pending', 'accepted', 'rejected', 'failed'));
CREATE INDEX command_status_status_created_at_idx ON command_status (status, created_at)
    WHERE status IN ('pending', 'failed');

-- +goose Down
-- Lossy: of the rows sharing a command id, only the one GET answered by
-- default stays; a failed command becomes rejected (with its reason), the
-- terminal status the previous schema knows.
DELETE FROM command_status AS c
USING (SELECT ctid, row_number() OVER (PARTITION BY command_id ORDER BY ingested DESC, created_at, tenant, aggregate_id) AS n
       FROM command_status) AS d
WHERE c.ctid = d.ctid AND d.n > 1;
UPDATE command_status SET status = 'rejected' WHERE status = 'failed';
DROP INDEX command_status_status_created_at_idx;
ALTER TABLE command_status
    DROP CONSTRAINT command_status_status_check,
    ADD CONSTRAINT command_status_status_check CHECK (status IN ('pending', 'accepted', 'rejected')),
    DROP CONSTRAINT command_status_pkey,
    ADD PRIMARY KEY (command_id),
    DROP COLUMN ingested;
