-- Projector (issue #13): the transient error a partition is being retried
-- on, so `onceflow lag` shows a partition stuck retrying instead of one
-- silently lagging.
--
-- The projector writes a row for each partition of a batch that failed
-- with an error it retries (the connection, a serialization failure, a
-- missing table...), at its first failure and then at most every 30
-- seconds, outside the failed transaction and best-effort (with Postgres
-- unreachable, nothing is written, and `onceflow lag` cannot read it
-- either). The transaction that next commits a batch of the partition
-- deletes the row. Data errors (SQLSTATE 22, 23, 54) do not retry: they
-- park the partition (projector_parked, reason data-error).

-- +goose Up
CREATE TABLE projector_retrying (
    consumer  text        NOT NULL,
    topic     text        NOT NULL,
    partition int         NOT NULL,
    class     text        NOT NULL,           -- connection, serialization, deadlock, schema, ... (docs/projector.md)
    error     text        NOT NULL,           -- the last error, as the projector logged it
    attempts  bigint      NOT NULL,           -- failed attempts since the first
    since     timestamptz NOT NULL DEFAULT now(),
    last_at   timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer, topic, partition)
);

-- +goose Down
DROP TABLE projector_retrying;
