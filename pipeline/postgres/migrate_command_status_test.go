package postgres_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/onceflow/onceflow/pipeline/pipelinetest"
	"github.com/onceflow/onceflow/pipeline/postgres"
)

// commandStatusScope is sql/00035, which keys command_status by (command
// id, tenant, aggregate id) and adds the failed status.
const commandStatusScope = 35

// The scope migration keeps the rows it finds; under it the same command
// id on two aggregates or in two tenants is two rows, and failed is a
// status; its Down keeps, of each id, the row GET answered by default and
// turns failed into rejected, so that Up runs again.
func TestMigrateCommandStatusScope(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := pipelinetest.EmptyDatabaseURL(t)
	if err := postgres.Migrate(ctx, url, nil); err != nil {
		t.Fatal(err)
	}
	if err := postgres.MigrateDownTo(ctx, url, commandStatusScope-1, nil); err != nil {
		t.Fatalf("down below the scope: %v", err)
	}
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	exec := func(sql string) {
		t.Helper()
		if _, err := conn.Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	rows := func() map[string]string {
		t.Helper()
		rs, err := conn.Query(ctx, `SELECT command_id::text || ' ' || tenant || ' ' || aggregate_id, status FROM command_status`)
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]string{}
		var k, v string
		if _, err := pgx.ForEachRow(rs, []any{&k, &v}, func() error { out[k] = v; return nil }); err != nil {
			t.Fatal(err)
		}
		return out
	}
	const id1, id2 = "01900000-0000-7000-8000-000000000001", "01900000-0000-7000-8000-000000000002"
	exec(`INSERT INTO command_status (command_id, tenant, aggregate_id, command_type, status, event_ids) VALUES
		('` + id1 + `', 'a', 'a/acc-1', 'Deposit', 'accepted', '{01900000-0000-5000-8000-000000000001}'),
		('` + id2 + `', 'a', 'a/acc-1', 'Deposit', 'pending', '{}')`)

	if err := postgres.Migrate(ctx, url, nil); err != nil {
		t.Fatalf("up: %v", err)
	}
	if got := rows(); len(got) != 2 || got[id1+" a a/acc-1"] != "accepted" || got[id2+" a a/acc-1"] != "pending" {
		t.Fatalf("rows after up: %v, want the two rows as they were", got)
	}
	var ingested bool
	if err := conn.QueryRow(ctx, `SELECT bool_or(ingested) FROM command_status`).Scan(&ingested); err != nil || ingested {
		t.Errorf("existing rows ingested = %v (%v), want false", ingested, err)
	}
	// The same id in another tenant and on another aggregate (the ingest
	// row created later), and a failure.
	exec(`INSERT INTO command_status (command_id, tenant, aggregate_id, command_type, status, ingested, created_at) VALUES
		('` + id1 + `', 'b', 'b/acc-1', 'Deposit', 'rejected', false, now()),
		('` + id2 + `', 'a', 'a/acc-2', 'Deposit', 'failed', true, now() + interval '1 second')`)
	if got := rows(); len(got) != 4 {
		t.Fatalf("rows: %v, want 4", got)
	}
	if _, err := conn.Exec(ctx, `INSERT INTO command_status (command_id, tenant, aggregate_id, command_type, status)
		VALUES ('`+id1+`', 'b', 'b/acc-1', 'Deposit', 'accepted')`); err == nil {
		t.Error("a second row of the same (command, tenant, aggregate) was accepted")
	}

	if err := postgres.MigrateDownTo(ctx, url, commandStatusScope-1, nil); err != nil {
		t.Fatalf("down: %v", err)
	}
	// id1: the earlier row stays; id2: ingest's row (now rejected).
	if got := rows(); len(got) != 2 || got[id1+" a a/acc-1"] != "accepted" || got[id2+" a a/acc-2"] != "rejected" {
		t.Fatalf("rows after down: %v, want a's accepted id1 and ingest's id2, rejected", got)
	}
	if err := postgres.Migrate(ctx, url, nil); err != nil {
		t.Fatalf("up again: %v", err)
	}
	if got := rows(); len(got) != 2 {
		t.Fatalf("rows after up again: %v", got)
	}
}
