package webhooks_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"

	"github.com/onceflow/onceflow/pipeline"
	"github.com/onceflow/onceflow/pipeline/jobs"
	"github.com/onceflow/onceflow/pipeline/pipelinetest"
	"github.com/onceflow/onceflow/pipeline/postgres"
	"github.com/onceflow/onceflow/pipeline/webhooks"
)

// noopArgs is the baseline's job: River's own overhead per job, nothing
// else.
type noopArgs struct {
	N int `json:"n"`
}

func (noopArgs) Kind() string { return "bench_noop" }

type noopWorker struct {
	river.WorkerDefaults[noopArgs]
	done *atomic.Int64
}

func (w *noopWorker) Work(context.Context, *river.Job[noopArgs]) error {
	w.done.Add(1)
	return nil
}

// countingReceiver answers 200 to every delivery and counts them, noting
// when each key arrived.
type countingReceiver struct {
	srv  *httptest.Server
	n    atomic.Int64
	mu   sync.Mutex
	seen map[string]time.Time
}

func newCountingReceiver(b *testing.B) *countingReceiver {
	r := &countingReceiver{seen: map[string]time.Time{}}
	r.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		now := time.Now()
		r.mu.Lock()
		r.seen[req.Header.Get("Idempotency-Key")] = now
		r.mu.Unlock()
		r.n.Add(1)
		w.WriteHeader(http.StatusNoContent)
	}))
	b.Cleanup(r.srv.Close)
	return r
}

// benchWorkers is the worker setup both sides of the comparison use. The
// backlog queue has as many slots as the shared one, as runWorker lets a
// tenant have every slot (MaxPerTenant): the benchmarks measure the way
// of a delivery, not the limits that keep one tenant's burst from taking
// the workers (BenchmarkFairness does).
var benchWorkers = jobs.Config{MaxWorkers: 50, BacklogWorkers: 50, FetchPollInterval: time.Second}

func runWorker(b *testing.B, pool *pgxpool.Pool) {
	reg, err := webhooks.Register(webhooks.Config{Allow: loopback, MaxPerTenant: 50}, nil, nil)
	if err != nil {
		b.Fatal(err)
	}
	w, err := jobs.New(benchWorkers, pool, reg, nil, prometheus.NewRegistry())
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	b.Cleanup(func() { cancel(); <-done })
	<-w.Ready()
}

func waitFor(b *testing.B, n *atomic.Int64, want int64, within time.Duration) {
	deadline := time.Now().Add(within)
	for n.Load() < want {
		if time.Now().After(deadline) {
			b.Fatalf("%d of %d done within %s", n.Load(), want, within)
		}
		time.Sleep(time.Millisecond)
	}
}

// BenchmarkDeliveryThroughput: webhook deliveries per second to a local
// receiver (enqueued as the projector does, signed, sent, recorded and
// completed fenced), next to River's bare throughput of no-op jobs on the
// same Postgres, pool and worker settings, in the same run. Goal:
// deliveries/s ÷ river_jobs/s >= 0.7
// (docs/benchmarks.md#outbound-webhooks-deliveries-against-rivers-bare-jobs-and-the-latency-they-add).
// subs=1: a tenant with one subscription, whose deliveries the projector
// makes inline; subs=2: two, fanned out by the worker (a batch's 2,000 events
// into 4,000 deliveries).
func BenchmarkDeliveryThroughput(b *testing.B) {
	for _, subs := range []int{1, 2} {
		b.Run(fmt.Sprint("subs=", subs), func(b *testing.B) { benchmarkDeliveryThroughput(b, subs) })
	}
}

