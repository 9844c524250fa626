package postgres_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"testing/fstest"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/onceflow/onceflow/examples/ledger/accounts"
	"github.com/onceflow/onceflow/pipeline/pipelinetest"
	"github.com/onceflow/onceflow/pipeline/postgres"
)

func open(t *testing.T, url string) *pgxpool.Pool {
	t.Helper()
	pool, err := postgres.Connect(context.Background(), url, 4)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

func sqlState(err error) string {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return pgErr.Code
	}
	return ""
}

// The runtime role reads and writes the rows of onceflow's tables and
// does nothing else: no DDL, no TRUNCATE, no partition read directly, no
// write to the migration versions; it makes and drops the daily
// partitions through the owner's functions, for the two tables
// partitioned by day only. An up-to-date database lets it start (Migrate
// has nothing to do); one that needs a migration refuses it with
// insufficient_privilege, which the components explain.
func TestRuntimeRole(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	_, runtimeURL := pipelinetest.LeastPrivilege(t)
	rt := open(t, runtimeURL)

	for _, stmt := range []string{
		`INSERT INTO outbox (shard, topic, key, value) VALUES (0, 't', 'k', 'v')`,
		`UPDATE outbox SET topic = 'u'`,
		`DELETE FROM outbox`,
		`INSERT INTO command_status (command_id, tenant, aggregate_id, command_type, status) VALUES (gen_random_uuid(), 'a', 'a/x', 'T', 'pending')`,
		`INSERT INTO consumer_offsets (consumer, topic, partition, next_offset) VALUES ('c', 't', 0, 1)`,
		`SELECT count(*) FROM idempotency_keys`,
		`SELECT max(version_id) FROM goose_db_version`,
	} {
		if _, err := rt.Exec(ctx, stmt); err != nil {
			t.Errorf("%s: %v, want it allowed", stmt, err)
		}
	}
	var partition string
	if err := rt.QueryRow(ctx, `SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
		WHERE i.inhparent = 'idempotency_keys'::regclass LIMIT 1`).Scan(&partition); err != nil {
		t.Fatal(err)
	}
	for _, stmt := range []string{
		`CREATE TABLE mine (x int)`,
		`DROP TABLE outbox`,
		`ALTER TABLE outbox ADD COLUMN x int`,
		`CREATE INDEX ON outbox (topic)`,
		`TRUNCATE outbox`,
		`ALTER TABLE command_status DISABLE ROW LEVEL SECURITY`,
		`DELETE FROM goose_db_version`,
		`SELECT count(*) FROM ` + partition,
		`CREATE FUNCTION f() RETURNS int LANGUAGE sql AS 'SELECT 1'`,
	} {
		if _, err := rt.Exec(ctx, stmt); sqlState(err) != "42501" {
			t.Errorf("%s: got %v, want insufficient_privilege (42501)", stmt, err)
		}
	}

	// Partitions: a week more of idempotency_keys and inbox, dropped again.
	for _, table := range []string{"idempotency_keys", "inbox"} {
		n, err := postgres.EnsureDailyPartitions(ctx, rt, table, 20)
		if err != nil || n == 0 {
			t.Errorf("ensure partitions of %s: %d made, %v; want some made", table, n, err)
		}
		if _, err := postgres.DropDailyPartitions(ctx, rt, table, time.Hour); err != nil {
			t.Errorf("drop partitions of %s: %v", table, err)
		}
	}
	for _, table := range []string{"outbox", "api_keys"} {
		if _, err := postgres.EnsureDailyPartitions(ctx, rt, table, 1); sqlState(err) != "42501" {
			t.Errorf("ensure partitions of %s: %v, want insufficient_privilege", table, err)
		}
		if _, err := postgres.DropDailyPartitions(ctx, rt, table, time.Hour); sqlState(err) != "42501" {
			t.Errorf("drop partitions of %s: %v, want insufficient_privilege", table, err)
		}
	}

	if err := postgres.Migrate(ctx, runtimeURL, nil); err != nil {
		t.Errorf("migrate an up-to-date database as the runtime role: %v, want nothing to do", err)
	}
	pending := postgres.Migrations{Name: "extra", FS: fstest.MapFS{"00001_x.sql": {Data: []byte("-- +goose Up\nCREATE TABLE extra (x int);\n-- +goose Down\nDROP TABLE extra;\n")}}}
	if err := postgres.Migrate(ctx, runtimeURL, nil, pending); !postgres.IsInsufficientPrivilege(err) {
		t.Errorf("migrate a pending migration as the runtime role: %v, want insufficient_privilege", err)
	}
}

