-- A tenant at its cap of webhook deliveries in flight has one fan-out
-- waiting, not one per projector batch (docs/webhooks.md#the-cap-on-deliveries-in-flight).
--
-- webhook_fanout_waiting names it: the fan-out that found the tenant at
-- its cap and had no other waiting writes its job id here and snoozes; a
-- fan-out that finds another waiting (its job in a waiting state) leaves
-- its events unexpanded in webhook_events and completes. The waiting one,
-- once the tenant is below its cap, deletes the row in the transaction of
-- its first fan-out and fans out every event of the tenant not expanded
-- yet. queued is how many of the tenant's events wait unexpanded: counted
-- when the row is written, and the projector adds its batches'; past
-- the bound (webhooks.Router.MaxQueued) the projector stores an event
-- refused, without its body, and its fan-out makes each of its deliveries
-- dead with the reason, so nothing is dropped unseen.
--
-- webhook_subscriptions.disabled_at is when the endpoint was disabled: a
-- fan-out makes deliveries for the subscriptions enabled when the event
-- was stored, those disabled since included (their jobs end them dead,
-- "the endpoint is disabled").

-- +goose Up
CREATE TABLE webhook_fanout_waiting (
    tenant text        PRIMARY KEY,
    job_id bigint      NOT NULL,  -- the waiting webhook_fanout job
    queued bigint      NOT NULL,  -- the tenant's events not fanned out
    since  timestamptz NOT NULL DEFAULT now()
);
SELECT onceflow_tenant_rls('webhook_fanout_waiting');
ALTER TABLE webhook_subscriptions ADD COLUMN disabled_at timestamptz;
ALTER TABLE webhook_events ADD COLUMN refused boolean NOT NULL DEFAULT false;

-- +goose Down
ALTER TABLE webhook_events DROP COLUMN refused;
ALTER TABLE webhook_subscriptions DROP COLUMN disabled_at;
DROP TABLE webhook_fanout_waiting;
