package natsink

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"sort"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/onceflow/onceflow/examples/ledger"
	"github.com/onceflow/onceflow/pipeline"
	"github.com/onceflow/onceflow/pipeline/avro"
	"github.com/onceflow/onceflow/pipeline/kafka"
	"github.com/onceflow/onceflow/pipeline/natsink/natsinktest"
	"github.com/onceflow/onceflow/pipeline/pipelinetest"
)

// benchMode is one way of taking the events topic somewhere.
type benchMode struct {
	name string
	// inFlight is the sink's MaxInFlight; 0 is a baseline (run).
	inFlight int
	run      func(ctx context.Context, cl *kgo.Client, nc *nats.Conn, subject string) error
}

// BenchmarkForward forwards the same preloaded events (the ledger's, Avro
// as the processor writes them, over 1,000 accounts on 8 partitions) to
// JetStream with the sink — its default MaxInFlight, and 1, which keeps
// each aggregate's order through failures — next to two baselines read
// with the same consumer settings (read_committed, an offset commit per
// poll batch): the events consumed from Kafka and committed without
// publishing (what reading costs), and the same messages published to
// core NATS with no stream and no acknowledgement, flushed before each
// commit (what a sink without JetStream's guarantee would do). The broker
// runs in this process, nats-server in its own: runs go in ABBA order so a
// neighbour's load falls on every mode alike, each mode's figure is the
// median, with the CPU time per event of this process and of nats-server.
func BenchmarkForward(b *testing.B) {
	n := benchEvents(b)
	ns := natsinktest.Start(b)
	broker := pipelinetest.Broker(b)
	topics := pipelinetest.Topics(b, broker.Addrs(), 8)
	preload(b, broker.Addrs(), topics.Events(), n)
	modes := []benchMode{
		{name: "kafka", run: consumeOnly},
		{name: "core-nats", run: corePublish},
		{name: "jetstream", inFlight: DefaultMaxInFlight},
		{name: "jetstream-in-flight-1", inFlight: 1},
	}
	order := []int{0, 1, 2, 3, 3, 2, 1, 0}
	for range b.N {
		rate := make([][]float64, len(modes))
		cpu := make([][]float64, len(modes))
		natsCPU := make([][]float64, len(modes))
		for i, m := range order {
			r, c, nc := forwardRun(b, ns, broker.Addrs(), topics.Events(), modes[m], fmt.Sprintf("run-%d", i), n)
			rate[m], cpu[m], natsCPU[m] = append(rate[m], r), append(cpu[m], c), append(natsCPU[m], nc)
		}
		for i, m := range modes {
			b.ReportMetric(median(rate[i]), m.name+"_events/s")
		}
		js, base := median(rate[2]), median(rate[0])
		b.ReportMetric(js/base, "jetstream/kafka")
		b.ReportMetric(js/median(rate[1]), "jetstream/core-nats")
		for i, m := range modes {
			b.Logf("%s: %.0f events/s (%.1f µs CPU/event here, %.1f µs in nats-server)",
				m.name, median(rate[i]), median(cpu[i]), median(natsCPU[i]))
		}
		b.Logf("%d events, 8 partitions, 1,000 accounts; load average at the end %s", n, loadAverage())
	}
}

func benchEvents(b *testing.B) int {
	if v := os.Getenv("ONCEFLOW_BENCH_EVENTS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			b.Fatalf("ONCEFLOW_BENCH_EVENTS=%q: want a positive number", v)
		}
		return n
	}
	return 50_000
}

// preload writes n ledger events as the processor would: each account
// opened, then deposits.
func preload(b *testing.B, brokers []string, topic string, n int) {
	b.Helper()
	ctx := context.Background()
	schema, err := ledger.SchemaOf(ledger.Events)
	if err != nil {
		b.Fatal(err)
	}
	serde, err := avro.NewSerde(avro.NewEmbedded(), avro.ValueSubject(topic), schema, ledger.EventTypes())
	if err != nil {
		b.Fatal(err)
	}
	cl := pipelinetest.Client(b, brokers, kgo.ProducerLinger(5*time.Millisecond))
	const accounts = 1000
	version := make([]int64, accounts)
	recs := make([]*kgo.Record, 0, 10_000)
	for i := range n {
		a := i % accounts
		var m pipeline.Message = ledger.Deposited{Amount: int64(i + 1)}
		if version[a] == 0 {
			m = ledger.AccountOpened{Currency: "EUR"}
		}
		version[a]++
		value, err := serde.Encode(ctx, m)
		if err != nil {
			b.Fatal(err)
		}
		agg := pipeline.AggregateID("acme", "acc-"+strconv.Itoa(a))
		cmd := pipeline.NewCommandID()
		recs = append(recs, kafka.EventRecord(topic, pipeline.Event{ID: pipeline.EventID(agg, cmd, 0), CommandID: cmd, CommandType: "Deposit",
			Tenant: "acme", AggregateID: agg, Version: version[a], Time: time.Now(), Payload: m}, value))
		if len(recs) == cap(recs) || i == n-1 {
			if err := cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
				b.Fatal(err)
			}
			recs = recs[:0]
		}
	}
}

