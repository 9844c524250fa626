package chaos

import (
	"context"
	"flag"
	"fmt"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"text/tabwriter"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/onceflow/onceflow/pipeline/avro"
	"github.com/onceflow/onceflow/pipeline/ingest"
	"github.com/onceflow/onceflow/pipeline/kafka"
	"github.com/onceflow/onceflow/pipeline/stack"
	"github.com/onceflow/onceflow/test/e2e"
)

var (
	seedFlag     = flag.Uint64("chaos.seed", 0, "run this seed only (0: the fixed seed list)")
	seedsFlag    = flag.String("chaos.seeds", "1,2", "the fixed seed list CI runs")
	durationFlag = flag.Duration("chaos.duration", 40*time.Second, "how long the workload and the faults run, per seed")
	drainFlag    = flag.Duration("chaos.drain", 3*time.Minute, "how long the pipeline may take to drain after the faults stop")
	faultsFlag   = flag.String("chaos.faults", "", "inject only these fault kinds, comma separated: kill, broker, postgres, zombie, relay (empty: all)")
)

var binDir string

func TestMain(m *testing.M) {
	flag.Parse()
	if testing.Short() {
		fmt.Println("chaos: skipped with -short")
		os.Exit(0)
	}
	dir, err := os.MkdirTemp("", "onceflow-chaos-bin")
	if err != nil {
		panic(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	if err := e2e.Build(ctx, dir); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	cancel()
	binDir = dir
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

func seeds(t *testing.T) []uint64 {
	if *seedFlag != 0 {
		return []uint64{*seedFlag}
	}
	var out []uint64
	for _, s := range strings.Split(*seedsFlag, ",") {
		n, err := strconv.ParseUint(strings.TrimSpace(s), 10, 64)
		if err != nil {
			t.Fatalf("-chaos.seeds: %v", err)
		}
		out = append(out, n)
	}
	return out
}

func TestChaos(t *testing.T) {
	for i, seed := range seeds(t) {
		t.Run(fmt.Sprintf("seed=%d", seed), func(t *testing.T) { runSeed(t, seed, *durationFlag, i == 0) })
	}
}

func runSeed(t *testing.T, seed uint64, duration time.Duration, selfTest bool) {
	ctx, cancel := context.WithTimeout(context.Background(), duration+*drainFlag+5*time.Minute)
	defer cancel()
	t.Logf("seed %d, duration %s (reproduce: make chaos SEED=%d DURATION=%s)", seed, duration, seed, duration)
	c := startCluster(t, ctx, binDir)

	tenants := make([]*tenant, 3)
	for i := range tenants {
		tn := &tenant{name: fmt.Sprintf("tenant%d", i), key: ingest.NewAPIKey()}
		for a := 0; a < 12; a++ {
			tn.accounts = append(tn.accounts, fmt.Sprintf("acc-%d", a))
		}
		tn.opened = make([]atomic.Bool, len(tn.accounts))
		if err := ingest.CreateAPIKey(ctx, c.pool, tn.name, "chaos", tn.key); err != nil {
			t.Fatal(err)
		}
		tenants[i] = tn
	}
	reg, err := avro.NewClient(c.pl.RegistryURL)
	if err != nil {
		t.Fatal(err)
	}
	topics := kafka.Topics{Prefix: c.pl.Prefix}
	serdes, err := stack.NewSerdes(ctx, reg, topics)
	if err != nil {
		t.Fatal(err)
	}
	producer, err := kgo.NewClient(kgo.SeedBrokers(c.pl.BrokerAddr))
	if err != nil {
		t.Fatal(err)
	}
	defer producer.Close()

	m := newModel()
	w := &workload{
		c: c, m: m, tenants: tenants, producer: producer, topic: topics.Commands(),
		encode: serdes.Commands.Encode, seed: seed,
		httpc: &http.Client{Timeout: 2 * time.Second}, // clients time out and retry with the same key
	}
	f := newFaults(c, seed)

	start := time.Now()
	stop, stopWorkload := context.WithTimeout(ctx, duration)
	defer stopWorkload()
	finish, cancelFinish := context.WithTimeout(ctx, duration+2*time.Minute)
	defer cancelFinish()
	faultsDone := make(chan struct{})
	go func() { defer close(faultsDone); f.run(stop) }()
	w.run(stop, finish, 6)
	<-faultsDone
	faultsStopped := time.Now()
	if err := c.ensureAll(ctx); err != nil {
		t.Fatalf("restart after the faults: %v", err)
	}
	drained, derr := drain(ctx, c, m, *drainFlag)
	drainTime := time.Since(faultsStopped)

	vs, tl := check(ctx, c, m)
	report(t, seed, time.Since(start), duration, m, f, tl, drainTime, drained)
	f.mu.Lock()
	for _, err := range f.errs {
		t.Errorf("fault injection: %v", err)
	}
	f.mu.Unlock()
	if derr != nil {
		t.Errorf("seed %d: pipeline did not drain within %s: %v", seed, *drainFlag, derr)
	}
	if len(vs) > 0 {
		t.Errorf("seed %d: first violated property: %s", seed, vs[0])
		for _, v := range vs[1:] {
			t.Errorf("also violated: %s", v)
		}
		f.mu.Lock()
		t.Logf("fault log:\n%s", strings.Join(f.log, "\n"))
		f.mu.Unlock()
		return
	}
	if selfTest {
		checkerSelfTest(t, ctx, c, m)
	}
}

// drain waits until the outbox is empty and every command the workload
// knows, and every transfer credit and refund, has its outcome.
func drain(ctx context.Context, c *cluster, m *model, within time.Duration) (bool, error) {
	deadline := time.Now().Add(within)
	ids := make([]string, 0, len(m.commands))
	for id := range m.commands {
		ids = append(ids, id)
	}
	var last error
	for time.Now().Before(deadline) {
		last = drained(ctx, c, ids)
		if last == nil {
			time.Sleep(time.Second) // let any in-flight duplicate reach the inbox
			return true, nil
		}
		time.Sleep(250 * time.Millisecond)
	}
	return false, last
}

func drained(ctx context.Context, c *cluster, ids []string) error {
	var backlog int
	if err := c.pool.QueryRow(ctx, `SELECT count(*) FROM outbox`).Scan(&backlog); err != nil {
		return err
	}
	if backlog > 0 {
		return fmt.Errorf("%d outbox rows", backlog)
	}
	var waiting int
	err := c.pool.QueryRow(ctx, `
		SELECT (SELECT count(*) FROM unnest($1::uuid[]) AS id
		        WHERE NOT EXISTS (SELECT 1 FROM command_status s WHERE s.command_id = id AND s.status <> 'pending'))
		     + (SELECT count(*) FROM command_status WHERE status = 'pending')`, ids).Scan(&waiting)
	if err != nil {
		return err
	}
	if waiting > 0 {
		return fmt.Errorf("%d commands without an outcome", waiting)
	}
	// Transfers: their credits (and refunds) are commands too, produced by
	// the processor; wait for their outcomes.
	var openTransfers int
	err = c.pool.QueryRow(ctx, `SELECT count(*) FROM command_status WHERE command_type IN ('RequestTransfer', 'CreditTransfer') AND status = 'pending'`).Scan(&openTransfers)
	if err != nil {
		return err
	}
	if openTransfers > 0 {
		return fmt.Errorf("%d transfers in flight", openTransfers)
	}
	return nil
}

// report prints the summary table.
func report(t *testing.T, seed uint64, elapsed, duration time.Duration, m *model, f *faults, tl tally, drain time.Duration, drained bool) {
	var b strings.Builder
	tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "chaos seed %d\t%s of faults, %s in all\n", seed, duration, elapsed.Round(time.Second))
	fmt.Fprintf(tw, "commands accepted (2xx or acked by Kafka)\t%d\n", len(m.commands))
	fmt.Fprintf(tw, "  HTTP requests sent\t%d\n", m.requests.Load())
	fmt.Fprintf(tw, "  produced straight to Kafka\t%d (%d of them twice)\n", m.kafkaProduced.Load(), m.kafkaTwice.Load())
	fmt.Fprintf(tw, "  sent again with a new key on purpose\t%d\n", m.newKeyDups.Load())
	fmt.Fprintf(tw, "outcomes\t%d accepted, %d rejected (%d transfers refunded)\n", tl.accepted, tl.rejected, tl.transfersRefund)
	kinds, counts := f.summary()
	total := 0
	for _, k := range kinds {
		total += counts[k]
	}
	fmt.Fprintf(tw, "faults injected\t%d\n", total)
	for _, k := range kinds {
		fmt.Fprintf(tw, "  %s\t%d\n", k, counts[k])
	}
	fmt.Fprintf(tw, "duplicates absorbed\t\n")
	fmt.Fprintf(tw, "  ingest: retries with the same key\t%d (%d answered as replays)\n", m.retries.Load(), m.replays.Load())
	fmt.Fprintf(tw, "  processor: command records seen again\t%d\n", tl.processorDedup)
	fmt.Fprintf(tw, "  projector: event records seen again\t%d\n", tl.projectorDedup)
	fmt.Fprintf(tw, "events\t%d distinct\n", tl.events)
	fmt.Fprintf(tw, "money\t%d = deposits %d - withdrawals %d\n", tl.totalMoney, tl.deposits, tl.withdrawals)
	fmt.Fprintf(tw, "LOSSES (must be 0)\t%d\n", tl.lost)
	fmt.Fprintf(tw, "DOUBLE EFFECTS (must be 0)\t%d\n", tl.doubleEffects)
	fmt.Fprintf(tw, "time to drain\t%s (drained: %v)\n", drain.Round(100*time.Millisecond), drained)
	tw.Flush()
	t.Log("\n" + b.String())
	fmt.Print(b.String())
}
