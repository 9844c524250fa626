-- Outbound webhooks, fanned out by the worker (docs/webhooks.md#running-it).
--
-- The projector's transaction writes, for an event that a tenant's
-- subscriptions want, one webhook_events row (the event's body, once),
-- and one fan-out job for the batch's events of each tenant, whatever the
-- number of subscriptions: the job names the range of seq its rows got.
-- The worker's fan-out job then writes the delivery rows and their jobs.
-- The webhook_events row is the lasting memory that an event applied
-- again is not fanned out again; expanded_at says the fan-out ran.
--
-- Both tables keep their rows for the retention
-- (ONCEFLOW_WEBHOOK_RETENTION): the worker's retention job deletes
-- finished deliveries (delivered, dead) and expanded events with no
-- delivery left in flight once they are older than it.

-- +goose Up
CREATE TABLE webhook_events (
    tenant      text        NOT NULL,
    event_id    uuid        NOT NULL,
    seq         bigint      GENERATED ALWAYS AS IDENTITY,  -- the order a fan-out's range is in
    event_type  text        NOT NULL,
    body        bytea       NOT NULL,  -- what every delivery of it POSTs, signed as is
    created_at  timestamptz NOT NULL DEFAULT now(),
    expanded_at timestamptz,
    PRIMARY KEY (tenant, event_id)
);
CREATE INDEX webhook_events_created ON webhook_events (created_at);
-- What a fan-out reads: a tenant's events not fanned out yet, by seq.
CREATE INDEX webhook_events_unexpanded ON webhook_events (tenant, seq) WHERE expanded_at IS NULL;
SELECT onceflow_tenant_rls('webhook_events');

-- A tenant's deliveries in flight: its backlog (the fan-out's cap and
-- priority) and what an event's retention waits for.
CREATE INDEX webhook_deliveries_in_flight ON webhook_deliveries (tenant, event_id) WHERE status IN ('pending', 'failed');
-- Finished deliveries by age, for the retention.
CREATE INDEX webhook_deliveries_finished ON webhook_deliveries (updated_at) WHERE status IN ('delivered', 'dead');

-- +goose Down
DROP INDEX webhook_deliveries_finished;
DROP INDEX webhook_deliveries_in_flight;
DROP TABLE webhook_events;
