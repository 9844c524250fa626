package ingest

import "testing"

// No tenant is named after the scope of work across tenants: a key of a
// tenant "*" would set onceflow.tenant to "*" in its scoped transactions
// and read every tenant's rows (docs/security.md#row-level-security).
func TestNoTenantIsAllTenants(t *testing.T) {
	for _, tenant := range []string{"*", "", "a/b"} {
		if err := validateTenant(tenant); err == nil {
			t.Errorf("tenant %q accepted", tenant)
		}
	}
	for _, tenant := range []string{"acme", "acme.eu", "*acme"} {
		if err := validateTenant(tenant); err != nil {
			t.Errorf("tenant %q refused: %v", tenant, err)
		}
	}
}
