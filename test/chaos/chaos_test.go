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

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/onceflow/onceflow"
	"github.com/onceflow/onceflow/examples/ledger/ledgerapp"
	"github.com/onceflow/onceflow/pipeline"
	"github.com/onceflow/onceflow/pipeline/avro"
	"github.com/onceflow/onceflow/pipeline/ingest"
	"github.com/onceflow/onceflow/pipeline/kafka"
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
	limit, target := duration+*drainFlag+5*time.Minute, "chaos"
	if *kafkaFlag {
		// The first round of faults may outlast the duration (below): a
		// rolling restart took 7.5 minutes at load 50.
		limit, target = limit+20*time.Minute, "chaos-kafka"
	}
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	t.Logf("seed %d, duration %s (reproduce: make %s SEED=%d DURATION=%s)", seed, duration, target, seed, duration)
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
	hk, err := subscribe(ctx, c, seed, tenants)
	if err != nil {
		t.Fatal(err)
	}
	reg, err := avro.NewClient(c.pl.RegistryURL)
	if err != nil {
		t.Fatal(err)
	}
	topics := kafka.Topics{Prefix: c.pl.Prefix}
	serdes, err := onceflow.NewSerdes(ctx, reg, ledgerapp.Domain(), "", topics)
	if err != nil {
		t.Fatal(err)
	}
	producer, err := kgo.NewClient(kgo.SeedBrokers(c.pl.Brokers()...))
	if err != nil {
		t.Fatal(err)
	}
	defer producer.Close()
	maxMessageBytes, err := topicMaxMessageBytes(ctx, producer, topics.Commands())
	if err != nil {
		t.Fatal(err)
	}
	if maxMessageBytes < 2*maxCommandBytes {
		t.Fatalf("%s takes records of %d bytes: a record over the processor's %d bytes would not fit", topics.Commands(), maxMessageBytes, maxCommandBytes)
	}
	// The hostile producer's batches may exceed the topic's limit, so the
	// broker, not the client, refuses the oversized record; uncompressed,
	// so the broker sees it at its size.
	hostileProducer, err := kgo.NewClient(kgo.SeedBrokers(c.pl.Brokers()...),
		kgo.ProducerBatchMaxBytes(int32(4*maxMessageBytes)), kgo.ProducerBatchCompression(kgo.NoCompression()))
	if err != nil {
		t.Fatal(err)
	}
	defer hostileProducer.Close()

	m := newModel()
	w := &workload{
		c: c, m: m, tenants: tenants, producer: producer, topic: topics.Commands(),
		encode: serdes.Commands.Encode, seed: seed,
		httpc:           &http.Client{Timeout: 2 * time.Second}, // clients time out and retry with the same key
		hostileProducer: hostileProducer, maxMessageBytes: maxMessageBytes,
	}
	f := newFaults(c, seed)

	start := time.Now()
	stop, stopWorkload := context.WithCancel(ctx)
	defer stopWorkload()
	finish, cancelFinish := context.WithCancel(ctx) // steps in flight at stop
	defer cancelFinish()
	go func() {
		select {
		case <-time.After(duration):
		case <-ctx.Done():
		}
		if c.kafka != nil {
			// On Apache Kafka one fault takes tens of seconds (a node's
			// restart; a rolling restart, minutes): the run goes on until
			// every kind has come once, so that a short run (CI's) meets
			// each.
			select {
			case <-f.firstRound:
			case <-ctx.Done():
			}
		}
		stopWorkload()
		time.AfterFunc(2*time.Minute, cancelFinish)
	}()
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

	vs, tl := check(ctx, c, m, serdes.Events.Decode)
	hvs, delivered, retried := hk.delivered(ctx, c, 2*time.Minute)
	vs = append(vs, hvs...)
	report(t, seed, time.Since(start), duration, m, tenants, f, tl, drainTime, drained)
	t.Logf("webhooks: %d subscribed events delivered and applied once (%d of them after the receiver's faults or a retry)", delivered, retried)
	if !verdict(t, f, seed, derr, vs) {
		return
	}
	if selfTest {
		checkerSelfTest(t, ctx, c, m, serdes.Events.Decode)
	}
}

