package postgres_test

import (
	"context"
	"slices"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/onceflow/onceflow/pipeline/pipelinetest"
	"github.com/onceflow/onceflow/pipeline/postgres"
)

// The foundation's tables must exist after up, be gone after down, and
// come back after up again: a Down section that misses something makes the
// second Up fail.
func TestMigrateUpDownUp(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := pipelinetest.EmptyDatabaseURL(t)
	want := []string{"api_keys", "idempotency_keys", "outbox", "inbox", "consumer_offsets", "command_status"}

	if err := postgres.Migrate(ctx, url, nil); err != nil {
		t.Fatalf("up: %v", err)
	}
	vs, err := postgres.MigrationVersions(ctx, url)
	if err != nil || len(vs) != 1 || vs[0].Current != vs[0].Latest || vs[0].Current == 0 {
		t.Fatalf("after up: versions %+v, err %v", vs, err)
	}
	assertTables(t, url, want, true)
	if err := postgres.MigrateDownTo(ctx, url, 0, nil); err != nil {
		t.Fatalf("down: %v", err)
	}
	assertTables(t, url, want, false)
	if err := postgres.Migrate(ctx, url, nil); err != nil {
		t.Fatalf("up again: %v", err)
	}
	assertTables(t, url, want, true)
	// Up is idempotent.
	if err := postgres.Migrate(ctx, url, nil); err != nil {
		t.Fatalf("up a third time: %v", err)
	}
}

// Components start together and each migrates: concurrent Migrate calls
// must all succeed and apply each migration once.
func TestMigrateConcurrently(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := pipelinetest.EmptyDatabaseURL(t)
	errs := make(chan error, 4)
	for i := 0; i < 4; i++ {
		go func() { errs <- postgres.Migrate(ctx, url, nil) }()
	}
	for i := 0; i < 4; i++ {
		if err := <-errs; err != nil {
			t.Fatalf("concurrent migrate: %v", err)
		}
	}
	assertTables(t, url, []string{"outbox"}, true)
}

func assertTables(t *testing.T, url string, tables []string, exist bool) {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	for _, table := range tables {
		var got bool
		if err := conn.QueryRow(ctx, "SELECT to_regclass($1) IS NOT NULL", table).Scan(&got); err != nil {
			t.Fatal(err)
		}
		if got != exist {
			t.Errorf("table %s exists = %v, want %v", table, got, exist)
		}
	}
}

func TestDailyPartitions(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, _ := pipelinetest.Pool(t)
	// The migration made yesterday through a week ahead; asking again
	// creates nothing, asking further creates the missing days.
	n, err := postgres.EnsureDailyPartitions(ctx, pool, "idempotency_keys", 7)
	if err != nil || n != 0 {
		t.Fatalf("ensure 7 ahead: created %d, err %v; want 0, nil", n, err)
	}
	n, err = postgres.EnsureDailyPartitions(ctx, pool, "idempotency_keys", 9)
	if err != nil || n != 2 {
		t.Fatalf("ensure 9 ahead: created %d, err %v; want 2, nil", n, err)
	}
	if _, err := pool.Exec(ctx, `INSERT INTO idempotency_keys
		(tenant, key, route, request_hash, command_id, response_status, response_headers, response_body, created_at)
		VALUES ('t', 'k', 'r', '\x00', gen_random_uuid(), 202, '{}', '', now() - interval '1 day')`); err != nil {
		t.Fatalf("insert into yesterday: %v", err)
	}
	// A retention of zero drops every day that has already ended:
	// yesterday, never today.
	dropped, err := postgres.DropDailyPartitions(ctx, pool, "idempotency_keys", 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(dropped) != 1 {
		t.Fatalf("dropped %v, want yesterday's partition only", dropped)
	}
	var rows int
	if err := pool.QueryRow(ctx, "SELECT count(*) FROM idempotency_keys").Scan(&rows); err != nil || rows != 0 {
		t.Fatalf("rows left after dropping yesterday: %d, %v", rows, err)
	}
	// Today dropped too: an insert finds no partition, and says so in a way
	// IsMissingPartition recognizes whatever the server's language.
	if _, err := pool.Exec(ctx, `SELECT onceflow_drop_daily_partitions('idempotency_keys', now() + interval '30 days')`); err != nil {
		t.Fatal(err)
	}
	_, err = pool.Exec(ctx, `INSERT INTO idempotency_keys
		(tenant, key, route, request_hash, command_id, response_status, response_headers, response_body)
		VALUES ('t', 'k', 'r', '\x00', gen_random_uuid(), 202, '{}', '')`)
	if !postgres.IsMissingPartition(err, "idempotency_keys") {
		t.Fatalf("insert with no partition for today: %v, want IsMissingPartition", err)
	}
	if postgres.IsMissingPartition(err, "inbox") {
		t.Fatal("IsMissingPartition names the wrong table")
	}
}

// The functions on the hot paths that Postgres would plan again at every call
// keep their generic plan (sql/00046;
// docs/decisions/0035-hot-functions-pin-their-plans.md): a later CREATE OR
// REPLACE without the setting would bring the planning back unseen, since
// pg_stat_statements does not count it.
func TestHotFunctionsKeepTheirGenericPlan(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, _ := pipelinetest.Pool(t)
	for _, fn := range []string{"onceflow_outbox_heads(int[], int)", "onceflow_inbox_seen(text, uuid[], timestamptz)"} {
		var config []string
		if err := pool.QueryRow(ctx, `SELECT coalesce(proconfig, '{}') FROM pg_proc WHERE oid = $1::regprocedure`, fn).Scan(&config); err != nil {
			t.Fatalf("%s: %v", fn, err)
		}
		if !slices.Contains(config, "plan_cache_mode=force_generic_plan") {
			t.Errorf("%s runs with %v, want plan_cache_mode=force_generic_plan among them", fn, config)
		}
	}
}
