-- A tenant at its cap of webhook deliveries in flight
-- (ONCEFLOW_WEBHOOK_MAX_PENDING), as the tenant sees it
-- (docs/webhooks.md#the-cap-on-deliveries-in-flight): the worker's fan-out
-- writes the row when it finds the tenant at the cap (at most every few
-- seconds a tenant and worker, never per event) and deletes it when it
-- fans out again; GET /v1/webhooks and a subscription's deliveries answer
-- it while seen_at is recent, so a row left by a worker that stopped
-- ends on its own.

-- +goose Up
CREATE TABLE webhook_capped (
    tenant      text        PRIMARY KEY,
    since       timestamptz NOT NULL,  -- when a fan-out found the tenant at its cap, this time
    seen_at     timestamptz NOT NULL,  -- when a fan-out last found it there
    in_flight   integer     NOT NULL,  -- its deliveries in flight then (counted up to the cap)
    max_pending integer     NOT NULL   -- the cap
);
SELECT onceflow_tenant_rls('webhook_capped');

-- +goose Down
DROP TABLE webhook_capped;