// topicMaxMessageBytes returns a topic's max.message.bytes.
func topicMaxMessageBytes(ctx context.Context, cl *kgo.Client, topic string) (int, error) {
	rcs, err := kadm.NewClient(cl).DescribeTopicConfigs(ctx, topic)
	if err != nil {
		return 0, fmt.Errorf("describe %s: %w", topic, err)
	}
	for _, rc := range rcs {
		for _, c := range rc.Configs {
			if c.Key == "max.message.bytes" && c.Value != nil {
				return strconv.Atoi(*c.Value)
			}
		}
	}
	return 0, fmt.Errorf("%s has no max.message.bytes", topic)
}

// drain waits until the outbox is empty, every command the workload knows,
// and every transfer credit and refund, has its outcome, and every hostile
// record the broker holds is in the DLQ (with its failure recorded when it
// names a valid command of a valid aggregate).
func drain(ctx context.Context, c *cluster, m *model, within time.Duration) (bool, error) {
	deadline := time.Now().Add(within)
	keys := make([]commandKey, 0, len(m.commands))
	for k := range m.commands {
		keys = append(keys, k)
	}
	var last error
	for time.Now().Before(deadline) {
		last = drained(ctx, c, keys)
		if last == nil {
			last = hostileDrained(ctx, c, m)
		}
		if last == nil {
			time.Sleep(time.Second) // let any in-flight duplicate reach the inbox
			return true, nil
		}
		time.Sleep(250 * time.Millisecond)
	}
	return false, last
}

func drained(ctx context.Context, c *cluster, keys []commandKey) error {
	var backlog int
	if err := c.pool.QueryRow(ctx, `SELECT count(*) FROM outbox`).Scan(&backlog); err != nil {
		return err
	}
	if backlog > 0 {
		return fmt.Errorf("%d outbox rows", backlog)
	}
	if n, err := withoutOutcome(ctx, c, keys); err != nil || n > 0 {
		if err != nil {
			return err
		}
		return fmt.Errorf("%d commands without an outcome", n)
	}
	var waiting int
	if err := c.pool.QueryRow(ctx, `SELECT count(*) FROM command_status WHERE status = 'pending'`).Scan(&waiting); err != nil {
		return err
	}
	if waiting > 0 {
		return fmt.Errorf("%d commands pending", waiting)
	}
	// Transfers: their credits (and refunds) are commands too, produced by
	// the processor; wait for their outcomes.
	var openTransfers int
	err := c.pool.QueryRow(ctx, `SELECT count(*) FROM command_status WHERE command_type IN ('RequestTransfer', 'CreditTransfer') AND status = 'pending'`).Scan(&openTransfers)
	if err != nil {
		return err
	}
	if openTransfers > 0 {
		return fmt.Errorf("%d transfers in flight", openTransfers)
	}
	return nil
}

// withoutOutcome counts the commands of keys that have no row in
// command_status, or a pending one.
func withoutOutcome(ctx context.Context, c *cluster, keys []commandKey) (int, error) {
	ids, tenants, aggs := make([]string, len(keys)), make([]string, len(keys)), make([]string, len(keys))
	for i, k := range keys {
		ids[i], tenants[i], aggs[i] = k.id, k.tenant, k.aggregate
	}
	var n int
	err := c.pool.QueryRow(ctx, `
		SELECT count(*) FROM unnest($1::uuid[], $2::text[], $3::text[]) AS k(id, tenant, aggregate_id)
		WHERE NOT EXISTS (SELECT 1 FROM command_status s
		                  WHERE (s.command_id, s.tenant, s.aggregate_id) = (k.id, k.tenant, k.aggregate_id) AND s.status <> 'pending')`,
		ids, tenants, aggs).Scan(&n)
	return n, err
}

