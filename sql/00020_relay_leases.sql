-- Relay (issue #4): fenced per-shard leases, relay membership and dead rows.
--
-- A shard of the outbox is shipped by the relay holding its lease. The lease
-- row carries a fencing token that grows by one each time the shard changes
-- hands; every write a relay makes for a shard (renewal, delete of shipped
-- rows, move to outbox_dead) is conditional on the token it acquired, so a
-- relay that lost its lease (paused, partitioned, slow) changes nothing of
-- a shard another relay now owns. Expiry uses the database clock only.

-- +goose Up

-- outbox_leases has one row per shard, 0 .. shards-1, inserted by the first
-- relay that starts (the number of rows is the deployment's shard count; a
-- relay configured with another count refuses to start).
CREATE TABLE outbox_leases (
    shard       int         PRIMARY KEY CHECK (shard >= 0),
    owner       text,                                  -- "instance#nonce" of the holder, NULL when free
    instance    text,                                  -- the holder's instance id (ONCEFLOW_INSTANCE_ID)
    token       bigint      NOT NULL DEFAULT 0,         -- fencing token: +1 on every acquisition
    expires_at  timestamptz NOT NULL DEFAULT '-infinity',
    acquired_at timestamptz,
    renewed_at  timestamptz
);

-- outbox_relays lists the relay processes, so each can take its fair share
-- (shards / live relays) of the leases. A relay is live while its heartbeat
-- is younger than its lease period.
CREATE TABLE outbox_relays (
    owner        text        PRIMARY KEY,              -- "instance#nonce", one per process start
    instance     text        NOT NULL,
    lease_ms     int         NOT NULL,                 -- the relay's lease period
    started_at   timestamptz NOT NULL DEFAULT now(),
    heartbeat_at timestamptz NOT NULL DEFAULT now()
);

-- outbox_dead keeps the rows the broker will never accept (over its message
-- size limit, an invalid record), with the broker's reason, so one poison
-- row does not stop its shard. `onceflow outbox status` lists them.
CREATE TABLE outbox_dead (
    id         bigint      PRIMARY KEY,                -- the row's outbox id
    shard      int         NOT NULL,
    topic      text        NOT NULL,
    key        bytea       NOT NULL,
    value      bytea       NOT NULL,
    headers    jsonb       NOT NULL,
    created_at timestamptz NOT NULL,                   -- when ingest accepted it
    reason     text        NOT NULL,                   -- the broker's error code, e.g. MESSAGE_TOO_LARGE
    detail     text        NOT NULL,                   -- the full error text
    dead_at    timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX outbox_dead_dead_at ON outbox_dead (dead_at);

-- +goose Down
DROP TABLE outbox_dead;
DROP TABLE outbox_relays;
DROP TABLE outbox_leases;
