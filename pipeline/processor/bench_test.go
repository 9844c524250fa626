package processor_test

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"sort"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/onceflow/onceflow/examples/ledger"
	"github.com/onceflow/onceflow/pipeline"
	"github.com/onceflow/onceflow/pipeline/avro"
	"github.com/onceflow/onceflow/pipeline/kafka"
	"github.com/onceflow/onceflow/pipeline/pipelinetest"
	"github.com/onceflow/onceflow/pipeline/processor"
)

// Sizes, scaled by environment variables (`make bench` runs the defaults):
//
//	ONCEFLOW_BENCH_COMMANDS    commands per throughput run (default 200000)
//	ONCEFLOW_BENCH_AGGREGATES  aggregates restored (default 1000000)
func benchSize(b *testing.B, env string, def int) int {
	if v := os.Getenv(env); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			b.Fatalf("%s=%q: want a positive number", env, v)
		}
		return n
	}
	return def
}

// BenchmarkThroughput runs the ledger deciders over the same preloaded
// commands on one broker, exactly-once (a Kafka transaction per poll
// batch, the default batching) and, as the baseline, at-least-once (the
// same batches, produced idempotently and flushed, then the offsets
// committed). Both decode every command, decide, encode the events and
// write the snapshots. The machine may be shared: runs go in ABBA order so
// a neighbour's load falls on both modes alike, and each mode's figure is
// the median of its runs. Two figures less disturbed by neighbours come
// with it: CPU time per command (the process's, broker included), and the
// time a batch's commit takes once its records are acknowledged (for
// exactly-once: offsets in the transaction, a heartbeat, EndTxn; for the
// baseline: an offset commit), the whole price of exactly-once per batch;
// eos/alo_by_commit is the ratio that price alone allows.
func BenchmarkThroughput(b *testing.B) {
	n := benchSize(b, "ONCEFLOW_BENCH_COMMANDS", 200_000)
	const accounts = 10_000
	brokers := pipelinetest.Kafka(b)
	order := []bool{true, false, false, true, true, false, false, true} // at-least-once?
	for range b.N {
		var eos, alo, eosCPU, aloCPU, eosCommit, aloCommit, eosBatch []float64
		for i, atLeastOnce := range order {
			cps, cpu, commitMs, batchMs := throughputRun(b, brokers, atLeastOnce, fmt.Sprintf("run-%d", i), n, accounts, 0)
			if atLeastOnce {
				alo, aloCPU, aloCommit = append(alo, cps), append(aloCPU, cpu), append(aloCommit, commitMs)
			} else {
				eos, eosCPU, eosCommit, eosBatch = append(eos, cps), append(eosCPU, cpu), append(eosCommit, commitMs), append(eosBatch, batchMs)
			}
		}
		e, a := median(eos), median(alo)
		b.ReportMetric(e, "eos_cmds/s")
		b.ReportMetric(a, "alo_cmds/s")
		b.ReportMetric(e/a, "eos/alo")
		b.ReportMetric(median(eosCPU), "eos_cpu_us/cmd")
		b.ReportMetric(median(aloCPU), "alo_cpu_us/cmd")
		b.ReportMetric(median(eosCommit), "eos_commit_ms/batch")
		b.ReportMetric(median(aloCommit), "alo_commit_ms/batch")
		// What exactly-once adds to a batch is its longer commit; the rest
		// of a batch (decode, decide, encode, produce, flush) is the same
		// work in both modes. This bounds the ratio without the noise.
		b.ReportMetric(1-(median(eosCommit)-median(aloCommit))/median(eosBatch), "eos/alo_by_commit")
		b.Logf("%d commands to %d accounts, 8 partitions: eos %.0f cmds/s (%.1f µs CPU/cmd, commit %.2f ms/batch), alo %.0f cmds/s (%.1f µs CPU/cmd, commit %.2f ms/batch)",
			n, accounts, eos, eosCPU, eosCommit, alo, aloCPU, aloCommit)
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

// throughputRun preloads n commands to accounts accounts on fresh topics
// and returns the commands per second a processor handles them at, from
// ready to the last commit, and the CPU microseconds the process spent per
// command. With remembered > 0, the first account's partition starts out
// remembering that many command ids of that account (written to the dedup
// changelog as a processor would have), inside the window.
func throughputRun(b *testing.B, brokers []string, atLeastOnce bool, instance string, n, accounts, remembered int) (cmdsPerSec, cpuPerCmd, commitMs, batchMs float64) {
	b.Helper()
	ctx := context.Background()
	e := benchEnv(b, brokers, 8)
	cl := pipelinetest.Client(b, brokers, kgo.ProducerLinger(5*time.Millisecond), kgo.MaxBufferedRecords(1<<20))
	acc := func(i int) string { return fmt.Sprintf("acme/acc-%06d", i%accounts) }
	t0 := time.Now()
	if remembered > 0 {
		preloadRemembered(b, e, cl, partitionOfKey(acc(0), e.topics.Partitions), acc(0), remembered, t0)
	}
	promise := kgo.AbortingFirstErrPromise(cl)
	values := map[pipeline.Message][]byte{} // few distinct payloads: encode each once
	for i := range n {
		var payload pipeline.Message = ledger.Deposit{Amount: int64(1 + i%100)}
		if i < accounts {
			payload = ledger.OpenAccount{Currency: "EUR"}
		}
		value, ok := values[payload]
		if !ok {
			var err error
			if value, err = e.serdes.Commands.Encode(ctx, payload); err != nil {
				b.Fatal(err)
			}
			values[payload] = value
		}
		r, err := kafka.CommandRecord(e.topics.Commands(), acc(i), pipeline.NewCommandID(), payload.MessageType(), value, t0.Add(time.Duration(i)*time.Microsecond), "")
		if err != nil {
			b.Fatal(err)
		}
		cl.Produce(ctx, r, promise.Promise())
	}
	if err := promise.Err(); err != nil {
		b.Fatal(err)
	}

	cfg := processor.Config{Topics: e.topics, Group: "onceflow-processor-" + e.topics.Prefix, InstanceID: instance}
	if atLeastOnce {
		processor.AtLeastOnce(&cfg)
	}
	reg := prometheus.NewRegistry()
	p, err := processor.New(cfg, e.kcfg, ledger.NewDecider(), e.serdes.processor(), nil, reg)
	if err != nil {
		b.Fatal(err)
	}
	r := &running{Processor: p, reg: reg}
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- p.Run(runCtx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			b.Error(err)
		}
	}()
	<-p.Ready()
	runtime.GC() // the preload's garbage is not the processor's
	start, cpu0 := time.Now(), cpuTime()
	for r.metric(b, "onceflow_processor_commands_total", "outcome", "accepted") < float64(n) {
		select {
		case err := <-done:
			b.Fatalf("processor ended: %v", err)
		case <-time.After(20 * time.Millisecond):
		}
		if time.Since(start) > 5*time.Minute {
			b.Fatal("not done within 5 minutes")
		}
	}
	if aborted := r.metric(b, "onceflow_processor_transactions_total", "result", "aborted") + r.metric(b, "onceflow_processor_session_restarts_total"); aborted > 0 {
		b.Logf("%s: %v transactions aborted or sessions restarted (the machine starved the process past a timeout?)", instance, aborted)
	}
	cmdsPerSec = float64(n) / time.Since(start).Seconds()
	cpuPerCmd = float64((cpuTime() - cpu0).Microseconds()) / float64(n)
	sum, count := histogram(b, reg, "onceflow_processor_commit_duration_seconds")
	bsum, bcount := histogram(b, reg, "onceflow_processor_batch_duration_seconds")
	return cmdsPerSec, cpuPerCmd, 1000 * sum / float64(count), 1000 * bsum / float64(bcount)
}

// histogram returns a histogram's sum and count.
func histogram(b *testing.B, reg *prometheus.Registry, name string) (float64, uint64) {
	mfs, err := reg.Gather()
	if err != nil {
		b.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			h := mf.GetMetric()[0].GetHistogram()
			return h.GetSampleSum(), h.GetSampleCount()
		}
	}
	b.Fatalf("no histogram %s", name)
	return 0, 0
}