// forwardRun takes the whole topic through mode in a group of its own and
// returns events per second from the first fetch to the last commit, and
// the CPU time per event of this process and of nats-server.
func forwardRun(b *testing.B, ns *natsinktest.Server, brokers []string, topic string, mode benchMode, instance string, n int) (rate, cpuUS, natsUS float64) {
	b.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	group := "bench-" + mode.name + "-" + instance
	stream := "bench_" + instance
	lagCl := pipelinetest.Client(b, brokers)
	caughtUp := func() bool {
		lags, err := kafka.Lag(ctx, lagCl, []kafka.LagSource{{Group: group, Topics: []string{topic}}})
		if err != nil {
			b.Fatal(err)
		}
		for _, l := range lags {
			if l.Lag != 0 || l.Committed < 0 {
				return false
			}
		}
		return len(lags) > 0
	}
	nc, js := ns.Connect(b)
	done := make(chan error, 1)
	var ready <-chan struct{}
	if mode.run == nil {
		s, err := New(Config{Topic: topic, URL: ns.URL, Group: group, Stream: stream, Subject: "bench." + instance, MaxInFlight: mode.inFlight},
			kafka.Config{Brokers: brokers}, slog.New(slog.DiscardHandler), prometheus.NewRegistry())
		if err != nil {
			b.Fatal(err)
		}
		ready = s.Ready()
		go func() { done <- s.Run(ctx) }()
	} else {
		r := make(chan struct{})
		ready = r
		cl := pipelinetest.Client(b, brokers,
			kgo.ConsumerGroup(group), kgo.ConsumeTopics(topic), kgo.FetchIsolationLevel(kgo.ReadCommitted()),
			kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.DisableAutoCommit(), kgo.BlockRebalanceOnPoll(),
			kgo.OnPartitionsAssigned(func(context.Context, *kgo.Client, map[string][]int32) { close(r) }))
		go func() { done <- mode.run(ctx, cl, nc, "bench."+instance) }()
	}
	<-ready
	start, startCPU := time.Now(), cpuTime()
	startNats, err := ns.CPU()
	if err != nil {
		b.Fatal(err)
	}
	for !caughtUp() {
		select {
		case err := <-done:
			b.Fatalf("%s ended before it caught up: %v", mode.name, err)
		case <-time.After(5 * time.Millisecond):
		}
	}
	elapsed, used := time.Since(start), cpuTime()-startCPU
	endNats, err := ns.CPU()
	if err != nil {
		b.Fatal(err)
	}
	cancel()
	if err := <-done; err != nil {
		b.Fatal(err)
	}
	if mode.run == nil {
		if err := js.DeleteStream(context.Background(), stream); err != nil {
			b.Fatal(err)
		}
	}
	return float64(n) / elapsed.Seconds(), float64(used.Microseconds()) / float64(n), float64((endNats - startNats).Microseconds()) / float64(n)
}

// consumeOnly is the first baseline: poll, commit.
func consumeOnly(ctx context.Context, cl *kgo.Client, _ *nats.Conn, _ string) error {
	for {
		fetches := cl.PollRecords(ctx, 5000)
		if ctx.Err() != nil {
			cl.AllowRebalance()
			return nil
		}
		if recs := fetches.Records(); len(recs) > 0 {
			if err := cl.CommitRecords(context.WithoutCancel(ctx), recs...); err != nil {
				return err
			}
		}
		cl.AllowRebalance()
	}
}

// corePublish is the second baseline: poll, publish each record's message
// (built as the sink builds it) to core NATS, flush, commit.
func corePublish(ctx context.Context, cl *kgo.Client, nc *nats.Conn, subject string) error {
	for {
		fetches := cl.PollRecords(ctx, 5000)
		if ctx.Err() != nil {
			cl.AllowRebalance()
			return nil
		}
		if recs := fetches.Records(); len(recs) > 0 {
			for _, r := range recs {
				m, _, _ := message(r, subject)
				if err := nc.PublishMsg(m); err != nil {
					return err
				}
			}
			if err := nc.FlushTimeout(time.Minute); err != nil {
				return err
			}
			if err := cl.CommitRecords(context.WithoutCancel(ctx), recs...); err != nil {
				return err
			}
		}
		cl.AllowRebalance()
	}
}

func median(xs []float64) float64 {
	s := append([]float64(nil), xs...)
	sort.Float64s(s)
	if len(s)%2 == 0 {
		return (s[len(s)/2-1] + s[len(s)/2]) / 2
	}
	return s[len(s)/2]
}

// cpuTime is the process's user and system CPU time so far.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// loadAverage is the first three fields of /proc/loadavg: the load the
// figures were measured under.
func loadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	var one, five, fifteen string
	fmt.Sscan(string(b), &one, &five, &fifteen)
	return one + " " + five + " " + fifteen
}
