package onceflow

// Tests of the assembly's internals, with a domain of the ledger's
// aggregate type that needs no application package (examples/ledger's
// ledgerapp imports this one).

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"testing/fstest"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/onceflow/onceflow/examples/ledger"
	"github.com/onceflow/onceflow/pipeline"
	"github.com/onceflow/onceflow/pipeline/kafka"
	"github.com/onceflow/onceflow/pipeline/pipelinetest"
	"github.com/onceflow/onceflow/pipeline/postgres"
	"github.com/twmb/franz-go/pkg/kadm"
)

// testDomain is the ledger's aggregate type without its read models and
// routes.
func testDomain() *Domain {
	var events, commands []pipeline.Message
	for _, t := range ledger.EventTypes() {
		events = append(events, t.(pipeline.Message))
	}
	for _, t := range ledger.CommandTypes() {
		commands = append(commands, t.(pipeline.Message))
	}
	return &Domain{
		Name:   "ledger",
		Events: Schema{Avro: ledger.EventsSchema, Types: events},
		Aggregates: []AggregateType{Aggregate[ledger.Account]{
			Name: "account", Decider: ledger.NewDecider(), Commands: Schema{Avro: ledger.CommandsSchema, Types: commands}, State: ledger.AccountSchema,
		}},
	}
}

// testDeployment is testDomain's deployment with topics' prefix.
func testDeployment(t testing.TB, topics kafka.Topics) *Deployment {
	t.Helper()
	dep, err := newDeployment([]*Domain{testDomain()}, topics.Prefix, topics)
	if err != nil {
		t.Fatal(err)
	}
	return dep
}

// LagSources lists every group of the cluster and every consumer with
// offsets in Postgres once, Postgres winning.
func TestLagSources(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	brokers := pipelinetest.Broker(t).Addrs()
	topics := pipelinetest.Topics(t, brokers, 1)
	pool, _ := pipelinetest.Pool(t)
	adm := kadm.NewClient(pipelinetest.Client(t, brokers))
	for _, g := range []string{"b", "a"} {
		o := kadm.Offsets{}
		o.Add(kadm.Offset{Topic: topics.Events(), Partition: 0, At: 0, LeaderEpoch: -1})
		if _, err := adm.CommitOffsets(ctx, g, o); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := pool.Exec(ctx, `INSERT INTO consumer_offsets (consumer, topic, partition, next_offset) VALUES ('a', $1, 0, 0), ('c', $1, 0, 0)`, topics.Events()); err != nil {
		t.Fatal(err)
	}
	for _, p := range []*pgxpool.Pool{pool, nil} {
		sources, err := testDeployment(t, topics).LagSources(ctx, pipelinetest.Client(t, brokers), p)
		if err != nil {
			t.Fatal(err)
		}
		got := ""
		for _, s := range sources {
			in := "kafka"
			if s.Offsets != nil {
				in = "postgres"
			}
			got += fmt.Sprintf("%s:%s ", s.Group, in)
		}
		want := "a:postgres b:kafka c:postgres "
		if p == nil {
			want = "a:kafka b:kafka "
		}
		if got != want {
			t.Errorf("with pool %v: got %q, want %q", p != nil, got, want)
		}
	}
}

// A database on another machine reached without verified TLS gets a
// warning at start; a local one does not.
func TestWarnPlaintextDatabase(t *testing.T) {
	t.Setenv("PGSSLMODE", "")
	for _, tc := range []struct {
		url  string
		warn bool
	}{
		{"postgres://u:SECRET@db.example:5432/x?sslmode=disable", true},
		{"postgres://u:SECRET@db.example:5432/x", true},
		{"postgres://u:SECRET@db.example:5432/x?sslmode=verify-full", false},
		{"postgres://u:SECRET@127.0.0.1:5432/x?sslmode=disable", false},
	} {
		var out strings.Builder
		ctx, cancel := context.WithCancel(context.Background())
		cancel() // OpenDatabase warns, then stops at the canceled context
		Config{Domains: []*Domain{testDomain()}, DatabaseURL: tc.url, Logger: slog.New(slog.NewTextHandler(&out, nil))}.OpenDatabase(ctx, 1)
		if got := strings.Contains(out.String(), "sslmode=verify-full"); got != tc.warn {
			t.Errorf("%s: warned %v, want %v:\n%s", tc.url, got, tc.warn, out.String())
		}
		if strings.Contains(out.String(), "SECRET") {
			t.Errorf("the warning quotes the password:\n%s", out.String())
		}
	}
}

// Under least privilege a component serves as the runtime role: given
// only DATABASE_URL it refuses a database that needs a migration, naming
// DATABASE_MIGRATION_URL; given both, it migrates as the owner and its
// pool is the runtime role's.
func TestOpenDatabaseWithTwoRoles(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	ownerURL, runtimeURL := pipelinetest.LeastPrivilege(t)
	d := testDomain()
	d.Migrations = fstest.MapFS{"00001_notes.sql": {Data: []byte("-- +goose Up\nCREATE TABLE notes (tenant text, body text);\n-- +goose Down\nDROP TABLE notes;\n")}}
	logger := slog.New(slog.DiscardHandler)
	if _, err := (Config{Domains: []*Domain{d}, DatabaseURL: runtimeURL, Logger: logger}).OpenDatabase(ctx, 2); err == nil || !strings.Contains(err.Error(), "DATABASE_MIGRATION_URL") {
		t.Fatalf("a pending migration with the runtime role only: %v, want an error naming DATABASE_MIGRATION_URL", err)
	}
	pool, err := Config{Domains: []*Domain{d}, DatabaseURL: runtimeURL, DatabaseMigrationURL: ownerURL, Logger: logger}.OpenDatabase(ctx, 2)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	var user string
	if err := pool.QueryRow(ctx, `SELECT current_user`).Scan(&user); err != nil || !strings.HasPrefix(user, "test_runtime_") {
		t.Errorf("the pool connects as %q (%v), want the runtime role", user, err)
	}
	// The domain's new table is the runtime role's to write, not to drop.
	if _, err := pool.Exec(ctx, `INSERT INTO notes VALUES ('a', 'x')`); err != nil {
		t.Errorf("the runtime role writing the domain's new table: %v", err)
	}
	if _, err := pool.Exec(ctx, `DROP TABLE notes`); !postgres.IsInsufficientPrivilege(err) {
		t.Errorf("the runtime role dropping it: %v, want insufficient_privilege", err)
	}
}
