package e2e

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/onceflow/onceflow"
	"github.com/onceflow/onceflow/examples/ledger/ledgerapp"
	"github.com/onceflow/onceflow/pipeline"
	"github.com/onceflow/onceflow/pipeline/apiclient"
	"github.com/onceflow/onceflow/pipeline/avro"
	"github.com/onceflow/onceflow/pipeline/ingest"
	"github.com/onceflow/onceflow/pipeline/kafka"
	"github.com/onceflow/onceflow/pipeline/pipelinetest"
	"github.com/onceflow/onceflow/test/kafkacluster"
)

var binDir string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "onceflow-e2e-bin")
	if err != nil {
		panic(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	if err := Build(ctx, dir); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	cancel()
	binDir = dir
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// newPipeline prepares a deployment in t's temporary directory against
// databaseURL ("" when no component needs Postgres). Its processes die
// when the test ends, and their logs are printed if it failed.
//
// On an external cluster (KAFKA_BROKERS) the deployments of the package
// take the cluster one at a time: the ledger's consumer groups and
// transactional ids are fixed names, which two deployments running at once
// would share (one cluster per deployment is what production has). Each
// stops gracefully, so its consumers leave their groups, and its topics
// are deleted.
func newPipeline(t *testing.T, databaseURL string) *Pipeline {
	t.Helper()
	dir, keep := keptDir(t)
	pl := NewPipeline(binDir, dir, databaseURL)
	if keep {
		pl.Env = map[string]string{"LOG_LEVEL": "debug"}
	}
	if pl.External {
		externalKafka.Lock()
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("process logs:\n%s", pl.Logs(80))
		}
		if pl.External {
			defer externalKafka.Unlock()
			pl.StopAll(10 * time.Second)
			// A cluster of the test's own (startCrashableBroker) goes whole;
			// a failed test's topics stay when its logs do, to be read.
			if pl.BrokerAddr == ExternalKafka() && !(keep && t.Failed()) {
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				defer cancel()
				if err := pl.DeleteTopics(ctx); err != nil {
					t.Logf("delete the topics of %s: %v", pl.Prefix, err)
				}
			}
		}
		pl.KillAll()
	})
	return pl
}

// keptDir returns the directory of a deployment's logs and data: t's
// temporary directory, or with E2E_LOG_DIR set a directory under it that
// stays after the test (keep), its components logging at debug level
// (franz-go's joins, rebalances and transaction ends included) and, on an
// external cluster, a failed test's topics left in place: what an
// investigation of a rare failure needs
// (docs/decisions/0020-restore-waits-for-open-transactions.md).
func keptDir(t *testing.T) (dir string, keep bool) {
	root := os.Getenv("E2E_LOG_DIR")
	if root == "" {
		return t.TempDir(), false
	}
	if err := os.MkdirAll(root, 0o750); err != nil {
		t.Fatal(err)
	}
	dir, err := os.MkdirTemp(root, strings.ReplaceAll(t.Name(), "/", "_")+"-")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("logs and data of this deployment: %s", dir)
	return dir, true
}

// externalKafka is held by the deployment that runs on the external
// cluster (newPipeline).
var externalKafka sync.Mutex

// crashableBroker is a broker a test crashes and starts again. On the
// embedded broker it is `onceflow dev --broker-only`. On Apache Kafka
// (KAFKA_BROKERS) the cluster named there is shared and not the test's to
// crash, so the test runs on a one-node cluster of its own
// (test/kafkacluster) next to the registry of `dev --broker-only`.
type crashableBroker struct {
	pl   *Pipeline
	proc *Proc              // the embedded broker; on Apache Kafka the registry
	node *kafkacluster.Node // on Apache Kafka, the test's own node
}

// startCrashableBroker starts pl's broker, on a node of the test's own
// when the suite runs on Apache Kafka.
func startCrashableBroker(t *testing.T, ctx context.Context, pl *Pipeline) *crashableBroker {
	t.Helper()
	b := &crashableBroker{pl: pl}
	if pl.External {
		// Few partitions for the internal topics: a node killed with
		// SIGKILL recovers every partition's log before it listens again.
		c, err := kafkacluster.Start(ctx, kafkacluster.Config{Dir: t.TempDir(), HeapMB: 384, Props: map[string]string{
			"offsets.topic.num.partitions": "2", "transaction.state.log.num.partitions": "2",
		}})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			if t.Failed() {
				t.Log(c.Nodes()[0].Tail(60))
			}
			c.Stop(10 * time.Second)
		})
		pl.BrokerAddr, b.node = c.Bootstrap(), c.Nodes()[0]
	}
	var err error
	if b.proc, err = pl.StartBroker(ctx); err != nil {
		t.Fatal(err)
	}
	return b
}

