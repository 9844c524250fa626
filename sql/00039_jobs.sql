-- Jobs and outbound webhooks (docs/jobs.md, docs/webhooks.md).
--
-- 1. Fenced completion of River jobs (docs/jobs.md#what-it-guarantees, docs/decisions/0047-fenced-job-completion.md).
--
-- River hands a job whose attempt outlived its lease (RescueStuckJobsAfter)
-- to another worker, and completes or retries a job with an UPDATE that
-- checks only that the row is running, not which attempt runs it: a
-- worker paused past its lease that wakes up while attempt n+1 runs would
-- finish attempt n+1's row (completed, or retryable with its error), and
-- merge its output into a row another attempt finished.
--
-- onceflow's workers record the attempt they ran as the token
-- metadata.output.onceflow_attempt in every finishing update River makes
-- for them (pipeline/jobs: the fence middleware, and jobs.Complete). This
-- trigger, in the finishing transaction, refuses an update that sets a
-- new token other than the row's current attempt: the late attempt's
-- completion leaves the row as it was. Updates that do not change the
-- token (fetches, the rescuer, cancellation, cleanups) pass.
-- +goose Up
-- +goose StatementBegin
CREATE FUNCTION onceflow_river_job_fence() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    token jsonb := NEW.metadata -> 'output' -> 'onceflow_attempt';
BEGIN
    IF token IS NOT NULL
       AND token IS DISTINCT FROM OLD.metadata -> 'output' -> 'onceflow_attempt'
       AND token <> to_jsonb(OLD.attempt::int) THEN
        RETURN NULL;
    END IF;
    RETURN NEW;
END;
$$;
-- +goose StatementEnd
CREATE TRIGGER onceflow_fence BEFORE UPDATE ON river_job
    FOR EACH ROW EXECUTE FUNCTION onceflow_river_job_fence();

-- The runtime role inserts jobs (river_job's id) and River's notifications.
GRANT USAGE ON SEQUENCE river_job_id_seq, river_notification_id_seq TO onceflow_runtime;

-- 2. Outbound webhooks (docs/webhooks.md#tables).
--
-- webhook_subscriptions: a tenant's endpoints. event_types empty means
-- every event type; secrets are the whsec_ signing secrets, newest first,
-- at most two (rotation: both sign until the old one is dropped). status
-- disabled stops deliveries (a 410, or the tenant); failures and
-- open_until are the endpoint's circuit breaker, shared by every worker.
CREATE TABLE webhook_subscriptions (
    tenant text NOT NULL,
    id uuid NOT NULL,
    url text NOT NULL,
    event_types text[] NOT NULL DEFAULT '{}',
    secrets text[] NOT NULL CHECK (cardinality(secrets) BETWEEN 1 AND 2),
    status text NOT NULL DEFAULT 'enabled' CHECK (status IN ('enabled', 'disabled')),
    disabled_reason text,
    failures int NOT NULL DEFAULT 0,
    open_until timestamptz,
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant, id)
);
SELECT onceflow_tenant_rls('webhook_subscriptions');

-- webhook_deliveries: one row per (subscription, event), written with its
-- job in the projector's transaction (status pending) and then only by
-- the job's current attempt (fenced): delivered with the answer's status,
-- failed (still retrying: the last error), dead (a permanent refusal, the
-- attempts ran out, the endpoint is gone). job_id is its River job;
-- created_at is when the event was projected, delivered_at when the
-- receiver acknowledged it.
CREATE TABLE webhook_deliveries (
    tenant text NOT NULL,
    subscription_id uuid NOT NULL,
    event_id uuid NOT NULL,
    event_type text NOT NULL,
    job_id bigint,
    status text NOT NULL DEFAULT 'pending' CHECK (status IN ('pending', 'delivered', 'failed', 'dead')),
    attempts int NOT NULL DEFAULT 0,
    last_status int,
    last_error text,
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now(),
    delivered_at timestamptz,
    PRIMARY KEY (tenant, subscription_id, event_id)
);
CREATE INDEX webhook_deliveries_recent ON webhook_deliveries (tenant, created_at DESC);
SELECT onceflow_tenant_rls('webhook_deliveries');

-- +goose Down
DROP TABLE webhook_deliveries;
DROP TABLE webhook_subscriptions;
REVOKE USAGE ON SEQUENCE river_job_id_seq, river_notification_id_seq FROM onceflow_runtime;
DROP TRIGGER onceflow_fence ON river_job;
DROP FUNCTION onceflow_river_job_fence();
