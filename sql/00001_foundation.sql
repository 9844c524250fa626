-- The tables the first end-to-end slice needs (docs/architecture.md#postgres-tables).

-- +goose Up

-- api_keys maps a hashed API key to its tenant. The key itself is shown once
-- by `onceflow tenants create` and never stored.
CREATE TABLE api_keys (
    key_hash   bytea PRIMARY KEY,          -- SHA-256 of the key
    tenant     text        NOT NULL,
    name       text        NOT NULL DEFAULT '',
    created_at timestamptz NOT NULL DEFAULT now(),
    revoked_at timestamptz
);
CREATE INDEX api_keys_tenant ON api_keys (tenant);

-- idempotency_keys remembers each (tenant, Idempotency-Key) with the hash of
-- the normalized request, the command it created and the response sent, so
-- a retry gets the same response. Retention is by dropping daily partitions.
-- Postgres cannot enforce a unique (tenant, key) across range partitions;
-- ingest guards it with a transaction-level advisory lock on hash(tenant,
-- key) plus a lookup over the live partitions (docs/ingest.md#idempotency-key).
CREATE TABLE idempotency_keys (
    tenant           text        NOT NULL,
    key              text        NOT NULL,
    route            text        NOT NULL,
    request_hash     bytea       NOT NULL,
    command_id       uuid        NOT NULL,
    response_status  int         NOT NULL,
    response_headers jsonb       NOT NULL,
    response_body    bytea       NOT NULL,
    created_at       timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant, key, created_at)
) PARTITION BY RANGE (created_at);

-- onceflow_ensure_daily_partitions creates the daily partitions of parent
-- (named parent_pYYYYMMDD, UTC days) from first_day for days days, skipping
-- those that exist, and returns how many it created. Callers: migrate,
-- component start and the retention janitor.
-- +goose StatementBegin
CREATE FUNCTION onceflow_ensure_daily_partitions(parent text, first_day date, days int)
RETURNS int LANGUAGE plpgsql AS $$
DECLARE
    d       date;
    name    text;
    created int := 0;
BEGIN
    -- Two processes creating the same partition at once would collide.
    PERFORM pg_advisory_xact_lock(hashtextextended('onceflow_partitions:' || parent, 0));
    FOR i IN 0 .. days - 1 LOOP
        d := first_day + i;
        name := parent || '_p' || to_char(d, 'YYYYMMDD');
        IF to_regclass(name) IS NULL THEN
            EXECUTE format(
                'CREATE TABLE %I PARTITION OF %I FOR VALUES FROM (%L) TO (%L)',
                name, parent,
                (d::timestamp AT TIME ZONE 'UTC'),
                ((d + 1)::timestamp AT TIME ZONE 'UTC'));
            created := created + 1;
        END IF;
    END LOOP;
    RETURN created;
END;
$$;
-- +goose StatementEnd

-- onceflow_drop_daily_partitions drops the daily partitions of parent whose
-- whole day ended before cutoff and returns their names.
-- +goose StatementBegin
CREATE FUNCTION onceflow_drop_daily_partitions(parent text, cutoff timestamptz)
RETURNS SETOF text LANGUAGE plpgsql AS $$
DECLARE
    part record;
BEGIN
    PERFORM pg_advisory_xact_lock(hashtextextended('onceflow_partitions:' || parent, 0));
    FOR part IN
        SELECT c.relname
        FROM pg_inherits i
        JOIN pg_class c ON c.oid = i.inhrelid
        WHERE i.inhparent = parent::regclass
          AND c.relname ~ ('^' || parent || '_p[0-9]{8}$')
          AND (to_date(right(c.relname, 8), 'YYYYMMDD') + 1)::timestamp AT TIME ZONE 'UTC' <= cutoff
        ORDER BY c.relname
    LOOP
        EXECUTE format('DROP TABLE %I', part.relname);
        RETURN NEXT part.relname;
    END LOOP;
END;
$$;
-- +goose StatementEnd

SELECT onceflow_ensure_daily_partitions('idempotency_keys', (now() AT TIME ZONE 'UTC')::date - 1, 9);

-- outbox holds commands accepted by ingest until the relay has shipped them
-- to Kafka. The shard (hash of the aggregate id) is what a relay leases, so
-- one aggregate's rows are shipped by one relay at a time, in id order.
CREATE TABLE outbox (
    id         bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    shard      int         NOT NULL,
    topic      text        NOT NULL,
    key        bytea       NOT NULL,
    value      bytea       NOT NULL,
    headers    jsonb       NOT NULL DEFAULT '{}',  -- {"command-id": "...", "tenant": "...", ...}
    created_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX outbox_shard_id ON outbox (shard, id);

-- inbox records which events each consumer has applied; the insert happens
-- in the transaction that applies the event.
CREATE TABLE inbox (
    consumer    text        NOT NULL,
    event_id    uuid        NOT NULL,
    received_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer, event_id)
);

-- consumer_offsets is where projectors keep their Kafka positions, written
-- in the transaction that applies the events before them.
CREATE TABLE consumer_offsets (
    consumer    text        NOT NULL,
    topic       text        NOT NULL,
    partition   int         NOT NULL,
    next_offset bigint      NOT NULL,
    updated_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer, topic, partition)
);

-- command_status is each command's outcome: pending when ingest accepts it,
-- then accepted (with the events it produced) or rejected (with the reason)
-- once the projector sees its outcome.
CREATE TABLE command_status (
    command_id   uuid        PRIMARY KEY,
    tenant       text        NOT NULL,
    aggregate_id text        NOT NULL,
    command_type text        NOT NULL,
    status       text        NOT NULL CHECK (status IN ('pending', 'accepted', 'rejected')),
    reason       text,                          -- machine-readable rejection reason
    detail       text,                          -- human-readable rejection detail
    event_ids    uuid[]      NOT NULL DEFAULT '{}',
    created_at   timestamptz NOT NULL DEFAULT now(),
    updated_at   timestamptz NOT NULL DEFAULT now()
);

-- +goose Down
DROP TABLE command_status;
DROP TABLE consumer_offsets;
DROP TABLE inbox;
DROP TABLE outbox;
DROP FUNCTION onceflow_drop_daily_partitions(text, timestamptz);
DROP FUNCTION onceflow_ensure_daily_partitions(text, date, int);
DROP TABLE idempotency_keys;
DROP TABLE api_keys;
