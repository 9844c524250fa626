package chaos

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/onceflow/onceflow/pipeline/kafka"
	"github.com/onceflow/onceflow/pipeline/postgres"
	"github.com/onceflow/onceflow/test/e2e"
	"github.com/onceflow/onceflow/test/kafkacluster"
)

// cluster is the deployment under test: its own Postgres, the broker and
// two processes of each component.
type cluster struct {
	t     *testing.T
	pl    *e2e.Pipeline
	pg    postgres.Local
	pool  *pgxpool.Pool
	dbURL string

	mu     sync.Mutex
	comps  map[string]*e2e.Component // by instance name
	kinds  map[string]string         // instance -> kind
	broker *e2e.Proc                 // the embedded broker; on Apache Kafka the registry
	// kafka is the run's three nodes of Apache Kafka (-chaos.kafka), nil
	// on the embedded broker.
	kafka *kafkacluster.Cluster
	// net makes the network's faults, on a run on Apache Kafka with any
	// of them; pgCut is the proxy in front of Postgres of each kind of
	// pgCutKinds, on a run with the postgres-cut fault.
	net   *netem
	pgCut map[string]*pgCut
}

// sessionTimeout is the processors' group session timeout in the chaos
// run; a zombie is paused for longer than this.
const sessionTimeout = 8 * time.Second

// maxCommandBytes is the processors' MaxCommandBytes in the chaos run: well
// under the commands topic's max.message.bytes (1 MiB), so a hostile record
// can be too large for the processor and still be one the broker takes.
const maxCommandBytes = 64 << 10

var instances = []struct{ kind, name string }{
	{"ingest", "ingest-1"}, {"ingest", "ingest-2"},
	{"relay", "relay-1"}, {"relay", "relay-2"},
	{"processor", "processor-1"}, {"processor", "processor-2"},
	{"projector", "projector-1"}, {"projector", "projector-2"},
	{"worker", "worker-1"}, {"worker", "worker-2"},
}

// workerLease is the workers' ONCEFLOW_WORKER_LEASE: the worker pause
// fault outlasts it.
const workerLease = 3 * time.Second

func startCluster(t *testing.T, ctx context.Context, bin string) *cluster {
	t.Helper()
	return startClusterOf(t, ctx, bin, "")
}

// startClusterOf is startCluster running app's binaries (e2e.Pipeline.App):
// "" the ledger's, "inventory" the inventory's.
func startClusterOf(t *testing.T, ctx context.Context, bin, app string) *cluster {
	t.Helper()
	dir := t.TempDir()
	c := &cluster{t: t, comps: map[string]*e2e.Component{}, kinds: map[string]string{}}
	// A cluster of its own: the run restarts it.
	c.pg = postgres.Local{Dir: filepath.Join(dir, "pg"), Port: e2e.FreePort(), Database: "chaos"}
	url, err := c.pg.Ensure(ctx)
	if err != nil {
		t.Fatalf("postgres: %v", err)
	}
	t.Cleanup(func() { c.pg.Stop(context.Background(), "immediate") })
	c.dbURL = url
	if err := postgres.Migrate(ctx, url, nil); err != nil {
		t.Fatal(err)
	}
	c.pool, err = pgxpool.New(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.pool.Close)

	c.pl = e2e.NewPipeline(bin, dir, url)
	if app != "" {
		c.pl.App, c.pl.Prefix = app, "" // the domain's own names
	}
	if *kafkaFlag {
		kinds := faultKinds(*faultsFlag, true)
		if slices.ContainsFunc(kinds, func(k faultKind) bool { return isNetFault(k.name) }) {
			if c.net, err = newNetem(); err != nil {
				t.Fatal(err)
			}
			// Removed after the processes in its cgroups have stopped
			// (cleanups run last first).
			t.Cleanup(c.net.close)
			c.pl.Cgroups = c.net.cgroups("components")
		}
		if slices.ContainsFunc(kinds, func(k faultKind) bool { return k.name == faultPostgresCut }) {
			c.pgCut = map[string]*pgCut{}
			for _, kind := range pgCutKinds {
				p, err := newPGCut(fmt.Sprintf("127.0.0.1:%d", c.pg.Port))
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(p.close)
				c.pgCut[kind] = p
			}
		}
		cgroups := ""
		if c.net != nil {
			cgroups = c.net.cgroups("kafka")
		}
		if c.kafka, err = startKafka(ctx, dir, cgroups); err != nil {
			t.Fatalf("apache kafka: %v", err)
		}
		// Stopped after the components (cleanups run last first).
		t.Cleanup(func() {
			if t.Failed() {
				for _, n := range c.kafka.Nodes() {
					t.Logf("node %d: %s", n.ID, n.Tail(30))
				}
			}
			c.kafka.Stop(10 * time.Second)
		})
		c.pl.BrokerAddr, c.pl.External = c.kafka.Bootstrap(), true
		if err := provisionTopics(ctx, c.kafka, kafka.Topics{Prefix: c.pl.Prefix}); err != nil {
			t.Fatalf("apache kafka: %v", err)
		}
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("process logs:\n%s", c.pl.Logs(40))
		}
		c.pl.KillAll()
	})
	if c.broker, err = c.pl.StartBroker(ctx); err != nil {
		t.Fatal(err)
	}
	for _, in := range instances {
		c.kinds[in.name] = in.kind
		if err := c.start(ctx, in.name); err != nil {
			t.Fatal(err)
		}
	}
	return c
}

