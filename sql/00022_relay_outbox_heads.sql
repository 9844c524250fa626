-- Relay (issue #4): the heads of several shards in one call.
--
-- The relay's dispatcher reads the oldest rows of every idle shard at each
-- wake-up. Calling onceflow_outbox_head once per shard pays the function's
-- SET clauses once per shard; this does it once for all of them, with the
-- same pinned index-order plan (see 00021).

-- +goose Up

-- +goose StatementBegin
CREATE FUNCTION onceflow_outbox_heads(p_shards int[], p_limit int)
RETURNS TABLE (shard int, id bigint, topic text, key bytea, value bytea, headers jsonb, created_at timestamptz)
LANGUAGE plpgsql STABLE
SET enable_seqscan = off
SET enable_bitmapscan = off
AS $$
BEGIN
    RETURN QUERY
    SELECT s.shard, o.id, o.topic, o.key, o.value, o.headers, o.created_at
    FROM unnest(p_shards) AS s(shard)
    JOIN LATERAL (
        SELECT x.id, x.topic, x.key, x.value, x.headers, x.created_at
        FROM outbox x
        WHERE x.shard = s.shard
        ORDER BY x.id
        LIMIT p_limit
    ) o ON true;
END;
$$;
-- +goose StatementEnd

-- +goose Down
DROP FUNCTION onceflow_outbox_heads(int[], int);