// hostileDrained reports whether every hostile record in the commands
// topic is in the DLQ, and each naming a valid command of a valid
// aggregate has its outcome.
func hostileDrained(ctx context.Context, c *cluster, m *model) error {
	topics := kafka.Topics{Prefix: c.pl.Prefix}
	commands, err := readAll(ctx, c.pl.BrokerAddr, topics.Commands())
	if err != nil {
		return err
	}
	dlq, err := readAll(ctx, c.pl.BrokerAddr, topics.DLQ())
	if err != nil {
		return err
	}
	inDLQ := map[source]bool{}
	for _, r := range dlq {
		part, _ := strconv.ParseInt(header(r, pipeline.HeaderDLQSourcePartition), 10, 32)
		off, _ := strconv.ParseInt(header(r, pipeline.HeaderDLQSourceOffset), 10, 64)
		inDLQ[source{int32(part), off}] = true
	}
	hostile := map[int]*hostileRecord{}
	for _, h := range m.hostile {
		hostile[h.n] = h
	}
	var waiting int
	var failed []commandKey
	for _, r := range commands {
		n, ok := hostileNumber(r)
		if !ok {
			continue
		}
		if !inDLQ[source{r.Partition, r.Offset}] {
			waiting++
		}
		if h := hostile[n]; h != nil && h.kind.onAggregate {
			failed = append(failed, commandKey{h.commandID, h.tenant, h.aggregate})
		}
	}
	if waiting > 0 {
		return fmt.Errorf("%d hostile records not in the DLQ yet", waiting)
	}
	if n, err := withoutOutcome(ctx, c, failed); err != nil || n > 0 {
		if err != nil {
			return err
		}
		return fmt.Errorf("%d hostile records without their failure in command_status", n)
	}
	return nil
}

// report prints the summary table.
func report(t *testing.T, seed uint64, elapsed, duration time.Duration, m *model, tenants []*tenant, f *faults, tl tally, drain time.Duration, drained bool) {
	var b strings.Builder
	tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "chaos seed %d\t%s of faults, %s in all\n", seed, duration, elapsed.Round(time.Second))
	fmt.Fprintf(tw, "commands accepted (2xx or acked by Kafka)\t%d\n", len(m.commands))
	fmt.Fprintf(tw, "  HTTP requests sent\t%d\n", m.requests.Load())
	fmt.Fprintf(tw, "  produced straight to Kafka\t%d (%d of them twice)\n", m.kafkaProduced.Load(), m.kafkaTwice.Load())
	fmt.Fprintf(tw, "  ingest's ids reused on another account and tenant\t%d (%d more commands)\n", m.reusedIDs.Load(), 2*m.reusedIDs.Load())
	fmt.Fprintf(tw, "  sent again with a new key on purpose\t%d\n", m.newKeyDups.Load())
	hot, perTenant, busiestOther := hotCounts(m, tenants)
	fmt.Fprintf(tw, "  to the hot account (%s of each tenant)\t%d, %d%% (%s; the busiest other account %d)\n",
		tenants[0].accounts[hotAccount], hot, 100*hot/max(1, len(m.commands)), perTenant, busiestOther)
	fmt.Fprintf(tw, "outcomes\t%d accepted, %d rejected, %d failed (%d transfers refunded)\n", tl.accepted, tl.rejected, tl.failed, tl.transfersRefund)
	byKind := map[string]int{}
	for _, h := range m.hostile {
		byKind[h.kind.name]++
	}
	fmt.Fprintf(tw, "hostile records produced\t%d: %d taken by the broker, %d in the DLQ, %d recorded as CommandFailed, %d refused by the broker\n",
		len(m.hostile), tl.hostileTaken, tl.hostileDLQ, tl.hostileFailed, tl.hostileRefused)
	if tl.hostileUnsure > 0 || tl.hostileTwice > 0 {
		fmt.Fprintf(tw, "  produce errors (fate read from the topic), held twice\t%d, %d\n", tl.hostileUnsure, tl.hostileTwice)
	}
	for _, k := range hostileKinds {
		outcome := k.reason
		switch {
		case k.reason == "":
			outcome = fmt.Sprintf("refused by the broker, MESSAGE_TOO_LARGE within %s", tl.refusalWait.Round(time.Millisecond))
		case k.onAggregate:
			outcome += ", failed on its aggregate"
		}
		fmt.Fprintf(tw, "  %s\t%d (%s)\n", k.name, byKind[k.name], outcome)
	}
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

// hotCounts counts the accepted commands addressed to each tenant's hot
// account, and to the busiest of the others.
func hotCounts(m *model, tenants []*tenant) (hot int, perTenant string, busiestOther int) {
	per := map[string]int{} // by aggregate id
	for k := range m.commands {
		per[k.aggregate]++
	}
	var parts []string
	for _, tn := range tenants {
		for i, a := range tn.accounts {
			n := per[pipeline.AggregateID(tn.name, a)]
			if i == hotAccount {
				hot += n
				parts = append(parts, fmt.Sprintf("%s %d", tn.name, n))
			} else {
				busiestOther = max(busiestOther, n)
			}
		}
	}
	return hot, strings.Join(parts, ", "), busiestOther
}