// Kill kills the broker with SIGKILL: the embedded broker's process, or
// Apache Kafka's node (its JVM; the registry stays).
func (b *crashableBroker) Kill() {
	if b.node != nil {
		b.node.Kill()
		return
	}
	b.proc.Kill()
}

// Crash crashes the broker: the embedded one between two of its requests
// (Proc.CrashBroker, which it survives); Apache Kafka's node with SIGKILL
// at any moment, which a real broker survives by its log.
func (b *crashableBroker) Crash() {
	if b.node != nil {
		b.node.Kill()
		return
	}
	b.proc.CrashBroker()
}

// Restart starts the broker again on its data and waits until it serves.
func (b *crashableBroker) Restart(ctx context.Context) error {
	if b.node != nil {
		return b.node.Start(ctx)
	}
	p, err := b.pl.StartBroker(ctx)
	if err == nil {
		b.proc = p
	}
	return err
}

// registrySerdes returns the serdes of the topics of pl's running broker,
// through its schema registry (the ids its components use).
func registrySerdes(t *testing.T, ctx context.Context, pl *Pipeline) onceflow.Serdes {
	t.Helper()
	reg, err := avro.NewClient(pl.RegistryURL)
	if err != nil {
		t.Fatal(err)
	}
	serdes, err := onceflow.NewSerdes(ctx, reg, ledgerapp.Domain(), "", kafka.Topics{Prefix: pl.Prefix})
	if err != nil {
		t.Fatal(err)
	}
	return serdes
}

// deployment is a pipeline with one process per component and a tenant.
type deployment struct {
	*Pipeline
	pool   *pgxpool.Pool
	client *ledgerapp.Client
	comps  map[string]*Component
}

func deploy(t *testing.T, ctx context.Context) *deployment {
	t.Helper()
	if testing.Short() {
		t.Skip("multi-process end-to-end test; skipped with -short")
	}
	return deployOn(t, ctx, "", nil)
}

// deployOn is deploy against the Kafka at broker, or against a broker of
// its own (`onceflow dev --broker-only`) when broker is empty, with env
// added to every component's environment.
func deployOn(t *testing.T, ctx context.Context, broker string, env map[string]string) *deployment {
	t.Helper()
	pool, url := pipelinetest.Pool(t)
	pl := newPipeline(t, url)
	pl.Env = env
	if broker == "" {
		if _, err := pl.StartBroker(ctx); err != nil {
			t.Fatal(err)
		}
	} else {
		// Each component builds the embedded registry, whose ids are the
		// same in every process.
		pl.BrokerAddr, pl.RegistryURL = broker, ""
	}
	d := &deployment{Pipeline: pl, pool: pool, comps: map[string]*Component{}}
	d.startAll(t, ctx)
	key := ingest.NewAPIKey()
	if err := ingest.CreateAPIKey(ctx, pool, "acme", "e2e", key); err != nil {
		t.Fatal(err)
	}
	d.client = &ledgerapp.Client{Client: &apiclient.Client{BaseURL: d.comps["ingest"].HTTP, APIKey: key}}
	return d
}

func (d *deployment) startAll(t *testing.T, ctx context.Context) {
	t.Helper()
	for _, kind := range []string{"ingest", "relay", "processor", "projector"} {
		c, err := d.StartComponent(ctx, kind, kind, nil)
		if err != nil {
			t.Fatal(err)
		}
		d.comps[kind] = c
	}
	if d.client != nil {
		d.client.BaseURL = d.comps["ingest"].HTTP
	}
}

// ledgerModel is what the client knows it asked for: every command id it
// got a 202 for, and the balance those commands add up to.
type ledgerModel struct {
	mu       sync.Mutex
	commands map[string]string // command id -> account
	balance  map[string]int64
}

func newModel() *ledgerModel {
	return &ledgerModel{commands: map[string]string{}, balance: map[string]int64{}}
}

func (m *ledgerModel) accepted(cmdID, account string, amount int64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, seen := m.commands[cmdID]; seen {
		return // a replayed response names the same command
	}
	m.commands[cmdID] = account
	m.balance[account] += amount
}

