package inventoryapp_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"

	"github.com/onceflow/onceflow/examples/inventory/inventoryapp"
	"github.com/onceflow/onceflow/pipeline/pipelinetest"
	"github.com/onceflow/onceflow/pipeline/postgres"
)

// The inventory's migrations go up (after onceflow's, in the domain's own
// version table), all the way down, and up again.
func TestMigrationsUpDownUp(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := pipelinetest.DatabaseURL(t, postgres.Migrations{Name: inventoryapp.Name, FS: inventoryapp.Migrations})
	cfg, err := pgx.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	db := stdlib.OpenDB(*cfg)
	defer db.Close()
	p, err := goose.NewProvider(goose.DialectPostgres, db, inventoryapp.Migrations,
		goose.WithDisableGlobalRegistry(true), goose.WithTableName("goose_db_version_inventory"))
	if err != nil {
		t.Fatal(err)
	}
	tables := func() int {
		var n int
		if err := db.QueryRowContext(ctx, `SELECT count(*) FROM pg_tables WHERE tablename LIKE 'inventory\_%'`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	if cur, err := p.GetDBVersion(ctx); err != nil || cur != 2 || tables() != 3 {
		t.Fatalf("after the migration: version %d (%v), %d tables; want 2 and 3", cur, err, tables())
	}
	if _, err := p.DownTo(ctx, 0); err != nil {
		t.Fatalf("down: %v", err)
	}
	if n := tables(); n != 0 {
		t.Fatalf("after down: %d inventory tables", n)
	}
	if _, err := p.Up(ctx); err != nil {
		t.Fatalf("up again: %v", err)
	}
	var policies int
	if err := db.QueryRowContext(ctx, `SELECT count(*) FROM pg_policies WHERE tablename LIKE 'inventory\_%'`).Scan(&policies); err != nil || policies != 3 || tables() != 3 {
		t.Fatalf("up again: %d tables, %d policies (%v); want 3 and 3", tables(), policies, err)
	}
}
