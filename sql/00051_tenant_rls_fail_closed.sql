-- Row-level security fails closed (docs/security.md#row-level-security):
-- a session whose onceflow.tenant is unset or empty sees no row of a
-- table under the tenant policy and may write none. It saw every row,
-- so a connection that forgot its scope (a tool, a new path, a job
-- without its tenant) read every tenant's.
--
-- Work across tenants says so: onceflow.tenant = '*'. The components'
-- and the operator commands' connections set it when they connect
-- (pipeline/postgres.AllTenants, a startup parameter of each session);
-- a transaction that serves one tenant sets its tenant for itself
-- (set_config(..., true)), which holds until it ends. No tenant is '*'.
--
-- Every table under the policy gets it anew, a domain's read models
-- included (they called onceflow_tenant_rls from their migrations).

-- +goose Up
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION onceflow_tenant_rls(tbl regclass) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE format('ALTER TABLE %s ENABLE ROW LEVEL SECURITY', tbl);
    EXECUTE format('ALTER TABLE %s FORCE ROW LEVEL SECURITY', tbl);
    EXECUTE format('DROP POLICY IF EXISTS onceflow_tenant ON %s', tbl);
    EXECUTE format($f$CREATE POLICY onceflow_tenant ON %s
        USING (current_setting('onceflow.tenant', true) IN ('*', tenant))
        WITH CHECK (current_setting('onceflow.tenant', true) IN ('*', tenant))$f$, tbl);
END;
$$;
-- +goose StatementEnd
SELECT onceflow_tenant_rls(format('%I.%I', schemaname, tablename)::regclass)
FROM pg_policies WHERE policyname = 'onceflow_tenant' AND schemaname = current_schema();

-- +goose Down
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION onceflow_tenant_rls(tbl regclass) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE format('ALTER TABLE %s ENABLE ROW LEVEL SECURITY', tbl);
    EXECUTE format('ALTER TABLE %s FORCE ROW LEVEL SECURITY', tbl);
    EXECUTE format('DROP POLICY IF EXISTS onceflow_tenant ON %s', tbl);
    EXECUTE format($f$CREATE POLICY onceflow_tenant ON %s
        USING (coalesce(current_setting('onceflow.tenant', true), '') IN ('', tenant))
        WITH CHECK (coalesce(current_setting('onceflow.tenant', true), '') IN ('', tenant))$f$, tbl);
END;
$$;
-- +goose StatementEnd
SELECT onceflow_tenant_rls(format('%I.%I', schemaname, tablename)::regclass)
FROM pg_policies WHERE policyname = 'onceflow_tenant' AND schemaname = current_schema();