func benchmarkDeliveryThroughput(b *testing.B, subs int) {
	const batch = 2000
	ctx := context.Background()

	// Baseline: River alone.
	bare := benchPool(b)
	var done atomic.Int64
	ws := river.NewWorkers()
	river.AddWorker(ws, &noopWorker{done: &done})
	cfg := benchWorkers
	client, err := river.NewClient(riverpgxv5.New(bare), &river.Config{
		Queues: map[string]river.QueueConfig{jobs.DefaultQueue: {MaxWorkers: cfg.MaxWorkers}}, Workers: ws,
		FetchCooldown: jobs.DefaultFetchCooldown, FetchPollInterval: cfg.FetchPollInterval,
	})
	if err != nil {
		b.Fatal(err)
	}
	if err := client.Start(ctx); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { client.Stop(context.Background()) })

	// River under onceflow's fence middleware (jobs.Worker), no-op jobs:
	// what the fence and the token in every outcome cost.
	fencedPool := benchPool(b)
	var fencedDone atomic.Int64
	fw, err := jobs.New(benchWorkers, fencedPool, func(_ *jobs.Worker, ws *river.Workers) error {
		return river.AddWorkerSafely(ws, &noopWorker{done: &fencedDone})
	}, nil, prometheus.NewRegistry())
	if err != nil {
		b.Fatal(err)
	}
	fctx, fcancel := context.WithCancel(ctx)
	fdone := make(chan error, 1)
	go func() { fdone <- fw.Run(fctx) }()
	b.Cleanup(func() { fcancel(); <-fdone })
	<-fw.Ready()
	fencedClient, err := river.NewClient(riverpgxv5.New(fencedPool), &river.Config{FetchCooldown: jobs.DefaultFetchCooldown})
	if err != nil {
		b.Fatal(err)
	}

	// Deliveries.
	pool := benchPool(b)
	proj, err := jobs.NewProjection("webhooks", jobs.Config{}, webhooks.Router{}, nil)
	if err != nil {
		b.Fatal(err)
	}
	rcv := newCountingReceiver(b)
	for i := range subs {
		if _, _, err := webhooks.Create(ctx, pool, "acme", fmt.Sprint("bench-", i), rcv.srv.URL, nil); err != nil {
			b.Fatal(err)
		}
	}
	runWorker(b, pool)

	var riverTime, fencedTime, deliveryTime time.Duration
	b.ResetTimer()
	for range b.N {
		params := make([]river.InsertManyParams, batch)
		for i := range params {
			params[i] = river.InsertManyParams{Args: noopArgs{N: i}, InsertOpts: &river.InsertOpts{Queue: jobs.DefaultQueue}}
		}
		start, base := time.Now(), done.Load()
		if _, err := client.InsertMany(ctx, params); err != nil {
			b.Fatal(err)
		}
		waitFor(b, &done, base+batch, time.Minute)
		riverTime += time.Since(start)

		start, base = time.Now(), fencedDone.Load()
		if _, err := fencedClient.InsertMany(ctx, params); err != nil {
			b.Fatal(err)
		}
		waitFor(b, &fencedDone, base+batch, time.Minute)
		fencedTime += time.Since(start)

		evs := make([]pipeline.Event, batch)
		for i := range evs {
			evs[i] = deposit("acme", int64(i))
		}
		start, base = time.Now(), rcv.n.Load()
		if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			_, err := proj.ApplyBatch(ctx, tx, evs)
			return err
		}); err != nil {
			b.Fatal(err)
		}
		waitFor(b, &rcv.n, base+int64(batch*subs), time.Minute)
		// Delivered means recorded too: wait for the last rows.
		for {
			var pending int
			if err := pool.QueryRow(ctx, `SELECT count(*) FROM webhook_deliveries WHERE status <> 'delivered'`).Scan(&pending); err != nil {
				b.Fatal(err)
			}
			if pending == 0 {
				break
			}
			time.Sleep(time.Millisecond)
		}
		deliveryTime += time.Since(start)
	}
	b.StopTimer()
	riverRate := float64(b.N*batch) / riverTime.Seconds()
	deliveryRate := float64(b.N*batch*subs) / deliveryTime.Seconds()
	b.ReportMetric(riverRate, "river_jobs/s")
	b.ReportMetric(float64(b.N*batch)/fencedTime.Seconds(), "fenced_jobs/s")
	b.ReportMetric(deliveryRate, "deliveries/s")
	b.ReportMetric(deliveryRate/riverRate, "ratio")
}

// BenchmarkDeliveryLatency: events projected at 500 per second (a projector
// transaction of 5 every 10 ms), each delivered to a local receiver; the
// added latency is from the projector's commit to the receiver's receipt. It
// reports p50 and p99 next to River's own latency from insert to work on the
// same Postgres at the same rate (the baseline). Goal: p99 <= 50 ms
// (docs/benchmarks.md#outbound-webhooks-deliveries-against-rivers-bare-jobs-and-the-latency-they-add).
// subs=1: made inline by the projector; subs=2: fanned out by the worker (the
// first subscription's deliveries measured).
func BenchmarkDeliveryLatency(b *testing.B) {
	for _, subs := range []int{1, 2} {
		b.Run(fmt.Sprint("subs=", subs), func(b *testing.B) { benchmarkDeliveryLatency(b, subs) })
	}
}

