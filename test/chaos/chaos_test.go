package chaos

import (
	"context"
	"flag"
	"fmt"
	"net/http"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"text/tabwriter"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/onceflow/onceflow"
	"github.com/onceflow/onceflow/examples/ledger"
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
	// Linking the nine binaries took over 5 minutes at load 60 on the two
	// shared cores (two runs building at once).
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
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
	ds, derr := drain(ctx, c, m, *drainFlag)
	drainTime := time.Since(faultsStopped)

	vs, tl := check(ctx, c, m, serdes.Events.Decode)
	hvs, delivered, retried := hk.delivered(ctx, c, 2*time.Minute)
	vs = append(vs, hvs...)
	report(t, seed, time.Since(start), duration, m, tenants, f, tl, drainTime, ds)
	t.Logf("webhooks: %d subscribed events delivered and applied once (%d of them after the receiver's faults or a retry)", delivered, retried)
	if !verdict(t, f, seed, derr, vs) {
		return
	}
	audit(t, ctx, c, seed, start)
	if selfTest {
		checkerSelfTest(t, ctx, c, m, serdes.Events.Decode)
	}
}

// audit runs the operators' auditor over the whole run: what the harness
// checked from its own model, checked again from each stage's records
// (docs/operations.md#verify).
func audit(t *testing.T, ctx context.Context, c *cluster, seed uint64, start time.Time) {
	t.Helper()
	if out, err := c.pl.Verify(ctx, time.Since(start)+time.Minute); err != nil {
		t.Errorf("seed %d: %v\n%s", seed, err, out)
	} else {
		t.Logf("onceflow verify over the run:\n%s", out)
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

// drain waits until the outbox is empty, every command the harness knows of
// has its outcome — the workload's, and the credits and refunds the processor
// sends for the transfers among them — no command is pending, and every
// hostile record the broker holds is in the DLQ (with its failure recorded
// when it names a valid command of a valid aggregate). The saga's commands
// travel through the commands topic and the processor only, never the outbox
// nor ingest's pending rows: after a rolling restart of Apache Kafka the
// processors were still retrying transactions seconds after the workload's
// own commands all had theirs, and a drain that waited for those only let the
// check read 114 credits as lost that arrived later
// (docs/decisions/0058-chaos-on-three-nodes.md). On timeout the error names
// what is missing, where the commands topic holds it, and the consumer
// groups' lag.
func drain(ctx context.Context, c *cluster, m *model, within time.Duration) (drainStats, error) {
	start := time.Now()
	deadline := start.Add(within)
	aw := newAwaited(m)
	var st drainStats
	for {
		err := drained(ctx, c, m, aw, &st, start)
		if err == nil {
			time.Sleep(time.Second) // let any in-flight duplicate reach the inbox
			st.drained = true
			return st, nil
		}
		if time.Now().After(deadline) {
			return st, fmt.Errorf("%w%s", err, aw.diagnose(ctx, c))
		}
		time.Sleep(250 * time.Millisecond)
	}
}

// drainStats is what the drain saw: when the workload's own commands had
// their outcomes, how many of the saga's were then still on their way,
// and when those had theirs too.
type drainStats struct {
	drained bool
	// workload is when the outbox was empty and every command of the
	// workload had its outcome; 0 if never.
	workload time.Duration
	// sagaThen is how many credits and refunds had no outcome at that
	// moment.
	sagaThen int
	// saga is when every credit and refund had its outcome too.
	saga time.Duration
}

func drained(ctx context.Context, c *cluster, m *model, aw *awaited, st *drainStats, start time.Time) error {
	var backlog int
	if err := c.pool.QueryRow(ctx, `SELECT count(*) FROM outbox`).Scan(&backlog); err != nil {
		return err
	}
	if backlog > 0 {
		return fmt.Errorf("%d outbox rows", backlog)
	}
	if err := aw.update(ctx, c); err != nil {
		return err
	}
	if n := aw.count(false); n > 0 {
		return fmt.Errorf("%d of the workload's commands without an outcome", n)
	}
	if st.workload == 0 {
		st.workload, st.sagaThen = time.Since(start), aw.count(true)
	}
	if n := aw.count(true); n > 0 {
		return fmt.Errorf("%d credits and refunds of transfers without an outcome", n)
	}
	if st.saga == 0 {
		st.saga = time.Since(start)
	}
	var waiting int
	if err := c.pool.QueryRow(ctx, `SELECT count(*) FROM command_status WHERE status = 'pending'`).Scan(&waiting); err != nil {
		return err
	}
	if waiting > 0 {
		return fmt.Errorf("%d commands pending", waiting)
	}
	return hostileDrained(ctx, c, m)
}

// awaited is the commands the drain still waits for. A workload's
// RequestTransfer, once accepted, is followed by its credit on the target
// account; a rejected credit by the refund on the source.
type awaited struct {
	waiting map[commandKey]awaitedCommand
}

type awaitedCommand struct {
	s    *sent  // the workload's command, or the transfer a credit or refund is of
	step string // "" the workload's command, "credit" or "refund"
}

func newAwaited(m *model) *awaited {
	aw := &awaited{waiting: make(map[commandKey]awaitedCommand, len(m.commands))}
	for k, s := range m.commands {
		aw.waiting[k] = awaitedCommand{s: s}
	}
	return aw
}

// count counts the waiting commands of the saga (credits and refunds) or
// of the workload.
func (aw *awaited) count(saga bool) int {
	n := 0
	for _, w := range aw.waiting {
		if (w.step != "") == saga {
			n++
		}
	}
	return n
}

// update reads the outcomes of the waiting commands, drops those decided
// and adds the saga's next command where one follows.
func (aw *awaited) update(ctx context.Context, c *cluster) error {
	keys := make([]commandKey, 0, len(aw.waiting))
	for k := range aw.waiting {
		keys = append(keys, k)
	}
	decided, err := outcomes(ctx, c, keys)
	if err != nil {
		return err
	}
	for k, status := range decided {
		w := aw.waiting[k]
		delete(aw.waiting, k)
		s := w.s
		source := pipeline.AggregateID(s.Tenant, s.Account)
		switch {
		case w.step == "" && s.Type == "RequestTransfer" && status == "accepted":
			credit := ledger.CreditCommandID(source, pipeline.MustParseID(s.ID), s.Transfer)
			aw.waiting[commandKey{credit.String(), s.Tenant, pipeline.AggregateID(s.Tenant, s.To)}] = awaitedCommand{s, "credit"}
		case w.step == "credit" && status == "rejected":
			refund := ledger.RefundCommandID(pipeline.MustParseID(k.id))
			aw.waiting[commandKey{refund.String(), s.Tenant, source}] = awaitedCommand{s, "refund"}
		}
	}
	return nil
}

// outcomes returns the status of each of keys that has an outcome (a
// command_status row that is not pending).
func outcomes(ctx context.Context, c *cluster, keys []commandKey) (map[commandKey]string, error) {
	ids, tenants, aggs := make([]string, len(keys)), make([]string, len(keys)), make([]string, len(keys))
	for i, k := range keys {
		ids[i], tenants[i], aggs[i] = k.id, k.tenant, k.aggregate
	}
	rows, err := c.pool.Query(ctx, `
		SELECT k.id::text, k.tenant, k.aggregate_id, s.status
		FROM unnest($1::uuid[], $2::text[], $3::text[]) AS k(id, tenant, aggregate_id)
		JOIN command_status s ON (s.command_id, s.tenant, s.aggregate_id) = (k.id, k.tenant, k.aggregate_id)
		WHERE s.status <> 'pending'`,
		ids, tenants, aggs)
	if err != nil {
		return nil, fmt.Errorf("read outcomes: %w", err)
	}
	defer rows.Close()
	out := map[commandKey]string{}
	for rows.Next() {
		var k commandKey
		var status string
		if err := rows.Scan(&k.id, &k.tenant, &k.aggregate, &status); err != nil {
			return nil, fmt.Errorf("read outcomes: %w", err)
		}
		out[k] = status
	}
	return out, rows.Err()
}

// withoutOutcome counts the commands of keys that have no row in
// command_status, or a pending one.
func withoutOutcome(ctx context.Context, c *cluster, keys []commandKey) (int, error) {
	distinct := map[commandKey]bool{}
	for _, k := range keys {
		distinct[k] = true
	}
	decided, err := outcomes(ctx, c, keys)
	return len(distinct) - len(decided), err
}

// diagnose says, for a drain that ran out of time, which commands are
// still waited for and where the commands topic holds them — committed,
// only in an aborted or open transaction (read_uncommitted), or not at
// all — and how far each consumer group is from its topics' ends.
func (aw *awaited) diagnose(ctx context.Context, c *cluster) string {
	var b strings.Builder
	if err := aw.update(ctx, c); err != nil {
		fmt.Fprintf(&b, "\nread outcomes: %v", err)
	}
	byID := map[string]bool{}
	for k := range aw.waiting {
		byID[k.id] = true
	}
	topics := kafka.Topics{Prefix: c.pl.Prefix}
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.pl.Brokers()...))
	if err != nil {
		return fmt.Sprintf("; diagnose: %v", err)
	}
	defer cl.Close()
	// Where each is: committed, or only read_uncommitted (in a
	// transaction aborted or still open).
	where := map[string][]string{}
	committedAt := map[source]bool{}
	for _, committed := range []bool{true, false} {
		recs, err := kafka.ReadTopic(ctx, cl, topics.Commands(), committed)
		if err != nil {
			fmt.Fprintf(&b, "\nread %s (read_committed %v): %v", topics.Commands(), committed, err)
			continue
		}
		for _, r := range recs {
			id, at := header(r, pipeline.HeaderCommandID), source{r.Partition, r.Offset}
			switch {
			case !byID[id]:
			case committed:
				committedAt[at] = true
				where[id] = append(where[id], fmt.Sprintf("committed at %d/%d", r.Partition, r.Offset))
			case !committedAt[at]:
				where[id] = append(where[id], fmt.Sprintf("only read_uncommitted at %d/%d", r.Partition, r.Offset))
			}
		}
	}
	var lines []string
	for k, w := range aw.waiting {
		step := w.step
		if step == "" {
			step = w.s.Type
		}
		at := strings.Join(where[k.id], ", ")
		if at == "" {
			at = "not in " + topics.Commands()
		}
		lines = append(lines, fmt.Sprintf("%s %s of %s: %s", step, k.id, k.aggregate, at))
	}
	sort.Strings(lines)
	if len(lines) > 20 {
		lines = append(lines[:20], fmt.Sprintf("… and %d more", len(lines)-20))
	}
	for _, l := range lines {
		b.WriteString("\n  " + l)
	}
	adm := kadm.NewClient(cl)
	if groups, err := adm.ListGroups(ctx); err != nil {
		fmt.Fprintf(&b, "\nlist groups: %v", err)
	} else if lags, err := adm.Lag(ctx, groups.Groups()...); err != nil {
		fmt.Fprintf(&b, "\ngroup lag: %v", err)
	} else {
		for _, g := range lags.Sorted() {
			fmt.Fprintf(&b, "\ngroup %s (%s): lag %d", g.Group, g.State, g.Lag.Total())
			for _, l := range g.Lag.Sorted() {
				switch {
				case l.Err != nil:
					fmt.Fprintf(&b, "; %s/%d: %v", l.Topic, l.Partition, l.Err)
				case l.Lag > 1: // a transaction's commit marker is the last offset
					fmt.Fprintf(&b, "; %s/%d commit %d end %d", l.Topic, l.Partition, l.Commit.At, l.End.Offset)
				}
			}
		}
	}
	if txs, err := adm.ListTransactions(ctx, nil, []string{"Ongoing", "PrepareCommit", "PrepareAbort"}); err == nil {
		for _, id := range txs.TransactionalIDs() {
			fmt.Fprintf(&b, "\nopen transaction %s (%s)", id, txs[id].State)
		}
	}
	return b.String()
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
func report(t *testing.T, seed uint64, elapsed, duration time.Duration, m *model, tenants []*tenant, f *faults, tl tally, drain time.Duration, ds drainStats) {
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
		if st := f.statesOf(k); st != "" {
			fmt.Fprintf(tw, "    transaction state struck\t%s\n", st)
		}
	}
	fmt.Fprintf(tw, "duplicates absorbed\t\n")
	fmt.Fprintf(tw, "  ingest: retries with the same key\t%d (%d answered as replays)\n", m.retries.Load(), m.replays.Load())
	fmt.Fprintf(tw, "  processor: command records seen again\t%d\n", tl.processorDedup)
	fmt.Fprintf(tw, "  projector: event records seen again\t%d\n", tl.projectorDedup)
	fmt.Fprintf(tw, "events\t%d distinct\n", tl.events)
	fmt.Fprintf(tw, "money\t%d = deposits %d - withdrawals %d\n", tl.totalMoney, tl.deposits, tl.withdrawals)
	fmt.Fprintf(tw, "LOSSES (must be 0)\t%d\n", tl.lost)
	fmt.Fprintf(tw, "DOUBLE EFFECTS (must be 0)\t%d\n", tl.doubleEffects)
	fmt.Fprintf(tw, "time to drain\t%s (drained: %v)\n", drain.Round(100*time.Millisecond), ds.drained)
	if ds.workload > 0 {
		fmt.Fprintf(tw, "  the workload's commands decided\tafter %s, with %d credits and refunds still on their way\n", ds.workload.Round(100*time.Millisecond), ds.sagaThen)
	}
	if ds.saga > 0 {
		fmt.Fprintf(tw, "  the transfers' credits and refunds decided\tafter %s\n", ds.saga.Round(100*time.Millisecond))
	}
	tw.Flush()
	t.Log("\n" + b.String())
	fmt.Print(b.String())
	// What each fault did and cut, passed or not.
	f.mu.Lock()
	t.Logf("fault log:\n%s", strings.Join(f.log, "\n"))
	f.mu.Unlock()
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