// send posts until it gets an answer from the server (a client that
// retries with the same key through timeouts, 429s, 503s and restarts), and
// returns the command id.
func send(ctx context.Context, c *ledgerapp.Client, key string, post func(key string) (apiclient.Accepted, *apiclient.Response, error)) (apiclient.Accepted, *apiclient.Response, error) {
	for {
		acc, resp, err := post(key)
		if err == nil || (resp != nil && resp.Status < 500 && resp.Status != http.StatusTooManyRequests) {
			return acc, resp, err
		}
		select {
		case <-ctx.Done():
			return acc, resp, fmt.Errorf("%w (last error: %v)", ctx.Err(), err)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// workload opens accounts and deposits into them. A share of requests is
// retried with the same key (once right after the first answer, sometimes
// concurrently with it), and a share is sent again with a new key on
// purpose: the first must count once, the second twice.
func workload(t *testing.T, ctx context.Context, c func() *ledgerapp.Client, m *ledgerModel, accounts, depositsPerAccount int, pace time.Duration) {
	t.Helper()
	run := fmt.Sprintf("%x", rand.Uint32())
	var wg sync.WaitGroup
	errs := make(chan error, accounts)
	for a := 0; a < accounts; a++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(a), 7))
			acct := fmt.Sprintf("acc-%s-%d", run, a)
			acc, _, err := send(ctx, c(), "open-"+acct, func(k string) (apiclient.Accepted, *apiclient.Response, error) {
				return c().OpenAccount(ctx, k, acct, "EUR")
			})
			if err != nil {
				errs <- fmt.Errorf("open %s: %w", acct, err)
				return
			}
			m.accepted(acc.CommandID, acct, 0)
			for i := 0; i < depositsPerAccount; i++ {
				amount := int64(1 + rng.IntN(1000))
				key := fmt.Sprintf("dep-%s-%d", acct, i)
				post := func(k string) (apiclient.Accepted, *apiclient.Response, error) {
					return c().Deposit(ctx, k, acct, amount)
				}
				switch r := rng.IntN(10); {
				case r < 2: // a concurrent retry with the same key
					var wg2 sync.WaitGroup
					results := make([]apiclient.Accepted, 2)
					sendErrs := make([]error, 2)
					for j := range results {
						wg2.Add(1)
						go func() {
							defer wg2.Done()
							results[j], _, sendErrs[j] = send(ctx, c(), key, post)
						}()
					}
					wg2.Wait()
					if err := errors.Join(sendErrs...); err != nil {
						errs <- fmt.Errorf("concurrent retries of %s: %w", key, err)
						return
					}
					if results[0].CommandID != results[1].CommandID {
						errs <- fmt.Errorf("same key %s gave commands %s and %s", key, results[0].CommandID, results[1].CommandID)
						return
					}
					m.accepted(results[0].CommandID, acct, amount)
				case r < 4: // a later retry with the same key
					first, _, err := send(ctx, c(), key, post)
					if err != nil {
						errs <- err
						return
					}
					again, resp, err := send(ctx, c(), key, post)
					if err != nil {
						errs <- err
						return
					}
					if !resp.Replayed() || again.CommandID != first.CommandID {
						errs <- fmt.Errorf("retry of %s: replayed=%v, command %s, want replay of %s", key, resp.Replayed(), again.CommandID, first.CommandID)
						return
					}
					m.accepted(first.CommandID, acct, amount)
				case r < 5: // the same deposit again with a new key: a second deposit
					for _, k := range []string{key, key + "-again"} {
						acc, _, err := send(ctx, c(), k, post)
						if err != nil {
							errs <- err
							return
						}
						m.accepted(acc.CommandID, acct, amount)
					}
				default:
					acc, _, err := send(ctx, c(), key, post)
					if err != nil {
						errs <- err
						return
					}
					m.accepted(acc.CommandID, acct, amount)
				}
				if pace > 0 {
					time.Sleep(pace)
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

// checkExact waits for every accepted command to have its outcome, then
// checks the read models and the events topic against the model.
func (d *deployment) checkExact(t *testing.T, ctx context.Context, m *ledgerModel) {
	t.Helper()
	ids := make([]string, 0, len(m.commands))
	for id := range m.commands {
		ids = append(ids, id)
	}
	pipelinetest.Eventually(t, 90*time.Second, func() error {
		var pending int
		err := d.pool.QueryRow(ctx, `SELECT count(*) FROM command_status WHERE command_id = ANY($1::uuid[]) AND status <> 'accepted'`, ids).Scan(&pending)
		if err != nil {
			return err
		}
		if pending > 0 {
			return fmt.Errorf("%d of %d commands not accepted yet", pending, len(ids))
		}
		return nil
	})
	// One outcome per command, and nothing the client did not ask for.
	var rows, withOneEvent int
	if err := d.pool.QueryRow(ctx, `SELECT count(*), count(*) FILTER (WHERE cardinality(event_ids) = 1) FROM command_status`).Scan(&rows, &withOneEvent); err != nil {
		t.Fatal(err)
	}
	if rows != len(ids) || withOneEvent != len(ids) {
		t.Errorf("command_status: %d rows, %d with exactly one event; want %d and %d", rows, withOneEvent, len(ids), len(ids))
	}
	for acct, want := range m.balance {
		a, err := d.client.Account(ctx, acct)
		if err != nil {
			t.Fatalf("account %s: %v", acct, err)
		}
		if a.Balance != want {
			t.Errorf("account %s: balance %d, want %d", acct, a.Balance, want)
		}
	}
	// The events topic, read_committed, holds each event once: one per
	// accepted command, no duplicates, versions 1..n per account.
	events := readEvents(t, ctx, d.BrokerAddr, d.Prefix+".events", d.ClientOpts...)
	seen := map[string]bool{}
	versions := map[string]int64{}
	for _, r := range events {
		id := header(r, pipeline.HeaderEventID)
		if seen[id] {
			t.Errorf("event %s appears twice in the events topic", id)
		}
		seen[id] = true
		v := header(r, pipeline.HeaderAggregateVersion)
		var ver int64
		fmt.Sscan(v, &ver)
		if ver != versions[string(r.Key)]+1 {
			t.Errorf("%s: version %d after %d", r.Key, ver, versions[string(r.Key)])
		}
		versions[string(r.Key)] = ver
	}
	if len(seen) != len(ids) {
		t.Errorf("events topic holds %d events, want %d (one per accepted command)", len(seen), len(ids))
	}
	// The operators' audit agrees: nothing lost or doubled.
	if out, err := d.Verify(ctx, 15*time.Minute); err != nil {
		t.Errorf("%v:\n%s", err, out)
	}
}

func header(r *kgo.Record, key string) string {
	for _, h := range r.Headers {
		if h.Key == key {
			return string(h.Value)
		}
	}
	return ""
}

// readEvents reads a topic read_committed from the start to its end,
// with a client of opts.
func readEvents(t *testing.T, ctx context.Context, broker, topic string, opts ...kgo.Opt) []*kgo.Record {
	t.Helper()
	recs, err := kafka.ReadTopic(ctx, pipelinetest.Client(t, kafka.ParseBrokers(broker), opts...), topic, true)
	if err != nil {
		t.Fatalf("read %s: %v", topic, err)
	}
	return recs
}

// Many deposits over HTTP, some retried with the same key (also
// concurrently) and some sent twice with different keys on purpose, give
// exactly the expected balances and one outcome per command.
func TestDepositsExactlyOnce(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	d := deploy(t, ctx)
	m := newModel()
	workload(t, ctx, func() *ledgerapp.Client { return d.client }, m, 20, 25, 0)
	if t.Failed() {
		return
	}
	d.checkExact(t, ctx, m)
}

// Every component is stopped mid-stream and started again, twice: once
// gracefully (SIGTERM) and once by SIGKILL. They continue from their stored
// offsets and the balances are still exact.
func TestRestartMidStream(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	d := deploy(t, ctx)
	m := newModel()

	var mu sync.Mutex
	current := func() *ledgerapp.Client {
		mu.Lock()
		defer mu.Unlock()
		return &ledgerapp.Client{Client: &apiclient.Client{BaseURL: d.client.BaseURL, APIKey: d.client.APIKey, HTTP: d.client.HTTP}}
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		workload(t, ctx, current, m, 10, 40, 10*time.Millisecond)
	}()

	for round, stop := range []func(p *Component){
		func(p *Component) {
			if err := p.Stop(15 * time.Second); err != nil {
				t.Errorf("%s: graceful stop: %v", p.Name, err)
			}
		},
		func(p *Component) { p.Kill() },
	} {
		time.Sleep(time.Duration(800+rand.IntN(800)) * time.Millisecond)
		for _, kind := range []string{"ingest", "relay", "processor", "projector"} {
			stop(d.comps[kind])
		}
		t.Logf("round %d: every component stopped", round+1)
		time.Sleep(300 * time.Millisecond)
		mu.Lock()
		d.startAll(t, ctx)
		mu.Unlock()
	}
	<-done
	if t.Failed() {
		return
	}
	d.checkExact(t, ctx, m)
	if n, err := d.comps["processor"].Metric(ctx, "onceflow_command_dedup_total"); err == nil {
		t.Logf("processor dedup after the last restart: %v", n)
	}
}
