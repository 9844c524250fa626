-- Relay (issue #4): ship a shard in the order its rows' transactions
-- started, and read on from where the last batch ended.
--
-- Until now the relay read a shard from its head (its lowest ids) for every
-- batch, because an id says nothing about when its row becomes visible: a
-- transaction can draw id 10 and commit after id 11 was shipped. Reading
-- from the head walks the (shard, id) index over every row deleted since
-- the last vacuum and over the batch being deleted, which was most of
-- Postgres's time while a backlog drained.
--
-- Each row now records the transaction that wrote it (xid, a 64-bit id that
-- never wraps), and a shard ships in (xid, id) order. That order keeps an
-- aggregate's commands in ingest order as the id order did: a command
-- accepted (committed) before the next one's request starts has the lower
-- xid, and one transaction's rows keep their id order. What it adds is a
-- point past which nothing can appear: a row whose xid is below the
-- snapshot's xmin, the oldest transaction still running, is "settled",
-- since every transaction that could write a row before it in this order
-- has ended. So after a batch whose last row was settled, the next read
-- starts after that row instead of at the head: it walks only rows not
-- yet shipped.
--
-- A row above the horizon (its transaction is younger than one still
-- running, anywhere in the cluster) is never held back by that: the cursor
-- read only reports that such rows exist, and the relay reads from the
-- head, which ships every visible row, as before. A long transaction
-- elsewhere therefore costs head reads, not latency.
--
-- The rows in the outbox when this runs all get this migration's xid, so
-- they keep their id order and go out before anything written after.
-- Adding the column rewrites the outbox and builds the new index under an
-- exclusive lock: ingest waits for it, as long as the backlog takes to
-- copy (seconds for a relay that keeps up; drain a large backlog first).
-- Relays of the previous version stop being able to read the outbox once
-- this has run (their functions are gone): they back off and retry until
-- they are replaced; nothing is lost, and their leases expire to new relays.

-- +goose Up
ALTER TABLE outbox ADD COLUMN xid xid8 NOT NULL DEFAULT pg_current_xact_id();
CREATE INDEX outbox_shard_xid_id ON outbox (shard, xid, id);
DROP INDEX outbox_shard_id;
DROP FUNCTION onceflow_outbox_heads(int[], int);
DROP FUNCTION onceflow_outbox_head(int, int, bigint[]);

-- onceflow_outbox_next returns a shard's next rows in (xid, id) order, each
-- with whether it is settled (xid below the statement's xmin).
--
-- Without p_after_id it reads from the head, skipping p_skip (the rows the
-- caller deletes in the same statement, which its snapshot still shows).
--
-- With p_after_id, the caller's last row, which was settled, it reads the
-- settled rows after it: every row before it has been read, and none can
-- still appear there. When that finds fewer than p_limit rows while rows
-- above the horizon wait, it adds a last row whose columns are all NULL
-- but settled, which is false: "read from the head before going idle".
-- +goose StatementBegin
CREATE FUNCTION onceflow_outbox_next(p_shard int, p_limit int, p_skip bigint[] DEFAULT '{}',
    p_after_xid xid8 DEFAULT NULL, p_after_id bigint DEFAULT NULL)
RETURNS TABLE (id bigint, xid xid8, settled bool, topic text, key bytea, value bytea, headers jsonb, created_at timestamptz)
LANGUAGE plpgsql STABLE
SET enable_seqscan = off
SET enable_bitmapscan = off
AS $$
DECLARE
    -- STABLE: the function runs in its caller's snapshot, the one that
    -- decides which rows are visible.
    horizon xid8 := pg_snapshot_xmin(pg_current_snapshot());
    n bigint;
BEGIN
    IF p_after_id IS NULL THEN
        RETURN QUERY
        SELECT o.id, o.xid, o.xid < horizon, o.topic, o.key, o.value, o.headers, o.created_at
        FROM outbox o
        WHERE o.shard = p_shard AND o.id NOT IN (SELECT unnest(p_skip))
        ORDER BY o.xid, o.id
        LIMIT p_limit;
        RETURN;
    END IF;
    -- (The rows being deleted are all at or before p_after: no skip.)
    RETURN QUERY
    SELECT o.id, o.xid, true, o.topic, o.key, o.value, o.headers, o.created_at
    FROM outbox o
    WHERE o.shard = p_shard AND (o.xid, o.id) > (p_after_xid, p_after_id) AND o.xid < horizon
    ORDER BY o.xid, o.id
    LIMIT p_limit;
    GET DIAGNOSTICS n = ROW_COUNT;
    IF n < p_limit AND EXISTS (SELECT 1 FROM outbox o WHERE o.shard = p_shard AND o.xid >= horizon) THEN
        RETURN QUERY SELECT NULL::bigint, NULL::xid8, false, NULL::text, NULL::bytea, NULL::bytea, NULL::jsonb, NULL::timestamptz;
    END IF;
END;
$$;
-- +goose StatementEnd

-- onceflow_outbox_heads is onceflow_outbox_next from the head for several
-- shards in one call (the dispatcher reads every idle shard at a wake-up).
-- +goose StatementBegin
CREATE FUNCTION onceflow_outbox_heads(p_shards int[], p_limit int)
RETURNS TABLE (shard int, id bigint, xid xid8, settled bool, topic text, key bytea, value bytea, headers jsonb, created_at timestamptz)
LANGUAGE plpgsql STABLE
SET enable_seqscan = off
SET enable_bitmapscan = off
AS $$
DECLARE
    horizon xid8 := pg_snapshot_xmin(pg_current_snapshot());
BEGIN
    RETURN QUERY
    SELECT s.shard, o.id, o.xid, o.xid < horizon, o.topic, o.key, o.value, o.headers, o.created_at
    FROM unnest(p_shards) AS s(shard)
    JOIN LATERAL (
        SELECT x.id, x.xid, x.topic, x.key, x.value, x.headers, x.created_at
        FROM outbox x
        WHERE x.shard = s.shard
        ORDER BY x.xid, x.id
        LIMIT p_limit
    ) o ON true;
END;
$$;
-- +goose StatementEnd

-- +goose Down
DROP FUNCTION onceflow_outbox_heads(int[], int);
DROP FUNCTION onceflow_outbox_next(int, int, bigint[], xid8, bigint);
CREATE INDEX outbox_shard_id ON outbox (shard, id);
DROP INDEX outbox_shard_xid_id;
ALTER TABLE outbox DROP COLUMN xid;

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
    WHERE o.shard = p_shard AND o.id NOT IN (SELECT unnest(p_skip))
    ORDER BY o.id
    LIMIT p_limit;
END;
$$;
-- +goose StatementEnd

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
