-- Stored offsets are tied to the log they count (docs/projector.md#a-topic-that-changed):
-- an offset of the events topic means something only on the cluster and
-- the topic it was read from. A topic deleted and created again, a
-- deployment moved to another cluster (the embedded broker of `onceflow
-- dev`, then Apache Kafka) or restored from a backup has the same name and
-- another log; its offsets start again at 0.
--
-- consumer_offsets.cluster_id and topic_id are the identity of the log an
-- offset was stored against: the cluster id and the topic id (KIP-516)
-- the brokers report. cluster_id NULL: not recorded (a row written before
-- this migration); the projector adopts the current identity for such a
-- row at its first start only when its offset lies within the partition's
-- log, and parks it otherwise. topic_id NULL: a broker that reports no
-- topic ids.
--
-- projector_resets is the audit of an operator's answer to a partition
-- parked for a topic that changed or an offset out of its log's range
-- (`onceflow projections reset`): where the partition was and where it now
-- reads from, the identity it was stored against and the one it now
-- counts, the park's reason and detail as they were, the operator's note,
-- who (the name the operator gave, and the database role) and when. Rows
-- are never deleted by onceflow.

-- +goose Up
ALTER TABLE consumer_offsets ADD COLUMN cluster_id text, ADD COLUMN topic_id uuid;

CREATE TABLE projector_resets (
    id              bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    consumer        text        NOT NULL,
    topic           text        NOT NULL,
    partition       int         NOT NULL,
    from_offset     bigint      NOT NULL,  -- the stored offset, of the old log
    to_offset       bigint      NOT NULL,  -- where the partition reads from now
    from_cluster_id text,                  -- the identity the offset was stored against (NULL: not recorded)
    from_topic_id   uuid,
    to_cluster_id   text        NOT NULL,  -- the identity it counts now
    to_topic_id     uuid,
    reason          text        NOT NULL,  -- the park's reason
    detail          text        NOT NULL,  -- the park's detail
    note            text        NOT NULL,  -- why the operator chose so
    operator        text        NOT NULL,  -- who, as the operator said
    db_user         text        NOT NULL DEFAULT session_user,
    reset_at        timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX projector_resets_partition ON projector_resets (consumer, topic, partition, reset_at);

-- +goose Down
DROP TABLE projector_resets;
ALTER TABLE consumer_offsets DROP COLUMN topic_id, DROP COLUMN cluster_id;
