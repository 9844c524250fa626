package ingest_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/onceflow/onceflow/examples/ledger"
	"github.com/onceflow/onceflow/examples/ledger/accounts"
	"github.com/onceflow/onceflow/pipeline/avro"
	"github.com/onceflow/onceflow/pipeline/ingest"
	"github.com/onceflow/onceflow/pipeline/pipelinetest"
	"github.com/onceflow/onceflow/pipeline/postgres"
)

const commandsTopic = "ledger.commands"

// commandSerde is the real Avro serde of the commands topic over an
// embedded registry.
func commandSerde(t testing.TB) *avro.Serde {
	t.Helper()
	schemaText, err := ledger.SchemaOf(ledger.Commands)
	schema := []byte(schemaText)
	if err != nil {
		t.Fatal(err)
	}
	s, err := avro.NewSerde(avro.NewEmbedded(), avro.ValueSubject(commandsTopic), string(schema), ledger.CommandTypes())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Register(context.Background()); err != nil {
		t.Fatal(err)
	}
	return s
}

// ledgerRoutes are the ledger's routes, their commands to the commands
// topic through serde.
func ledgerRoutes(serde ingest.Encoder) []ingest.Route {
	return ledgerRoutesTo(commandsTopic, serde)
}

// ledgerMigrations are the ledger's read model's: the accounts table.
var ledgerMigrations = postgres.Migrations{Name: "ledger", FS: accounts.Migrations}

// ledgerPool is a pool on a database with the ledger's tables.
func ledgerPool(t testing.TB) (*pgxpool.Pool, string) {
	t.Helper()
	return pipelinetest.Pool(t, ledgerMigrations)
}

// server is an ingest server running on a loopback port for one test.
type server struct {
	*ingest.Server
	URL     string
	pool    *pgxpool.Pool
	metrics *prometheus.Registry
	serde   *avro.Serde
	stop    func()       // stops the server (and runs at the test's end)
	client  *http.Client // nil: httpClient
}

// startServer runs an ingest server on pool until the test ends, with the
// ledger's routes and queries and extra queries.
func startServer(t testing.TB, pool *pgxpool.Pool, cfg ingest.Config, extra ...ingest.Query) *server {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return startServerOn(t, ln, pool, cfg, extra...)
}

// startServerOn is startServer on ln.
func startServerOn(t testing.TB, ln net.Listener, pool *pgxpool.Pool, cfg ingest.Config, extra ...ingest.Query) *server {
	t.Helper()
	if cfg.RateLimit == 0 {
		cfg.RateLimit = -1 // tests of the limit set their own
	}
	if cfg.AuthFailureRate == 0 {
		cfg.AuthFailureRate = -1 // tests of the failure limit set their own
	}
	reg := prometheus.NewRegistry()
	serde := commandSerde(t)
	srv, err := ingest.New(cfg, ledgerRoutes(serde), append(ledgerQueries(), extra...), pool, slog.New(slog.DiscardHandler), reg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx, ln) }()
	s := &server{Server: srv, URL: "http://" + ln.Addr().String(), pool: pool, metrics: reg, serde: serde}
	s.stop = sync.OnceFunc(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("serve: %v", err)
		}
	})
	t.Cleanup(s.stop)
	// Commands accepted before the outcome listener connects are not
	// fresh (their first wait reads the row): tests start from a
	// listening server, as a running one is.
	pipelinetest.Eventually(t, 10*time.Second, func() error {
		if !srv.Listening() {
			return errors.New("the outcome listener has not connected")
		}
		return nil
	})
	return s
}

// tenant creates a tenant with a new API key and returns the key.
func tenant(t testing.TB, pool *pgxpool.Pool, name string) string {
	t.Helper()
	key := ingest.NewAPIKey()
	if err := ingest.CreateAPIKey(context.Background(), pool, name, "test", key); err != nil {
		t.Fatal(err)
	}
	return key
}

var httpClient = &http.Client{
	Timeout: 30 * time.Second,
	// Bounded, so a stalled server makes requests wait for a connection
	// instead of opening thousands of them.
	Transport: &http.Transport{MaxIdleConnsPerHost: 256, MaxConnsPerHost: 1024},
}

// response is an answer with its body read.
type response struct {
	Status int
	Header http.Header
	Body   []byte
}

func (r response) String() string {
	return fmt.Sprintf("%d %s", r.Status, bytes.TrimSpace(r.Body))
}

// problem decodes a problem+json body.
func (r response) problem(t testing.TB) problemBody {
	t.Helper()
	if ct := r.Header.Get("Content-Type"); ct != "application/problem+json" {
		t.Fatalf("%s: Content-Type %q, want application/problem+json", r, ct)
	}
	var p problemBody
	if err := json.Unmarshal(r.Body, &p); err != nil {
		t.Fatalf("%s: %v", r, err)
	}
	return p
}