// benchEnv is an env on a shared broker (fresh topics).
func benchEnv(b *testing.B, brokers []string, partitions int32) *env {
	b.Helper()
	topics := pipelinetest.Topics(b, brokers, partitions)
	s, err := newSerdes(context.Background(), avro.NewEmbedded(), topics)
	if err != nil {
		b.Fatal(err)
	}
	return &env{t: b, kcfg: kafka.Config{Brokers: brokers}, topics: topics, serdes: s,
		cl: pipelinetest.Client(b, brokers), t0: time.Now().UnixMilli()}
}

// BenchmarkRestore writes one snapshot for each of 1,000,000 accounts to an
// 8-partition state topic (the ids they remember are in the dedup
// changelog, measured by BenchmarkRestoreRemembered), then measures:
//
//   - read_s: reading every state partition to its end, read_committed,
//     as the restore does, doing nothing with the records (the baseline:
//     what the broker and the client cost);
//   - restore_s: the processor's restore of all partitions (read, check
//     each snapshot by decoding it, install), and restore_cpu_s, the CPU
//     time it took (broker included), which a busy neighbour on the
//     machine disturbs far less than the wall time;
//   - B/aggregate: the Go heap the restored state occupies (after GC, state
//     held, minus after GC, state dropped), next to snapshot_B, the bytes
//     of key and snapshot value one aggregate has on the topic.
func BenchmarkRestore(b *testing.B) {
	n := benchSize(b, "ONCEFLOW_BENCH_AGGREGATES", 1_000_000)
	ctx := context.Background()
	brokers := pipelinetest.Kafka(b)
	e := benchEnv(b, brokers, 8)
	p, err := processor.New(processor.Config{Topics: e.topics, InstanceID: "bench"}, e.kcfg, ledger.NewDecider(), e.serdes.processor(), nil, nil)
	if err != nil {
		b.Fatal(err)
	}
	cl := pipelinetest.Client(b, brokers, kgo.ProducerLinger(5*time.Millisecond), kgo.MaxBufferedRecords(1<<20),
		kgo.ProducerBatchMaxBytes(1<<20))
	promise := kgo.AbortingFirstErrPromise(cl)
	now := time.Now().UnixMilli()
	var payload int
	for i := range n {
		snap := processor.Snapshot[ledger.Account]{
			Version: 2,
			State:   ledger.Account{Open: true, Currency: "EUR", Balance: int64(i)},
		}
		value, err := p.EncodeSnapshot(ctx, snap)
		if err != nil {
			b.Fatal(err)
		}
		key := fmt.Sprintf("acme/acc-%07d", i)
		payload += len(key) + len(value)
		cl.Produce(ctx, &kgo.Record{Topic: e.topics.State(), Key: []byte(key), Value: value, Timestamp: time.UnixMilli(now)}, promise.Promise())
	}
	if err := promise.Err(); err != nil {
		b.Fatal(err)
	}
	parts := make([]int32, e.topics.Partitions)
	for i := range parts {
		parts[i] = int32(i)
	}
	rcl := pipelinetest.Client(b, brokers)

	for range b.N {
		start := time.Now()
		var read int
		for _, part := range parts { // sequentially; the restore reads 4 at a time
			err := kafka.ReadPartition(ctx, rcl, e.topics.State(), part, true, func(*kgo.Record) error { read++; return nil })
			if err != nil {
				b.Fatal(err)
			}
		}
		readS := time.Since(start).Seconds()
		if read != n {
			b.Fatalf("read %d snapshots, want %d", read, n)
		}

		p.Drop()
		runtime.GC()
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		start, cpu0 := time.Now(), cpuTime()
		if err := p.Restore(ctx, rcl, parts); err != nil {
			b.Fatal(err)
		}
		restoreS, restoreCPU := time.Since(start).Seconds(), (cpuTime() - cpu0).Seconds()
		runtime.GC()
		runtime.ReadMemStats(&after)
		st, err := p.State(ctx)
		if err != nil || len(st) != n {
			b.Fatalf("restored %d aggregates (%v), want %d", len(st), err, n)
		}
		st = nil
		perAgg := float64(int64(after.HeapAlloc)-int64(before.HeapAlloc)) / float64(n)
		runtime.KeepAlive(p)

		b.ReportMetric(readS, "read_s")
		b.ReportMetric(restoreS, "restore_s")
		b.ReportMetric(restoreCPU, "restore_cpu_s")
		b.ReportMetric(float64(n)/restoreS, "aggregates/s")
		b.ReportMetric(perAgg, "B/aggregate")
		b.ReportMetric(float64(payload)/float64(n), "snapshot_B")
		b.Logf("%d aggregates, 8 partitions: read %.2fs, restore %.2fs (%.2fs CPU), %.0f B/aggregate in memory (%.0f B of key and snapshot)", n, readS, restoreS, restoreCPU, perAgg, float64(payload)/float64(n))
	}
}

