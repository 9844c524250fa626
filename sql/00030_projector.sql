-- The projector's tables: a day-partitioned inbox (retention by dropping
-- partitions), the audit log, parked partitions (visible to `onceflow lag`)
-- and the record of projection rebuilds.

-- +goose Up

-- inbox is partitioned by received_at, one partition per UTC day named
-- inbox_pYYYYMMDD, so the janitor drops a day's ids at once instead of
-- deleting rows. Postgres cannot enforce a unique (consumer, event_id)
-- across range partitions, so the primary key includes received_at and the
-- projector guarantees uniqueness itself: it inserts an id only after a
-- lookup over the live partitions (onceflow_inbox_seen), in a transaction
-- that first locks the consumer's offset row of the event's Kafka
-- partition. An event id belongs to one aggregate, hence to one Kafka
-- partition, so every transaction that could insert it is serialized on
-- that row lock (docs/decisions/0033-inbox-unique-by-protocol.md). event_id leads the key: lookups are by
-- id, and no plan can mistake "all of a consumer's rows" for a lookup.
ALTER TABLE inbox RENAME TO inbox_unpartitioned;
ALTER TABLE inbox_unpartitioned RENAME CONSTRAINT inbox_pkey TO inbox_unpartitioned_pkey;
CREATE TABLE inbox (
    consumer    text        NOT NULL,
    event_id    uuid        NOT NULL,
    received_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (event_id, consumer, received_at)
) PARTITION BY RANGE (received_at);
-- Partitions from the oldest row kept (at most 30 days back) to a week ahead.
SELECT onceflow_ensure_daily_partitions('inbox', first_day, ((now() AT TIME ZONE 'UTC')::date + 8 - first_day))
FROM (
    SELECT GREATEST(LEAST(min((received_at AT TIME ZONE 'UTC')::date), (now() AT TIME ZONE 'UTC')::date - 1),
                    (now() AT TIME ZONE 'UTC')::date - 30) AS first_day
    FROM inbox_unpartitioned
) s;
INSERT INTO inbox (consumer, event_id, received_at)
SELECT consumer, event_id, received_at FROM inbox_unpartitioned
WHERE received_at >= (now() AT TIME ZONE 'UTC')::date - 30;
DROP TABLE inbox_unpartitioned;

-- onceflow_inbox_seen returns which of ids consumer's inbox holds, looking
-- in the partitions from since (the earliest day an id could have been
-- stored; '-infinity' looks everywhere) to tomorrow. It probes the primary
-- key once per id and partition: the planner, which prices a few thousand
-- probes above a scan of a partition it believes small, would otherwise
-- scan whole partitions, and a day of a busy inbox holds millions of rows.
-- +goose StatementBegin
CREATE FUNCTION onceflow_inbox_seen(consumer text, ids uuid[], since timestamptz)
RETURNS SETOF uuid LANGUAGE sql STABLE
SET enable_seqscan = off SET enable_bitmapscan = off
AS $$
    SELECT i.event_id FROM inbox i
    WHERE i.event_id = ANY (ids) AND i.consumer = onceflow_inbox_seen.consumer
      AND i.received_at >= since AND i.received_at < now() + interval '1 day'
$$;
-- +goose StatementEnd

-- audit_log records every event the projector applied, once (event_id is
-- the primary key), permanently. payload is the event's fields as JSON.
CREATE TABLE audit_log (
    event_id     uuid        PRIMARY KEY,
    tenant       text        NOT NULL,
    aggregate_id text        NOT NULL,
    version      bigint      NOT NULL,
    event_type   text        NOT NULL,
    command_id   uuid        NOT NULL,
    payload      jsonb       NOT NULL,
    occurred_at  timestamptz NOT NULL       -- the event's time (its command's time)
);
CREATE INDEX audit_log_aggregate ON audit_log (aggregate_id, version);

-- projector_parked lists the partitions a projector stopped on (a version
-- gap, an undecodable event, an event a projection refused) and the offset
-- of that record; consumer_offsets holds the same offset. A row stays until
-- the partition moves past that offset or an operator removes it
-- (`onceflow projections unpark`), which makes the projector try again.
CREATE TABLE projector_parked (
    consumer    text        NOT NULL,
    topic       text        NOT NULL,
    partition   int         NOT NULL,
    next_offset bigint      NOT NULL,
    reason      text        NOT NULL,       -- version-gap, undecodable, rejected-by-projection
    detail      text        NOT NULL,
    parked_at   timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer, topic, partition)
);

-- projection_rebuilds records each `onceflow projections rebuild`: the
-- shadow schema its tables are built in and the consumer name its offsets
-- and inbox rows use. A building row is resumed by the next rebuild of the
-- same projection.
CREATE TABLE projection_rebuilds (
    shadow_consumer text        PRIMARY KEY,
    consumer        text        NOT NULL,   -- the live projector's consumer
    projection      text        NOT NULL,
    shadow_schema   text        NOT NULL,
    state           text        NOT NULL CHECK (state IN ('building', 'swapped', 'abandoned')),
    started_at      timestamptz NOT NULL DEFAULT now(),
    finished_at     timestamptz,
    detail          text        NOT NULL DEFAULT ''
);
CREATE UNIQUE INDEX projection_rebuilds_building ON projection_rebuilds (consumer, projection) WHERE state = 'building';

-- +goose Down
DROP FUNCTION onceflow_inbox_seen(text, uuid[], timestamptz);
DROP TABLE projection_rebuilds;
DROP TABLE projector_parked;
DROP TABLE audit_log;
CREATE TABLE inbox_unpartitioned (
    consumer    text        NOT NULL,
    event_id    uuid        NOT NULL,
    received_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer, event_id)
);
INSERT INTO inbox_unpartitioned (consumer, event_id, received_at)
SELECT DISTINCT ON (consumer, event_id) consumer, event_id, received_at FROM inbox
ORDER BY consumer, event_id, received_at;
DROP TABLE inbox;
ALTER TABLE inbox_unpartitioned RENAME TO inbox;
ALTER TABLE inbox RENAME CONSTRAINT inbox_unpartitioned_pkey TO inbox_pkey;