type problemBody struct {
	Type   string `json:"type"`
	Status int    `json:"status"`
	Errors []struct {
		Field   string `json:"field"`
		Message string `json:"message"`
	} `json:"errors"`
}

func (p problemBody) fields() []string {
	var out []string
	for _, e := range p.Errors {
		out = append(out, e.Field)
	}
	return out
}

// req describes one request; zero fields are sensible defaults.
type req struct {
	method, path string
	apiKey       string
	idemKey      string
	body         string
	header       map[string]string
	noCT         bool // send no Content-Type
}

func (s *server) do(t testing.TB, q req) response {
	t.Helper()
	r, err := s.try(context.Background(), q)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func (s *server) try(ctx context.Context, q req) (response, error) {
	if q.method == "" {
		q.method = http.MethodPost
	}
	var body io.Reader
	if q.body != "" {
		body = strings.NewReader(q.body)
	}
	hr, err := http.NewRequestWithContext(ctx, q.method, s.URL+q.path, body)
	if err != nil {
		return response{}, err
	}
	if q.apiKey != "" {
		hr.Header.Set("Authorization", "Bearer "+q.apiKey)
	}
	if q.idemKey != "" {
		hr.Header.Set("Idempotency-Key", q.idemKey)
	}
	if q.body != "" && !q.noCT {
		hr.Header.Set("Content-Type", "application/json")
	}
	for k, v := range q.header {
		hr.Header.Set(k, v)
	}
	c := httpClient
	if s.client != nil {
		c = s.client
	}
	resp, err := c.Do(hr)
	if err != nil {
		return response{}, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return response{}, err
	}
	return response{Status: resp.StatusCode, Header: resp.Header, Body: b}, nil
}

// acceptedID decodes a 202's command id, failing the test on any other
// answer.
func acceptedID(t testing.TB, r response) string {
	t.Helper()
	if r.Status != http.StatusAccepted {
		t.Fatalf("got %s, want 202", r)
	}
	var a struct {
		CommandID string `json:"command_id"`
		Status    string `json:"status"`
	}
	if err := json.Unmarshal(r.Body, &a); err != nil || a.CommandID == "" || a.Status != "pending" {
		t.Fatalf("202 body %q: %v", r.Body, err)
	}
	if loc := r.Header.Get("Location"); loc != "/v1/commands/"+a.CommandID {
		t.Fatalf("Location %q, want /v1/commands/%s", loc, a.CommandID)
	}
	return a.CommandID
}

// rows counts what ingest stores: outbox rows, command_status rows and
// idempotency key records.
type rows struct{ outbox, status, keys int }

func countRows(t testing.TB, pool *pgxpool.Pool) rows {
	t.Helper()
	var r rows
	err := pool.QueryRow(context.Background(), `SELECT
		(SELECT count(*) FROM outbox), (SELECT count(*) FROM command_status), (SELECT count(*) FROM idempotency_keys)`).
		Scan(&r.outbox, &r.status, &r.keys)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// outboxRow is one shipped-to-be command as the relay will read it.
type outboxRow struct {
	Key     string
	Headers map[string]string
	Payload any
}

func outboxRows(t testing.TB, s *server) []outboxRow {
	t.Helper()
	ctx := context.Background()
	rs, err := s.pool.Query(ctx, `SELECT key, value, headers FROM outbox ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	defer rs.Close()
	var out []outboxRow
	for rs.Next() {
		var key, value []byte
		var r outboxRow
		if err := rs.Scan(&key, &value, &r.Headers); err != nil {
			t.Fatal(err)
		}
		r.Key = string(key)
		if r.Payload, err = s.serde.Decode(ctx, value); err != nil {
			t.Fatalf("decode outbox value: %v", err)
		}
		out = append(out, r)
	}
	if err := rs.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// counter reads a counter's value from the server's metrics.
func (s *server) counter(t testing.TB, name string, labels map[string]string) float64 {
	t.Helper()
	mfs, err := s.metrics.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	next:
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if v, ok := labels[lp.GetName()]; ok && v != lp.GetValue() {
					continue next
				}
			}
			return m.GetCounter().GetValue()
		}
	}
	return 0
}

// gauge reads a gauge's value from the server's metrics.
func (s *server) gauge(t testing.TB, name string) float64 {
	t.Helper()
	mfs, err := s.metrics.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name && len(mf.GetMetric()) > 0 {
			return mf.GetMetric()[0].GetGauge().GetValue()
		}
	}
	return 0
}

func pgxpoolConnect(url string) (*pgxpool.Pool, error) {
	return postgres.Connect(context.Background(), url, 0)
}