// BenchmarkHotAggregate runs the same number of commands (exactly-once)
// to one aggregate whose partition starts out remembering 1,000,000 of
// its command ids inside the window, and, as the baseline, to 10,000
// aggregates over 8 partitions remembering none (the cold workload of
// BenchmarkThroughput), in ABBA order, and reports each one's median rate
// and hot/cold. Scaled by ONCEFLOW_BENCH_COMMANDS and
// ONCEFLOW_BENCH_REMEMBERED (default 1000000).
func BenchmarkHotAggregate(b *testing.B) {
	n := benchSize(b, "ONCEFLOW_BENCH_COMMANDS", 200_000)
	remembered := benchSize(b, "ONCEFLOW_BENCH_REMEMBERED", 1_000_000)
	brokers := pipelinetest.Kafka(b)
	for range b.N {
		var hot, cold, hotCPU, coldCPU []float64
		for i, isHot := range []bool{true, false, false, true} {
			if isHot {
				cps, cpu, _, _ := throughputRun(b, brokers, false, fmt.Sprintf("hot-%d", i), n, 1, remembered)
				hot, hotCPU = append(hot, cps), append(hotCPU, cpu)
			} else {
				cps, cpu, _, _ := throughputRun(b, brokers, false, fmt.Sprintf("cold-%d", i), n, 10_000, 0)
				cold, coldCPU = append(cold, cps), append(coldCPU, cpu)
			}
		}
		h, c := median(hot), median(cold)
		b.ReportMetric(h, "hot_cmds/s")
		b.ReportMetric(c, "cold_cmds/s")
		b.ReportMetric(h/c, "hot/cold")
		b.ReportMetric(median(hotCPU), "hot_cpu_us/cmd")
		b.ReportMetric(median(coldCPU), "cold_cpu_us/cmd")
		b.Logf("%d commands: to one aggregate remembering %d ids %.0f cmds/s (%.1f µs CPU/cmd); to 10,000 aggregates %.0f cmds/s (%.1f µs CPU/cmd)",
			n, remembered, h, median(hotCPU), c, median(coldCPU))
	}
}

