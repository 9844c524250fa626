package relay_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/onceflow/onceflow/pipeline/kafka"
	"github.com/onceflow/onceflow/pipeline/pipelinetest"
	"github.com/onceflow/onceflow/pipeline/postgres"
	"github.com/onceflow/onceflow/pipeline/relay"
)

// benchEnvInt reads a size from the environment (to scale a benchmark down
// on a small machine); the default is the size the issue names.
func benchEnvInt(b *testing.B, name string, def int) int {
	if v := os.Getenv(name); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			b.Fatalf("%s=%q: want a positive number", name, v)
		}
		return n
	}
	return def
}

// capture keeps the collectors a relay registers, so a benchmark can read
// one counter without running the backlog collector's queries.
type capture struct {
	prometheus.Registerer
	collectors []prometheus.Collector
}

func (c *capture) MustRegister(cs ...prometheus.Collector) {
	c.collectors = append(c.collectors, cs...)
	c.Registerer.MustRegister(cs...)
}

func (c *capture) find(b *testing.B, name string) prometheus.Collector {
	for _, col := range c.collectors {
		ch := make(chan *prometheus.Desc, 16)
		col.Describe(ch)
		close(ch)
		for d := range ch {
			if strings.Contains(d.String(), `"`+name+`"`) {
				return col
			}
		}
	}
	b.Fatalf("no collector %s", name)
	return nil
}

const benchBatch = 500

// BenchmarkDrain measures the relay draining a backlog of
// ONCEFLOW_BENCH_OUTBOX_ROWS rows (default 1,000,000) over 16 shards to the
// embedded broker, next to the database-only baseline on the same
// database: the same rows deleted in the same batch size by one worker per
// shard with DELETE ... WHERE id IN (SELECT ... ORDER BY xid, id FOR
// UPDATE SKIP LOCKED LIMIT 500) RETURNING the payload (the relay's order,
// on the same index), over the same connection pool. It
// reports rows/s for both and their ratio (goal >= 0.8), each the best of
// ONCEFLOW_BENCH_DRAIN_ROUNDS (default 2) alternating rounds, each round on
// a freshly filled, analyzed and checkpointed outbox.
func BenchmarkDrain(b *testing.B) {
	rows := benchEnvInt(b, "ONCEFLOW_BENCH_OUTBOX_ROWS", 1_000_000)
	ctx := context.Background()
	url := pipelinetest.DatabaseURL(b)
	pool, err := postgres.Connect(ctx, url, 0) // pgx's default size, as the relay binary opens it
	if err != nil {
		b.Fatal(err)
	}
	defer pool.Close()
	brokers := pipelinetest.Kafka(b)
	topics := pipelinetest.Topics(b, brokers, 8)

	// The rows, staged once: 10,000 aggregates, 64-byte values and ingest's
	// headers; an aggregate's rows all in one shard.
	exec(b, pool, `CREATE TABLE bench_rows AS
		SELECT g AS n, (g % 10000) % 16 AS shard, convert_to('bench/acc-' || (g % 10000), 'UTF8') AS key,
		       decode(md5(g::text) || md5((g + 1)::text) || md5((g + 2)::text) || md5((g + 3)::text), 'hex') AS value,
		       jsonb_build_object('command-id', gen_random_uuid()::text, 'tenant', 'bench', 'command-type', 'Deposit') AS headers
		FROM generate_series(1, $1::int) g`, rows)
	fill := func() {
		exec(b, pool, `INSERT INTO outbox (shard, topic, key, value, headers)
			SELECT shard, $1, key, value, headers FROM bench_rows ORDER BY n`, topics.Commands())
		exec(b, pool, `VACUUM ANALYZE outbox`)
		// Both sides start right after a checkpoint: the first change to a
		// page after one writes the whole page to the WAL, so a side that
		// ran across one of the checkpoints the fills trigger paid for
		// writes the other did not.
		exec(b, pool, `CHECKPOINT`)
	}

	rounds := benchEnvInt(b, "ONCEFLOW_BENCH_DRAIN_ROUNDS", 2)
	b.ResetTimer()
	for range b.N {
		// The machine is shared: each side runs rounds times, alternately,
		// and the best round of each is reported.
		var base, took time.Duration
		for range rounds {
			b.StopTimer()
			fill()
			b.StartTimer()
			start := time.Now()
			if deleted := baselineDrain(b, pool); deleted != rows {
				b.Fatalf("baseline deleted %d rows, want %d", deleted, rows)
			}
			if d := time.Since(start); base == 0 || d < base {
				base = d
			}

			b.StopTimer()
			fill()
			b.StartTimer()
			if d := relayDrain(b, pool, brokers, topics.Prefix, rows); took == 0 || d < took {
				took = d
			}
		}
		relayRate := float64(rows) / took.Seconds()
		baseRate := float64(rows) / base.Seconds()
		b.ReportMetric(relayRate, "rows/s")
		b.ReportMetric(baseRate, "baseline_rows/s")
		b.ReportMetric(relayRate/baseRate, "ratio")
		b.ReportMetric(float64(rows), "rows")
	}
}