// tenantTables are the tables under the tenant policy: onceflow's that
// tenants' requests read or write, and the ledger's accounts, which opts
// in.
var tenantTables = []string{"api_keys", "idempotency_keys", "command_status", "accounts"}

// seedTenants writes a row of tenants a and b into every tenant table.
func seedTenants(t *testing.T, pool *pgxpool.Pool) {
	t.Helper()
	ctx := context.Background()
	for _, tenant := range []string{"a", "b"} {
		for _, stmt := range []string{
			`INSERT INTO api_keys (key_hash, tenant) VALUES (sha256(convert_to($1, 'UTF8')), $1)`,
			`INSERT INTO idempotency_keys (tenant, key, route, request_hash, command_id, response_status, response_headers, response_body)
				VALUES ($1, 'k', 'r', '\x00', gen_random_uuid(), 202, '{}', '')`,
			`INSERT INTO command_status (command_id, tenant, aggregate_id, command_type, status) VALUES (gen_random_uuid(), $1, $1 || '/x', 'T', 'pending')`,
			`INSERT INTO accounts (tenant, account_id, currency, version, updated_at) VALUES ($1, 'x', 'EUR', 1, now())`,
		} {
			if _, err := pool.Exec(ctx, stmt, tenant); err != nil {
				t.Fatalf("seed %s: %s: %v", tenant, stmt, err)
			}
		}
	}
}

// tenantsSeen returns the tenants of the rows of table a query without a
// tenant predicate sees, scoped to tenant ("" leaves the scope unset).
func tenantsSeen(t *testing.T, pool *pgxpool.Pool, tenant, table string) []string {
	t.Helper()
	var seen []string
	err := pgx.BeginFunc(context.Background(), pool, func(tx pgx.Tx) error {
		if tenant != "" {
			if _, err := tx.Exec(context.Background(), `SELECT set_config('onceflow.tenant', $1, true)`, tenant); err != nil {
				return err
			}
		}
		rows, err := tx.Query(context.Background(), `SELECT DISTINCT tenant FROM `+table+` ORDER BY 1`)
		if err != nil {
			return err
		}
		seen, err = pgx.CollectRows(rows, pgx.RowTo[string])
		return err
	})
	if err != nil {
		t.Fatalf("read %s scoped to %q: %v", table, tenant, err)
	}
	return seen
}

