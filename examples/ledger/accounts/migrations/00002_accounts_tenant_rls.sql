-- accounts opts in to the tenant policy (docs/security.md#row-level-security):
-- a read scoped to a tenant (ingest's GET /v1/accounts/{id} runs in one)
-- sees only that tenant's accounts, even if its query forgot the tenant;
-- the projector, which writes every tenant's, leaves the scope unset.

-- +goose Up
SELECT onceflow_tenant_rls('accounts');

-- +goose Down
DROP POLICY onceflow_tenant ON accounts;
ALTER TABLE accounts NO FORCE ROW LEVEL SECURITY, DISABLE ROW LEVEL SECURITY;