func benchmarkDeliveryLatency(b *testing.B, subs int) {
	const rate, perTx = 500, 5
	const seconds = 4
	ctx := context.Background()
	pool := benchPool(b)
	proj, err := jobs.NewProjection("webhooks", jobs.Config{}, webhooks.Router{}, nil)
	if err != nil {
		b.Fatal(err)
	}
	rcv := newCountingReceiver(b)
	var sub pipeline.ID
	for i := range subs {
		s, _, err := webhooks.Create(ctx, pool, "acme", fmt.Sprint("bench-", i), rcv.srv.URL, nil)
		if err != nil {
			b.Fatal(err)
		}
		if i == 0 {
			sub = s.ID
		}
	}
	runWorker(b, pool)

	// Baseline: River's insert-to-work latency of no-op jobs at the rate.
	bare := benchPool(b)
	var mu sync.Mutex
	worked := map[int]time.Time{}
	ws := river.NewWorkers()
	river.AddWorker(ws, river.WorkFunc(func(_ context.Context, j *river.Job[noopArgs]) error {
		mu.Lock()
		worked[j.Args.N] = time.Now()
		mu.Unlock()
		return nil
	}))
	client, err := river.NewClient(riverpgxv5.New(bare), &river.Config{
		Queues: map[string]river.QueueConfig{jobs.DefaultQueue: {MaxWorkers: benchWorkers.MaxWorkers}}, Workers: ws,
		FetchCooldown: jobs.DefaultFetchCooldown, FetchPollInterval: time.Second,
	})
	if err != nil {
		b.Fatal(err)
	}
	if err := client.Start(ctx); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { client.Stop(context.Background()) })

	// Warm up both sides (connections, River's first fetches, the
	// receiver's connections) before measuring.
	warm := make([]pipeline.Event, 50)
	for i := range warm {
		warm[i] = deposit("acme", 1)
	}
	base := rcv.n.Load()
	if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { _, err := proj.ApplyBatch(ctx, tx, warm); return err }); err != nil {
		b.Fatal(err)
	}
	warmJobs := make([]river.InsertManyParams, 50)
	for i := range warmJobs {
		warmJobs[i] = river.InsertManyParams{Args: noopArgs{N: -1 - i}, InsertOpts: &river.InsertOpts{Queue: jobs.DefaultQueue}}
	}
	if _, err := client.InsertMany(ctx, warmJobs); err != nil {
		b.Fatal(err)
	}
	waitFor(b, &rcv.n, base+int64(50*subs), time.Minute)

	var hookLat, riverLat []time.Duration
	b.ResetTimer()
	for range b.N {
		committed := map[string]time.Time{}
		inserted := map[int]time.Time{}
		tick := time.NewTicker(time.Second * perTx / rate)
		n := 0
		for range rate / perTx * seconds {
			<-tick.C
			evs := make([]pipeline.Event, perTx)
			params := make([]river.InsertManyParams, perTx)
			for i := range evs {
				evs[i] = deposit("acme", 1)
				n++
				params[i] = river.InsertManyParams{Args: noopArgs{N: n}, InsertOpts: &river.InsertOpts{Queue: jobs.DefaultQueue}}
			}
			if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
				_, err := proj.ApplyBatch(ctx, tx, evs)
				return err
			}); err != nil {
				b.Fatal(err)
			}
			at := time.Now()
			for _, ev := range evs {
				committed[jobs.Key(ev.ID, sub.String())] = at
			}
			if _, err := client.InsertMany(ctx, params); err != nil {
				b.Fatal(err)
			}
			at = time.Now()
			for _, p := range params {
				inserted[p.Args.(noopArgs).N] = at
			}
		}
		tick.Stop()
		deadline := time.Now().Add(time.Minute)
		for {
			rcv.mu.Lock()
			got := 0
			for k := range committed {
				if _, ok := rcv.seen[k]; ok {
					got++
				}
			}
			rcv.mu.Unlock()
			mu.Lock()
			gotRiver := 0
			for k := range inserted {
				if _, ok := worked[k]; ok {
					gotRiver++
				}
			}
			mu.Unlock()
			if got == len(committed) && gotRiver == len(inserted) {
				break
			}
			if time.Now().After(deadline) {
				b.Fatalf("%d of %d delivered, %d of %d worked", got, len(committed), gotRiver, len(inserted))
			}
			time.Sleep(10 * time.Millisecond)
		}
		rcv.mu.Lock()
		for k, at := range committed {
			hookLat = append(hookLat, rcv.seen[k].Sub(at))
		}
		rcv.mu.Unlock()
		mu.Lock()
		for k, at := range inserted {
			riverLat = append(riverLat, worked[k].Sub(at))
		}
		mu.Unlock()
	}
	b.StopTimer()
	q := func(d []time.Duration, p float64) float64 {
		slices.Sort(d)
		return float64(d[min(len(d)-1, int(p*float64(len(d))))].Microseconds()) / 1000
	}
	b.ReportMetric(q(hookLat, 0.50), "p50_ms")
	b.ReportMetric(q(hookLat, 0.99), "p99_ms")
	b.ReportMetric(q(riverLat, 0.50), "river_p50_ms")
	b.ReportMetric(q(riverLat, 0.99), "river_p99_ms")
	b.ReportMetric(0, "ns/op")
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(fmt.Sprint(err))
	}
	return v
}

// benchPool is a database of its own with DATABASE_MAX_CONNS' default
// pool, as a worker process has.
func benchPool(b *testing.B) *pgxpool.Pool {
	pool, err := postgres.Connect(context.Background(), pipelinetest.DatabaseURL(b), 10)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(pool.Close)
	return pool
}
