package main

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/onceflow/onceflow/pipeline/ingest"
	"github.com/onceflow/onceflow/test/e2e"
)

// target is one system under test, running in processes of its own: the
// load generator reaches it only over HTTP, as a client would.
type target struct {
	Name    string
	Label   string   // as the report names it
	Base    string   // HTTP API base URL
	Keys    []string // API keys, one per tenant
	Metrics []string // /metrics URLs whose stage histograms it reports
	// Ledger says whether it runs the ledger (its accounts must be opened
	// before deposits); the no-op server runs nothing.
	Ledger bool
	stop   []func()
	// procs are its processes; db its database on adminURL's server (for
	// the CPU its Postgres backends use), dbURL that database's URL (for
	// its statements' times).
	procs               []proc
	db, adminURL, dbURL string
}

func (t *target) Close() {
	for i := len(t.stop) - 1; i >= 0; i-- {
		t.stop[i]()
	}
}

// env is what starting a target needs.
type env struct {
	bin         string // onceflow's binaries (cmd/...) and the peer's
	dir         string // logs, broker data
	databaseURL string // a server on which to create a database per target
	tenants     int
	cpuprofile  string            // `onceflow dev` writes its CPU profile here ("" none)
	self        string            // this program, for the no-op server
	settings    map[string]string // -set, for every onceflow process
}

func freeAddr() string { return "127.0.0.1:" + strconv.Itoa(e2e.FreePort()) }

// newTarget is a target of the ledger on a database of its own,
// bench_e2e_{db}_{pid}, dropped when it closes; it returns the database's
// URL.
func newTarget(ctx context.Context, e env, name, label, db string) (*target, string, error) {
	t := &target{Name: name, Label: label, Ledger: true}
	t.db, t.adminURL = fmt.Sprintf("bench_e2e_%s_%d", db, os.Getpid()), e.databaseURL
	dbURL, drop, err := createDatabase(ctx, e.databaseURL, t.db)
	if err != nil {
		return nil, "", err
	}
	t.stop = append(t.stop, drop)
	t.dbURL = dbURL
	// Where pg_stat_statements is not loaded its view cannot be read, and
	// each step's bill says so; the error is the same there.
	if err := setupStatements(ctx, dbURL); err != nil {
		fmt.Fprintln(os.Stderr, "bench-e2e: pg_stat_statements:", err)
	}
	return t, dbURL, nil
}

// createDatabase creates a database of its own for a target on the server
// of base and returns its URL; stop drops it.
func createDatabase(ctx context.Context, base, name string) (string, func(), error) {
	conn, err := pgx.Connect(ctx, base)
	if err != nil {
		return "", nil, fmt.Errorf("connect %s: %w", redact(base), err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil {
		return "", nil, fmt.Errorf("create database %s: %w", name, err)
	}
	u, err := url.Parse(base)
	if err != nil {
		return "", nil, fmt.Errorf("DATABASE_URL: want a postgres:// URL: %w", err)
	}
	u.Path = "/" + name
	drop := func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if conn, err := pgx.Connect(ctx, base); err == nil {
			conn.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)")
			conn.Close(ctx)
		}
	}
	return u.String(), drop, nil
}

func redact(s string) string {
	if u, err := url.Parse(s); err == nil {
		return u.Redacted()
	}
	return "(unparsable URL)"
}

// tenants creates n tenants with a key each on the database at dbURL.
func tenants(ctx context.Context, dbURL string, n int) ([]string, error) {
	pool, err := pgxpool.New(ctx, dbURL)
	if err != nil {
		return nil, err
	}
	defer pool.Close()
	keys := make([]string, n)
	for i := range keys {
		keys[i] = ingest.NewAPIKey()
		if err := ingest.CreateAPIKey(ctx, pool, "bench-"+strconv.Itoa(i), "bench-e2e", keys[i]); err != nil {
			return nil, fmt.Errorf("tenant: %w", err)
		}
	}
	return keys, nil
}

// onceflowEnv is every onceflow process's environment in a benchmark: no
// per-tenant rate limit (the load is the point), warnings and errors only,
// and the run's -set settings.
func (e env) onceflowEnv() map[string]string {
	vars := map[string]string{"ONCEFLOW_TENANT_RATE_LIMIT": "0", "LOG_LEVEL": "warn"}
	maps.Copy(vars, e.settings)
	return vars
}

// closeOnError closes t if *err is set: a start function's deferred
// cleanup of what it started before it failed.
func (t *target) closeOnError(err *error) {
	if *err != nil {
		t.Close()
	}
}

