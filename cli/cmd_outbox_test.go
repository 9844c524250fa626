package cli_test

import (
	"bytes"
	"context"
	"path/filepath"
	"strings"
	"testing"

	"github.com/onceflow/onceflow/pipeline/pipelinetest"
	"github.com/onceflow/onceflow/pipeline/postgres"
)

// `onceflow outbox status` shows each shard's backlog, oldest age and
// lease owner, the relays, and the dead rows with the broker's reason; it
// warns about rows nobody ships.
func TestOutboxStatus(t *testing.T) {
	t.Parallel()
	pool, url := pipelinetest.Pool(t, ledgerMigrations)
	ctx := context.Background()
	for _, sql := range []string{
		`INSERT INTO outbox_leases (shard) SELECT generate_series(0, 3)`,
		`UPDATE outbox_leases SET owner = 'relay-1#ab', instance = 'relay-1', token = 4, expires_at = now() + interval '8 s' WHERE shard IN (0, 1)`,
		`INSERT INTO outbox_relays (owner, instance, lease_ms) VALUES ('relay-1#ab', 'relay-1', 10000)`,
		`INSERT INTO outbox (shard, topic, key, value, headers, created_at) VALUES
			(1, 'ledger.commands', 'acme/acc-1', 'x', '{"command-id": "c1"}', now() - interval '90 s'),
			(1, 'ledger.commands', 'acme/acc-1', 'y', '{"command-id": "c2"}', now()),
			(2, 'ledger.commands', 'acme/acc-2', 'z', '{"command-id": "c3"}', now()),
			(7, 'ledger.commands', 'acme/acc-9', 'w', '{"command-id": "c4"}', now())`,
		`INSERT INTO outbox_dead (id, shard, topic, key, value, headers, created_at, reason, detail) VALUES
			(99, 3, 'ledger.commands', 'acme/acc-3', repeat('v', 5000)::bytea, '{"command-id": "c99"}', now(), 'MESSAGE_TOO_LARGE', 'MESSAGE_TOO_LARGE: The message is too large.')`,
	} {
		if _, err := pool.Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	var out bytes.Buffer
	getenv := func(k string) string {
		if k == "DATABASE_URL" {
			return url
		}
		return ""
	}
	if err := run(ctx, []string{"outbox", "status"}, getenv, &out); err != nil {
		t.Fatalf("outbox status: %v\n%s", err, out.String())
	}
	got := out.String()
	for _, want := range []string{
		"SHARD", "relay-1#ab",
		"total  4", // backlog
		"1m30s",    // the oldest row's age
		"relay-1  relay-1#ab  2",
		"dead rows: 1",
		"MESSAGE_TOO_LARGE", "acme/acc-3", "c99", "5000",
		"WARNING: shard 7 has 1 rows but no lease row",
		"WARNING: shard 2 has 1 rows and no live relay",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("output lacks %q:\n%s", want, got)
		}
	}
}

// Without a database the command fails with a message (a non-zero exit).
func TestOutboxStatusNeedsDatabase(t *testing.T) {
	t.Parallel()
	var out bytes.Buffer
	err := run(context.Background(), []string{"outbox", "status"}, func(string) string { return "" }, &out)
	if err == nil || !strings.Contains(err.Error(), "DATABASE_URL") {
		t.Fatalf("got %v, want an error naming DATABASE_URL", err)
	}
	err = run(context.Background(), []string{"outbox", "status"}, func(k string) string {
		if k == "DATABASE_URL" {
			return "postgres://nobody@127.0.0.1:1/none"
		}
		return ""
	}, &out)
	if err == nil {
		t.Fatal("no error with an unreachable database")
	}
}

// An operator command run beside `onceflow dev`, with no DATABASE_URL,
// finds dev's database as it finds dev's broker: the private cluster of
// the data directory (ONCEFLOW_DATA_DIR), when it runs. When none runs,
// it says what to do instead of only that DATABASE_URL is required.
func TestOperatorCommandFindsDevDatabase(t *testing.T) {
	if testing.Short() {
		t.Skip("runs initdb and starts PostgreSQL; skipped with -short")
	}
	if dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin/initdb"); len(dirs) == 0 {
		t.Skip("no PostgreSQL server binaries")
	}
	t.Parallel()
	ctx := context.Background()
	data := filepath.Join(t.TempDir(), ".data")
	local := postgres.Local{Dir: filepath.Join(data, "postgres")}
	url, err := local.Ensure(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { local.Stop(context.Background(), "immediate") })
	env := func(vars map[string]string) func(string) string { return func(k string) string { return vars[k] } }
	var out bytes.Buffer
	if err := run(ctx, []string{"migrate"}, env(map[string]string{"DATABASE_URL": url}), &out); err != nil {
		t.Fatalf("migrate: %v\n%s", err, out.String())
	}

	beside := env(map[string]string{"ONCEFLOW_DATA_DIR": data})
	out.Reset()
	if err := run(ctx, []string{"outbox", "status"}, beside, &out); err != nil || !strings.Contains(out.String(), "SHARD") {
		t.Fatalf("outbox status beside dev, without DATABASE_URL: %v\n%s", err, out.String())
	}

	if err := local.Stop(ctx, "fast"); err != nil {
		t.Fatal(err)
	}
	err = run(ctx, []string{"outbox", "status"}, beside, &out)
	if err == nil || !strings.Contains(err.Error(), "no private cluster of onceflow dev runs in "+filepath.Join(data, "postgres")) ||
		!strings.Contains(err.Error(), "export DATABASE_URL") {
		t.Errorf("outbox status with dev stopped: %v, want what to do", err)
	}
}