// Row-level security as defence in depth: under the runtime role, and
// under the owner too (a deployment with one role: FORCE), a query that
// forgets its tenant predicate in a transaction scoped to a tenant sees
// that tenant's rows and nothing of the other's, and cannot write the
// other's; the writers, whose connections work across tenants
// (postgres.Connect: postgres.AllTenants), see every row.
func TestRowLevelSecurity(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	ownerURL, runtimeURL := pipelinetest.LeastPrivilege(t, postgres.Migrations{Name: "ledger", FS: accounts.Migrations})
	owner, rt := open(t, ownerURL), open(t, runtimeURL)
	seedTenants(t, rt) // the writers' way: no scope
	for _, who := range []struct {
		name string
		pool *pgxpool.Pool
	}{{"runtime", rt}, {"owner", owner}} {
		for _, table := range tenantTables {
			if got := tenantsSeen(t, who.pool, "a", table); !slices.Equal(got, []string{"a"}) {
				t.Errorf("%s, %s scoped to a: saw tenants %v, want [a]", who.name, table, got)
			}
			if got := tenantsSeen(t, who.pool, "nobody", table); len(got) != 0 {
				t.Errorf("%s, %s scoped to a tenant without rows: saw %v, want nothing", who.name, table, got)
			}
			if got := tenantsSeen(t, who.pool, "", table); !slices.Equal(got, []string{"a", "b"}) {
				t.Errorf("%s, %s across tenants: saw tenants %v, want [a b]", who.name, table, got)
			}
		}
	}
	// Writes scoped to a: b's rows are out of reach, and a row of b's is
	// refused.
	tx, err := rt.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, `SELECT set_config('onceflow.tenant', 'a', true)`); err != nil {
		t.Fatal(err)
	}
	for _, table := range tenantTables {
		tag, err := tx.Exec(ctx, `UPDATE `+table+` SET tenant = tenant`)
		if err != nil {
			t.Fatal(err)
		}
		if tag.RowsAffected() != 1 {
			t.Errorf("an update of every row of %s scoped to a touched %d rows, want a's one", table, tag.RowsAffected())
		}
	}
	_, err = tx.Exec(ctx, `INSERT INTO accounts (tenant, account_id, currency, version, updated_at) VALUES ('b', 'y', 'EUR', 1, now())`)
	if sqlState(err) != "42501" || !strings.Contains(err.Error(), "row-level security") {
		t.Errorf("a row of b's written scoped to a: %v, want a row-level security violation", err)
	}
}

// Row-level security fails closed: a session that says no tenant (a
// connection made without postgres.Connect: psql, another program, as the
// runtime role or the owner), or says an empty one, sees no row of a
// table under the policy and may write none; it saw every row. Work
// across tenants says so ('*', what postgres.Connect sets).
func TestRowLevelSecurityFailsClosed(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	ownerURL, runtimeURL := pipelinetest.LeastPrivilege(t, postgres.Migrations{Name: "ledger", FS: accounts.Migrations})
	seedTenants(t, open(t, runtimeURL))
	for _, who := range []struct{ name, url string }{{"runtime", runtimeURL}, {"owner", ownerURL}} {
		conn, err := pgx.Connect(ctx, who.url) // no postgres.AllTenants
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close(ctx)
		for _, scope := range []struct {
			name, set string
			want      int
		}{{"unset", "", 0}, {"empty", "SET onceflow.tenant = ''", 0}, {"across tenants", "SET onceflow.tenant = '*'", 2}} {
			if scope.set != "" {
				if _, err := conn.Exec(ctx, scope.set); err != nil {
					t.Fatal(err)
				}
			}
			for _, table := range tenantTables {
				var n int
				if err := conn.QueryRow(ctx, `SELECT count(DISTINCT tenant) FROM `+table).Scan(&n); err != nil {
					t.Fatal(err)
				}
				if n != scope.want {
					t.Errorf("%s, %s with the scope %s: saw %d tenants' rows, want %d", who.name, table, scope.name, n, scope.want)
				}
			}
			if scope.want > 0 {
				continue
			}
			_, err := conn.Exec(ctx, `INSERT INTO accounts (tenant, account_id, currency, version, updated_at) VALUES ('a', 'z', 'EUR', 1, now())`)
			if sqlState(err) != "42501" || !strings.Contains(err.Error(), "row-level security") {
				t.Errorf("%s, a write with the scope %s: %v, want a row-level security violation", who.name, scope.name, err)
			}
			if tag, err := conn.Exec(ctx, `UPDATE command_status SET status = status`); err != nil || tag.RowsAffected() != 0 {
				t.Errorf("%s, an update of every row with the scope %s: %v rows (%v), want none", who.name, scope.name, tag.RowsAffected(), err)
			}
		}
	}
}
