-- Relay (issue #4): how the relay reads and deletes outbox rows.
--
-- The outbox is a queue: rows are inserted at one end and deleted at the
-- other hundreds of times a second, so between two autovacuum runs most
-- of its tuples, and most entries of its (shard, id) index, are dead. The
-- planner, going by statistics of a table that is nearly empty, then likes
-- a sequential or bitmap scan, which visits every dead tuple on every call,
-- and gets slower the busier the relay is. An index scan in id order stops
-- after the rows it needs and marks the dead index entries it passes, so
-- the next scan skips them. These functions pin that plan (their SET
-- clauses apply when their query is planned) so the relay's latency does
-- not depend on when autovacuum last ran. (PL/pgSQL, not SQL: it keeps
-- its plans between calls.)

-- +goose Up

-- onceflow_outbox_head returns the oldest rows of a shard, in id order,
-- skipping the given ids (rows the caller deletes in the same statement,
-- which its snapshot still shows).
-- +goose StatementBegin
CREATE FUNCTION onceflow_outbox_head(p_shard int, p_limit int, p_skip bigint[] DEFAULT '{}')
RETURNS TABLE (id bigint, topic text, key bytea, value bytea, headers jsonb, created_at timestamptz)
LANGUAGE plpgsql STABLE
SET enable_seqscan = off
SET enable_bitmapscan = off
AS $$
BEGIN
    RETURN QUERY
    SELECT o.id, o.topic, o.key, o.value, o.headers, o.created_at
    FROM outbox o
    WHERE o.shard = p_shard AND o.id <> ALL (p_skip)
    ORDER BY o.id
    LIMIT p_limit;
END;
$$;
-- +goose StatementEnd

-- onceflow_outbox_delete deletes the given rows of a shard by primary key
-- and returns how many it deleted.
-- +goose StatementBegin
CREATE FUNCTION onceflow_outbox_delete(p_shard int, p_ids bigint[])
RETURNS bigint
LANGUAGE plpgsql VOLATILE
SET enable_seqscan = off
SET enable_bitmapscan = off
AS $$
DECLARE
    n bigint;
BEGIN
    DELETE FROM outbox WHERE id = ANY (p_ids) AND shard = p_shard;
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN n;
END;
$$;
-- +goose StatementEnd

-- +goose Down
DROP FUNCTION onceflow_outbox_delete(int, bigint[]);
DROP FUNCTION onceflow_outbox_head(int, int, bigint[]);