// startBroker starts the embedded broker (`onceflow dev --broker-only`)
// of a pipeline in e's folder name on database db, set up by set first.
func (t *target) startBroker(ctx context.Context, e env, name, db string, set func(*e2e.Pipeline)) (*e2e.Pipeline, error) {
	dir := filepath.Join(e.dir, name)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	pl := e2e.NewPipeline(e.bin, dir, db)
	set(pl)
	t.stop = append(t.stop, pl.KillAll)
	broker, err := pl.StartBroker(ctx)
	if err != nil {
		return nil, err
	}
	if pl.External {
		// On Apache Kafka the process is the schema registry alone, and
		// the cluster's nodes are the broker.
		t.procs = append(t.procs, proc{"registry", broker.Pid()})
		t.procs = append(t.procs, kafkaProcs()...)
	} else {
		t.procs = append(t.procs, proc{"broker", broker.Pid()})
	}
	return pl, nil
}

// startDev starts `onceflow dev`: the embedded broker, registry and all
// four components in one process, on a database of its own.
func startDev(ctx context.Context, e env) (_ *target, err error) {
	t, db, err := newTarget(ctx, e, "dev", "onceflow dev", "dev")
	if err != nil {
		return nil, err
	}
	defer t.closeOnError(&err)
	httpAddr, admin := freeAddr(), freeAddr()
	vars := e.onceflowEnv()
	for k, v := range map[string]string{
		"DATABASE_URL": db, "HTTP_ADDR": httpAddr, "ADMIN_ADDR": admin,
		"ONCEFLOW_DEV_BROKER_ADDR": freeAddr(), "ONCEFLOW_DEV_API_KEY": ingest.NewAPIKey(),
	} {
		vars[k] = v
	}
	if ext := e2e.ExternalKafka(); ext != "" {
		// On Apache Kafka (KAFKA_BROKERS): dev embeds no broker, and its
		// topics are this run's.
		vars["KAFKA_BROKERS"] = ext
		vars["ONCEFLOW_TOPIC_PREFIX"] = fmt.Sprintf("ledger-bench-%d", os.Getpid())
	}
	bin, args := filepath.Join(e.bin, "onceflow"), []string{"dev"}
	if e.cpuprofile != "" {
		// The same `onceflow dev` (cli.Run over the ledger), in this
		// program, with a CPU profile of the whole run.
		bin, args = e.self, []string{"dev"}
		vars[envProfiledDev] = e.cpuprofile
	}
	args = append(args, "--data-dir", filepath.Join(e.dir, "dev-data"), "--registry-addr", freeAddr())
	p, err := e2e.Start(bin, "onceflow-dev", args, vars, filepath.Join(e.dir, "dev.log"), "http://"+admin)
	if err != nil {
		return nil, err
	}
	t.stop = append(t.stop, func() { p.Stop(30 * time.Second) })
	if err := p.WaitReady(ctx); err != nil {
		return nil, err
	}
	t.procs = append([]proc{{"onceflow dev", p.Pid()}}, kafkaProcs()...)
	t.Base, t.Metrics = "http://"+httpAddr, []string{p.Admin + "/metrics"}
	if t.Keys, err = tenants(ctx, db, e.tenants); err != nil {
		return nil, err
	}
	return t, nil
}

// startSplit starts the reference deployment as separate processes: the
// embedded broker (`onceflow dev --broker-only`) and the ingest, relay,
// processor, projector and worker binaries.
func startSplit(ctx context.Context, e env) (_ *target, err error) {
	t, db, err := newTarget(ctx, e, "split", "onceflow, 5 processes", "split")
	if err != nil {
		return nil, err
	}
	defer t.closeOnError(&err)
	pl, err := t.startBroker(ctx, e, "split", db, func(pl *e2e.Pipeline) { pl.Env = e.onceflowEnv() })
	if err != nil {
		return nil, err
	}
	var procs []*e2e.Component
	for _, kind := range []string{"ingest", "relay", "processor", "projector", "worker"} {
		c, err := pl.StartComponent(ctx, kind, kind, nil)
		if err != nil {
			return nil, err
		}
		procs = append(procs, c)
		t.procs = append(t.procs, proc{kind, c.Pid()})
		t.Metrics = append(t.Metrics, c.Admin+"/metrics")
	}
	// Stop gracefully in order before KillAll: ingest first.
	t.stop = append(t.stop, func() {
		for _, c := range procs {
			c.Stop(30 * time.Second)
		}
	})
	t.Base = procs[0].HTTP
	if t.Keys, err = tenants(ctx, db, e.tenants); err != nil {
		return nil, err
	}
	return t, nil
}

