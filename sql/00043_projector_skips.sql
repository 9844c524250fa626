-- Projector (docs/projector.md#skipping-a-record): an operator may skip
-- the record a partition is parked on, on purpose, and each skip is kept.
--
-- projector_parked.skip_to is where a skip moves the partition: the
-- record after the parked one (NULL), or past a whole batch when the
-- projector could not read it at all (a batch that decompresses beyond
-- the consumer's bound: its records cannot be told apart).
--
-- projector_skips is the audit of those skips: which partition, from the
-- parked offset to where it went, why it was parked (reason and detail as
-- they were), the operator's note, who (the name the operator gave, and
-- the database role that ran it) and when. Rows are never deleted by
-- onceflow.

-- +goose Up
ALTER TABLE projector_parked ADD COLUMN skip_to bigint;

CREATE TABLE projector_skips (
    id          bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    consumer    text        NOT NULL,
    topic       text        NOT NULL,
    partition   int         NOT NULL,
    from_offset bigint      NOT NULL,  -- the parked record's offset
    to_offset   bigint      NOT NULL,  -- the partition's offset after the skip
    reason      text        NOT NULL,  -- the park's reason
    detail      text        NOT NULL,  -- the park's detail
    note        text        NOT NULL,  -- why the operator skipped it
    operator    text        NOT NULL,  -- who, as the operator said
    db_user     text        NOT NULL DEFAULT session_user,
    skipped_at  timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX projector_skips_partition ON projector_skips (consumer, topic, partition, skipped_at);

-- +goose Down
DROP TABLE projector_skips;
ALTER TABLE projector_parked DROP COLUMN skip_to;