// relayDrain runs a relay until it has shipped rows rows and returns how
// long that took, from its start.
func relayDrain(b *testing.B, pool *pgxpool.Pool, brokers []string, prefix string, rows int) time.Duration {
	ctx := context.Background()
	reg := &capture{Registerer: prometheus.NewRegistry()}
	r, err := relay.New(relay.Config{BatchSize: benchBatch, TransactionalIDPrefix: "bench-" + prefix},
		pool, kafka.Config{Brokers: brokers}, slog.New(slog.NewTextHandler(io.Discard, nil)), reg)
	if err != nil {
		b.Fatal(err)
	}
	shipped := reg.find(b, "onceflow_outbox_shipped_rows_total")
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	start := time.Now()
	go func() { done <- r.Run(rctx) }()
	for testutil.ToFloat64(shipped) < float64(rows) {
		select {
		case err := <-done:
			b.Fatalf("relay stopped: %v", err)
		case <-time.After(10 * time.Millisecond):
		}
	}
	took := time.Since(start)
	cancel()
	if err := <-done; err != nil {
		b.Fatal(err)
	}
	var left int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM outbox`).Scan(&left); err != nil || left != 0 {
		b.Fatalf("%d rows left in the outbox (%v)", left, err)
	}
	return took
}

// baselineDrain deletes the whole outbox the way a database-only shipper
// would, one worker per shard, and returns how many rows it deleted.
func baselineDrain(b *testing.B, pool *pgxpool.Pool) int {
	const del = `DELETE FROM outbox WHERE id IN (
		SELECT id FROM outbox WHERE shard = $1 ORDER BY xid, id LIMIT $2 FOR UPDATE SKIP LOCKED
	) RETURNING id, topic, key, value, headers, created_at`
	var total atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	for shard := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				rows, err := pool.Query(context.Background(), del, shard, benchBatch)
				if err != nil {
					errs <- err
					return
				}
				n := 0
				for rows.Next() {
					n++
				}
				rows.Close()
				if err := rows.Err(); err != nil {
					errs <- err
					return
				}
				total.Add(int64(n))
				if n < benchBatch {
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		b.Fatal(err)
	}
	return int(total.Load())
}

func exec(b *testing.B, pool *pgxpool.Pool, sql string, args ...any) {
	b.Helper()
	if _, err := pool.Exec(context.Background(), sql, args...); err != nil {
		b.Fatalf("%s: %v", sql, err)
	}
}

// BenchmarkLatency measures what the relay adds to a command's way at 500
// rows/s. Rows are committed one per transaction (as ingest does), the
// relay is woken after each commit for the row's shard (ingest and relay
// in one process), and a read_committed consumer notes when each arrives.
// The baseline is the same writer without an outbox: it produces each
// record itself right after its commit (idempotent producer), read by the
// same kind of consumer. The two alternate in quarter-second slices for
// ONCEFLOW_BENCH_LATENCY_SECONDS each (default 10), so both see the same
// machine. It reports the p50 and p99 of commit-to-consumed for both and
// the added p99 (goal <= 10 ms).
func BenchmarkLatency(b *testing.B) {
	seconds := benchEnvInt(b, "ONCEFLOW_BENCH_LATENCY_SECONDS", 10)
	const rate = 500
	ctx := context.Background()
	url := pipelinetest.DatabaseURL(b)
	relayPool, err := postgres.Connect(ctx, url, 0) // pgx's default size, as the relay binary opens it
	if err != nil {
		b.Fatal(err)
	}
	defer relayPool.Close()
	writerPool, err := postgres.Connect(ctx, url, 16)
	if err != nil {
		b.Fatal(err)
	}
	defer writerPool.Close()
	brokers := pipelinetest.Kafka(b)
	topics := pipelinetest.Topics(b, brokers, 8)
	exec(b, writerPool, `CREATE TABLE bench_direct (seq int NOT NULL, at timestamptz NOT NULL DEFAULT now())`)

	b.ResetTimer()
	for range b.N {
		r, err := relay.New(relay.Config{TransactionalIDPrefix: "bench-lat-" + topics.Prefix}, relayPool,
			kafka.Config{Brokers: brokers}, slog.New(slog.NewTextHandler(io.Discard, nil)), prometheus.NewRegistry())
		if err != nil {
			b.Fatal(err)
		}
		rctx, cancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- r.Run(rctx) }()
		// Let it take its leases, and every shard's producer ship a row
		// (metadata, first transaction), before measuring.
		pipelinetest.Eventually(b, 20*time.Second, func() error {
			st, err := relay.ReadStatus(ctx, relayPool, 0)
			if err != nil {
				return err
			}
			for _, s := range st.Shards {
				if s.Owner != r.Owner() {
					return fmt.Errorf("shard %d not held yet", s.Shard)
				}
			}
			return nil
		})
		for shard := range 16 {
			exec(b, writerPool, `INSERT INTO outbox (shard, topic, key, value) VALUES ($1, $2, 'warm-up', '')`, shard, topics.Commands())
		}
		r.Wake()
		pipelinetest.Eventually(b, 20*time.Second, func() error {
			var n int
			if err := writerPool.QueryRow(ctx, `SELECT count(*) FROM outbox`).Scan(&n); err != nil || n > 0 {
				return fmt.Errorf("%d warm-up rows left (%v)", n, err)
			}
			return nil
		})

		direct := pipelinetest.Client(b, brokers, kgo.ProducerLinger(0))
		n := seconds * rate
		outboxed := newPath(b, brokers, topics.Commands(), n, func(ctx context.Context, seq int, key []byte) error {
			_, err := writerPool.Exec(ctx, `INSERT INTO outbox (shard, topic, key, value, headers) VALUES ($1, $2, $3, $4, $5)`,
				(seq%200)%16, topics.Commands(), key, make([]byte, 64), map[string]string{"bench-seq": strconv.Itoa(seq)})
			return err
		}, func(seq int) { r.Wake((seq % 200) % 16) }) // as ingest does: the shard it wrote to
		produced := newPath(b, brokers, topics.Events(), n, func(ctx context.Context, seq int, key []byte) error {
			if _, err := writerPool.Exec(ctx, `INSERT INTO bench_direct (seq) VALUES ($1)`, seq); err != nil {
				return err
			}
			return nil
		}, nil)
		produced.publish = func(ctx context.Context, seq int, key []byte) error {
			rec := &kgo.Record{Topic: topics.Events(), Key: key, Value: make([]byte, 64),
				Headers: []kgo.RecordHeader{{Key: "bench-seq", Value: []byte(strconv.Itoa(seq))}}}
			return direct.ProduceSync(ctx, rec).FirstErr()
		}
		const slice = rate / 4 // a quarter of a second each, alternately
		for first := 0; first < n; first += slice {
			produced.write(b, first, slice)
			outboxed.write(b, first, slice)
		}
		via, base := outboxed.wait(b), produced.wait(b)
		cancel()
		if err := <-done; err != nil {
			b.Fatal(err)
		}

		b.ReportMetric(pct(via, 50), "p50_ms")
		b.ReportMetric(pct(via, 99), "p99_ms")
		b.ReportMetric(pct(base, 50), "baseline_p50_ms")
		b.ReportMetric(pct(base, 99), "baseline_p99_ms")
		b.ReportMetric(pct(via, 99)-pct(base, 99), "added_p99_ms")
		b.ReportMetric(float64(n), "rows")
	}
}

// path is one way from a commit to a consumer: the commit (and what
// follows it: a wake-up, or publishing the record) and a read_committed
// consumer noting when each record arrives.
type path struct {
	commit    func(ctx context.Context, seq int, key []byte) error
	publish   func(ctx context.Context, seq int, key []byte) error
	after     func(seq int)
	committed []atomic.Int64
	arrived   []atomic.Int64
	got       atomic.Int64
	stop      context.CancelFunc
	done      chan struct{}
}

func newPath(b *testing.B, brokers []string, topic string, n int, commit func(context.Context, int, []byte) error, after func(seq int)) *path {
	b.Helper()
	p := &path{commit: commit, after: after, committed: make([]atomic.Int64, n), arrived: make([]atomic.Int64, n), done: make(chan struct{})}
	cl := pipelinetest.Client(b, brokers, kgo.ConsumeTopics(topic), kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtEnd()))
	// One poll so the consumer has its starting offsets before the first
	// row is written.
	pctx, pcancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	cl.PollFetches(pctx)
	pcancel()
	ctx, cancel := context.WithCancel(context.Background())
	p.stop = cancel
	go func() {
		defer close(p.done)
		for p.got.Load() < int64(n) && ctx.Err() == nil {
			fs := cl.PollFetches(ctx)
			now := time.Now().UnixNano()
			fs.EachRecord(func(rec *kgo.Record) {
				for _, h := range rec.Headers {
					if h.Key != "bench-seq" {
						continue
					}
					if seq, err := strconv.Atoi(string(h.Value)); err == nil && seq < n && p.arrived[seq].CompareAndSwap(0, now) {
						p.got.Add(1)
					}
				}
			})
		}
	}()
	return p
}

// write commits count rows from seq first at 500 rows/s, each in its own
// transaction, and returns when the last has been committed.
func (p *path) write(b *testing.B, first, count int) {
	b.Helper()
	ctx := context.Background()
	var wg sync.WaitGroup
	errs := make(chan error, 1)
	start := time.Now()
	for i := range count {
		time.Sleep(time.Until(start.Add(time.Duration(i) * time.Second / 500)))
		seq := first + i
		wg.Add(1)
		go func() {
			defer wg.Done()
			key := []byte(fmt.Sprintf("bench/acc-%d", seq%200))
			err := p.commit(ctx, seq, key)
			p.committed[seq].Store(time.Now().UnixNano())
			if err == nil && p.after != nil {
				p.after(seq)
			}
			if err == nil && p.publish != nil {
				err = p.publish(ctx, seq, key)
			}
			if err != nil {
				select {
				case errs <- err:
				default:
				}
			}
		}()
	}
	wg.Wait()
	select {
	case err := <-errs:
		b.Fatal(err)
	default:
	}
}

// wait waits for every record and returns the commit-to-arrival times in
// ms, sorted.
func (p *path) wait(b *testing.B) []float64 {
	b.Helper()
	n := len(p.committed)
	deadline := time.Now().Add(30 * time.Second)
	for p.got.Load() < int64(n) && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	p.stop()
	<-p.done
	if got := p.got.Load(); got < int64(n) {
		b.Fatalf("%d of %d records arrived", got, n)
	}
	out := make([]float64, n)
	for i := range out {
		out[i] = float64(p.arrived[i].Load()-p.committed[i].Load()) / 1e6
	}
	slices.Sort(out)
	return out
}

// pct returns the p-th percentile of sorted values.
func pct(sorted []float64, p float64) float64 {
	if len(sorted) == 0 {
		return 0
	}
	i := int(float64(len(sorted)-1) * p / 100)
	return sorted[i]
}
