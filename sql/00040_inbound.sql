-- Inbound webhooks (issue #17, docs/inbound.md): the events providers
-- deliver to POST /v1/inbound/{provider}, each kept once.
--
-- inbound_events holds one row per (provider, provider's event id), written
-- in the transaction that turns the event into a command (the outbox row
-- and the pending command_status row of that command, as ingest writes
-- them for an HTTP command). A delivery of an event already stored counts
-- on its row (deliveries, last_delivery_at) and writes nothing else, so a
-- provider's retries, concurrent or days apart, make one command. Rows
-- older than the retention (ONCEFLOW_INBOUND_RETENTION, 30 days: longer
-- than any provider's retry schedule) are deleted by ingest's janitor.
--
-- status says what the event did:
--   enqueued   it became command_id, of command_type, for aggregate_id;
--   superseded it arrived after an event of the same aggregate that wins
--              over it (a higher version, or a higher precedence: a late
--              payment.failed after a payment.succeeded), so it made no
--              command;
--   recorded   it won, and its type is configured to make no command;
--   ignored    its type is not in the provider's configuration.
--
-- inbound_aggregates is, per provider and aggregate, the event that last
-- won (its version and precedence): the one row an arriving event is
-- compared with, under its row lock. It outlives the events' retention on
-- purpose: a delivery of an old event must still lose to a higher version
-- or precedence that came after it. (An old event that made a command is
-- recognized by that command's command_status row, kept for good: ingest
-- makes no second one.)

-- +goose Up
CREATE TABLE inbound_events (
    provider         text        NOT NULL,
    event_id         text        NOT NULL,
    event_type       text        NOT NULL,
    tenant           text        NOT NULL,
    aggregate_id     text,                   -- tenant/local id; NULL for an ignored type
    version          bigint,                 -- the provider's version or sequence, when configured
    precedence       int         NOT NULL DEFAULT 0,
    status           text        NOT NULL DEFAULT 'received'
                     CHECK (status IN ('received', 'enqueued', 'recorded', 'superseded', 'ignored')),
    command_id       uuid,
    command_type     text,
    payload          bytea       NOT NULL,   -- the body as delivered, for audits and redrives
    received_at      timestamptz NOT NULL DEFAULT now(),
    deliveries       int         NOT NULL DEFAULT 1,
    last_delivery_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (provider, event_id)
);
CREATE INDEX inbound_events_received_at ON inbound_events (received_at);
CREATE INDEX inbound_events_command_id ON inbound_events (command_id) WHERE command_id IS NOT NULL;

CREATE TABLE inbound_aggregates (
    provider     text        NOT NULL,
    aggregate_id text        NOT NULL,
    event_id     text        NOT NULL,
    event_type   text        NOT NULL,
    version      bigint,
    precedence   int         NOT NULL,
    updated_at   timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (provider, aggregate_id)
);

-- +goose Down
DROP TABLE inbound_aggregates;
DROP TABLE inbound_events;
