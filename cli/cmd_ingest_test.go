package cli_test

import (
	"bytes"
	"context"
	"log/slog"
	"net"
	"net/http"
	"regexp"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/onceflow/onceflow/examples/ledger/ledgerapp"
	"github.com/onceflow/onceflow/pipeline/apiclient"
	"github.com/onceflow/onceflow/pipeline/ingest"
	"github.com/onceflow/onceflow/pipeline/kafka"
	"github.com/onceflow/onceflow/pipeline/pipelinetest"
	"github.com/onceflow/onceflow/pipeline/postgres"
)

// `tenants create` prints a key once, stores only its hash, and the key
// works against ingest; `idempotency-check` then shows that tenant's keys
// with their replays and conflicts, most active first.
func TestTenantsAndIdempotencyCheck(t *testing.T) {
	ctx := context.Background()
	url := pipelinetest.DatabaseURL(t, ledgerMigrations)
	getenv := func(k string) string {
		if k == "DATABASE_URL" {
			return url
		}
		return ""
	}
	var out bytes.Buffer
	if err := run(ctx, []string{"tenants", "create", "acme"}, getenv, &out); err != nil {
		t.Fatal(err)
	}
	created := out.String()
	key := regexp.MustCompile(`api key (\S+)`).FindStringSubmatch(out.String())
	if key == nil {
		t.Fatalf("tenants create printed %q, want the key", out.String())
	}
	pool, err := postgres.Connect(ctx, url, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close) // after the server stops
	var plain int
	pool.QueryRow(ctx, `SELECT count(*) FROM api_keys WHERE position(convert_to($1, 'UTF8') IN key_hash) > 0 OR name = $1 OR tenant = $1`, key[1]).Scan(&plain)
	if plain != 0 {
		t.Fatalf("the API key is stored in clear")
	}

	c := ledgerapp.Client{Client: &apiclient.Client{BaseURL: startIngest(t, pool, nil), APIKey: key[1]}}
	if _, _, err := c.Deposit(ctx, "quiet", "acc-1", 1); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		c.Deposit(ctx, "busy", "acc-1", 5) // the first, then two replays
	}
	c.Deposit(ctx, "busy", "acc-1", 6) // a conflict
	c.Deposit(ctx, "retried", "acc-1", 7)
	c.Deposit(ctx, "retried", "acc-1", 7)

	out.Reset()
	if err := run(ctx, []string{"idempotency-check", "--tenant", "acme", "--hours", "1"}, getenv, &out); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if !strings.Contains(lines[0], "3 keys, 3 replays, 1 conflicts") {
		t.Errorf("summary %q, want 3 keys, 3 replays, 1 conflicts", lines[0])
	}
	var order []string
	for _, l := range lines[3:] {
		order = append(order, strings.Fields(l)[0])
	}
	if strings.Join(order, " ") != "busy retried quiet" {
		t.Errorf("keys listed %q, want busy retried quiet (most active first)\n%s", order, out.String())
	}
	if f := strings.Fields(lines[3]); f[1] != "2" || f[2] != "1" {
		t.Errorf("busy: %q, want 2 replays and 1 conflict", lines[3])
	}

	if err := run(ctx, []string{"idempotency-check", "--hours", "1"}, getenv, &out); err == nil {
		t.Error("idempotency-check without --tenant succeeded")
	}
	id := regexp.MustCompile(`key id (\d+)`).FindStringSubmatch(created)
	if err := run(ctx, []string{"tenants", "keys", "revoke", id[1]}, getenv, &out); err != nil {
		t.Fatal(err)
	}
	if _, _, err := c.Deposit(ctx, "after", "acc-1", 1); !apiclient.IsStatus(err, http.StatusUnauthorized) {
		t.Errorf("a revoked key: got %v, want 401", err)
	}
}

// startIngest runs an ingest server on pool until the test ends, logging
// to logger (nil: nowhere).
func startIngest(t *testing.T, p *pgxpool.Pool, logger *slog.Logger) string {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	topics := kafka.Topics{Prefix: "ledger", Partitions: 1}
	serdes := ledgerSerdes(t, topics)
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	routes := ledgerapp.Routes()
	for i := range routes {
		routes[i].Topic, routes[i].Encoder = topics.Commands(), serdes.Commands
	}
	srv, err := ingest.New(ingest.Config{}, routes, ledgerapp.Queries(), p, logger, prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx, ln) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	})
	return "http://" + ln.Addr().String()
}