// startWatermill starts the peer (bench/watermill): the same API and work
// built with Watermill, in one process, against an embedded broker of its
// own (`onceflow dev --broker-only`, topics prefixed "wm"), or the cluster
// KAFKA_BROKERS names, and a database of its own.
func startWatermill(ctx context.Context, e env) (_ *target, err error) {
	t, db, err := newTarget(ctx, e, "watermill", "Watermill peer", "wm")
	if err != nil {
		return nil, err
	}
	defer t.closeOnError(&err)
	pl, err := t.startBroker(ctx, e, "watermill", db, func(pl *e2e.Pipeline) { pl.Prefix = pl.TopicPrefix("wm") })
	if err != nil {
		return nil, err
	}
	dir := pl.Dir
	httpAddr, admin := freeAddr(), freeAddr()
	p, err := e2e.Start(filepath.Join(e.bin, "watermill-peer"), "watermill-peer", nil, map[string]string{
		"DATABASE_URL": db, "KAFKA_BROKERS": pl.BrokerAddr, "TOPIC_PREFIX": pl.Prefix,
		"HTTP_ADDR": httpAddr, "ADMIN_ADDR": admin,
	}, filepath.Join(dir, "peer.log"), "http://"+admin)
	if err != nil {
		return nil, err
	}
	t.stop = append(t.stop, func() { p.Stop(30 * time.Second) })
	if err := p.WaitReady(ctx); err != nil {
		return nil, err
	}
	t.procs = append(t.procs, proc{"peer", p.Pid()})
	t.Base = "http://" + httpAddr
	// The peer authenticates nobody: a tenant is the bearer token.
	for i := range e.tenants {
		t.Keys = append(t.Keys, "bench-"+strconv.Itoa(i))
	}
	return t, nil
}

// startNoop starts the HTTP-only reference: this program as a server whose
// handlers answer the same routes with canned bodies and do no work.
func startNoop(ctx context.Context, e env) (_ *target, err error) {
	t := &target{Name: "noop", Label: "HTTP only (no-op handler)"}
	addr := freeAddr()
	p, err := e2e.Start(e.self, "noop", nil, map[string]string{envNoop: addr}, filepath.Join(e.dir, "noop.log"), "http://"+addr)
	if err != nil {
		return nil, err
	}
	t.stop = append(t.stop, func() { p.Stop(10 * time.Second) })
	defer t.closeOnError(&err)
	if err := p.WaitReady(ctx); err != nil {
		return nil, err
	}
	t.procs = []proc{{"no-op server", p.Pid()}}
	t.Base = p.Admin
	for i := range e.tenants {
		t.Keys = append(t.Keys, "bench-"+strconv.Itoa(i))
	}
	return t, nil
}

const (
	envNoop        = "BENCH_E2E_NOOP_ADDR"      // serve the no-op API on this address
	envProfiledDev = "BENCH_E2E_DEV_CPUPROFILE" // run `onceflow dev`, profiled into this file
)

// serveNoop is the no-op server: every POST answers 202 with a command id,
// every GET the accepted status, /readyz 200. Nothing is read or written
// but the request and the answer.
func serveNoop(ctx context.Context, addr string) error {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {})
	mux.HandleFunc("POST /", func(w http.ResponseWriter, r *http.Request) {
		var b [512]byte
		for {
			if _, err := r.Body.Read(b[:]); err != nil {
				break
			}
		}
		id := strconv.FormatInt(time.Now().UnixNano(), 36)
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Location", "/v1/commands/"+id)
		w.WriteHeader(http.StatusAccepted)
		fmt.Fprintf(w, `{"command_id":%q,"status":"pending"}`, id)
	})
	mux.HandleFunc("GET /v1/commands/{id}", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"command_id":%q,"status":"accepted"}`, r.PathValue("id"))
	})
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() {
		<-ctx.Done()
		srv.Close()
	}()
	if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// buildPeer builds the Watermill peer (bench/watermill) into dir.
func buildPeer(ctx context.Context, dir string) error {
	cmd := exec.CommandContext(ctx, "go", "build", "-o", filepath.Join(dir, "watermill-peer"), "./watermill")
	cmd.Dir = benchRoot()
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go build the Watermill peer: %w\n%s", err, strings.TrimSpace(string(out)))
	}
	return nil
}