// partitionOfKey is the partition Kafka's default partitioner (murmur2)
// gives key.
func partitionOfKey(key string, partitions int32) int32 {
	r := &kgo.Record{Key: []byte(key)}
	return int32(kgo.StickyKeyPartitioner(nil).ForTopic("t").Partition(r, int(partitions)))
}

// preloadRemembered writes n remembered command ids of aggregate to the
// dedup changelog's partition part, as committed transactions of a
// processor would have at time at, in records of the size it writes.
func preloadRemembered(b *testing.B, e *env, cl *kgo.Client, part int32, aggregate string, n int, at time.Time) {
	b.Helper()
	ctx := context.Background()
	promise := kgo.AbortingFirstErrPromise(cl)
	for done := 0; done < n; {
		k := min(n-done, processor.MaxDigestsPerRecord)
		ids := make([]pipeline.ID, k)
		for i := range ids {
			ids[i] = pipeline.NewCommandID()
		}
		cl.Produce(ctx, &kgo.Record{Topic: e.topics.Dedup(), Partition: part, Value: processor.DedupRecord(aggregate, ids), Timestamp: at},
			promise.Promise())
		done += k
	}
	if err := promise.Err(); err != nil {
		b.Fatal(err)
	}
}

// BenchmarkRestoreRemembered writes 10,000,000 remembered command ids to
// one partition of the dedup changelog (of 1,000 aggregates, in records of
// the size the processor writes), then measures:
//
//   - read_s: reading the partition to its end, read_committed, doing
//     nothing with the records (the baseline: what the broker and the
//     client cost);
//   - restore_s: the processor's restore of that partition (read, index
//     every id), with restore_cpu_s;
//   - B/id: the Go heap the restored ids occupy (after GC, held, minus
//     after GC, dropped), next to 16, the bytes of one id on the topic.
//
// Scaled by ONCEFLOW_BENCH_REMEMBERED_RESTORE (default 10000000).
func BenchmarkRestoreRemembered(b *testing.B) {
	n := benchSize(b, "ONCEFLOW_BENCH_REMEMBERED_RESTORE", 10_000_000)
	ctx := context.Background()
	brokers := pipelinetest.Kafka(b)
	e := benchEnv(b, brokers, 8)
	p, err := processor.New(processor.Config{Topics: e.topics, InstanceID: "bench"}, e.kcfg, ledger.NewDecider(), e.serdes.processor(), nil, nil)
	if err != nil {
		b.Fatal(err)
	}
	cl := pipelinetest.Client(b, brokers, kgo.ProducerLinger(5*time.Millisecond), kgo.MaxBufferedRecords(1<<16),
		kgo.ProducerBatchMaxBytes(1<<20), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	const part = 3
	now := time.Now()
	per := n / 1000
	for a := range 1000 {
		preloadRemembered(b, e, cl, part, fmt.Sprintf("acme/acc-%04d", a), per, now)
	}
	rcl := pipelinetest.Client(b, brokers)
	for range b.N {
		start := time.Now()
		var bytes int
		if err := kafka.ReadPartition(ctx, rcl, e.topics.Dedup(), part, true, func(r *kgo.Record) error { bytes += len(r.Value); return nil }); err != nil {
			b.Fatal(err)
		}
		readS := time.Since(start).Seconds()

		p.Drop()
		runtime.GC()
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		start, cpu0 := time.Now(), cpuTime()
		if err := p.Restore(ctx, rcl, []int32{part}); err != nil {
			b.Fatal(err)
		}
		restoreS, restoreCPU := time.Since(start).Seconds(), (cpuTime() - cpu0).Seconds()
		runtime.GC()
		runtime.ReadMemStats(&after)
		if got := p.Remembered(); got != per*1000 {
			b.Fatalf("restored %d remembered ids, want %d", got, per*1000)
		}
		perID := float64(int64(after.HeapAlloc)-int64(before.HeapAlloc)) / float64(per*1000)
		runtime.KeepAlive(p)
		b.ReportMetric(readS, "read_s")
		b.ReportMetric(restoreS, "restore_s")
		b.ReportMetric(restoreCPU, "restore_cpu_s")
		b.ReportMetric(perID, "B/id")
		b.Logf("%d remembered ids in one partition (%d MB on the topic): read %.2fs, restore %.2fs (%.2fs CPU), %.1f B/id in memory",
			per*1000, bytes>>20, readS, restoreS, restoreCPU, perID)
	}
}