func (c *cluster) env(kind string) map[string]string {
	env := map[string]string{"LOG_LEVEL": "warn"}
	if p := c.pgCut[kind]; p != nil {
		env["DATABASE_URL"] = strings.Replace(c.dbURL, fmt.Sprintf("127.0.0.1:%d", c.pg.Port), p.Addr(), 1)
	}
	if kind == "processor" {
		env["ONCEFLOW_PROCESSOR_SESSION_TIMEOUT"] = sessionTimeout.String()
		env["ONCEFLOW_PROCESSOR_MAX_COMMAND_BYTES"] = strconv.Itoa(maxCommandBytes)
	}
	if kind == "worker" || kind == "projector" {
		// Deliveries to the run's receiver, on loopback, retried quickly and
		// never out of attempts within a run; the projectors enqueue them
		// with the same limit.
		env["ONCEFLOW_WORKER_MAX_ATTEMPTS"] = "200"
	}
	if kind == "worker" {
		env["ONCEFLOW_WORKER_LEASE"] = workerLease.String()
		env["ONCEFLOW_WORKER_ATTEMPT_TIMEOUT"] = "2s"
		env["ONCEFLOW_WEBHOOK_TIMEOUT"] = "1s"
		env["ONCEFLOW_WORKER_BASE_DELAY"] = "100ms"
		env["ONCEFLOW_WORKER_MAX_DELAY"] = "1s"
		env["ONCEFLOW_WEBHOOK_ALLOW_NETWORKS"] = "127.0.0.0/8"
		env["ONCEFLOW_WEBHOOK_BREAKER_FAILURES"] = "50"
		env["ONCEFLOW_WEBHOOK_BREAKER_COOLDOWN"] = "1s"
	}
	return env
}

// start starts (or restarts) one instance and waits until it is ready.
func (c *cluster) start(ctx context.Context, name string) error {
	kind := c.kinds[name]
	comp, err := c.pl.StartComponent(ctx, kind, name, c.env(kind))
	if err != nil {
		return fmt.Errorf("start %s: %w", name, err)
	}
	c.mu.Lock()
	c.comps[name] = comp
	c.mu.Unlock()
	return nil
}

func (c *cluster) comp(name string) *e2e.Component {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.comps[name]
}

// ingestURLs returns the base URLs of the ingest processes.
func (c *cluster) ingestURLs() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []string
	for _, in := range instances {
		if in.kind == "ingest" {
			if comp := c.comps[in.name]; comp != nil {
				out = append(out, comp.HTTP)
			}
		}
	}
	return out
}

// restartBroker crashes the broker (no flush, no snapshot, transactions left
// open) and starts it again on the same address and data directory. The crash
// comes between two of its requests: kfake has no transaction log, and a kill
// while it writes one transaction's markers would tear the transaction, which
// a real broker does not (docs/decisions/0052-embedded-broker-crashes.md).
func (c *cluster) restartBroker(ctx context.Context) error {
	c.broker.CrashBroker()
	b, err := c.pl.StartBroker(ctx)
	if err != nil {
		return err
	}
	c.broker = b
	return nil
}

// restartPostgres restarts the cluster in immediate mode: every
// connection drops, uncommitted work is lost, the server recovers from WAL.
func (c *cluster) restartPostgres(ctx context.Context) error {
	if err := c.pg.Stop(ctx, "immediate"); err != nil {
		return err
	}
	_, err := c.pg.Ensure(ctx)
	return err
}

// ensureAll starts every instance that is not running.
func (c *cluster) ensureAll(ctx context.Context) error {
	for _, in := range instances {
		comp := c.comp(in.name)
		if comp == nil || comp.Exited() {
			if err := c.start(ctx, in.name); err != nil {
				return err
			}
		}
	}
	return nil
}
