package onceflow

import (
	"context"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/riverqueue/river"

	"github.com/onceflow/onceflow/examples/ledger"
	"github.com/onceflow/onceflow/pipeline"
	"github.com/onceflow/onceflow/pipeline/jobs"
	"github.com/onceflow/onceflow/pipeline/pipelinetest"
	"github.com/onceflow/onceflow/pipeline/postgres"
	"github.com/onceflow/onceflow/pipeline/webhooks"
)

// benchCall is the benchmark's domain job: one call per event.
type benchCall struct {
	Key     string `json:"key" river:"unique"`
	EventID string `json:"event_id"`
}

func (benchCall) Kind() string     { return "bench_call" }
func (c benchCall) JobKey() string { return c.Key }

// BenchmarkDomainJobRoundTrip measures a domain job's round trip — its
// event applied in a projector transaction that enqueues it (Job.Enqueue
// in a jobs.Projection), the worker taking it, its Work calling a
// receiver on loopback with the key (JobAttempt.Call) — to the receiver's
// receipt, next to a webhook delivery's round trip on the same database
// and worker in the same run (the webhooks projection, signed and sent,
// to the same receiver). One event at a time, alternating, 50 of each
// per iteration: p50 and p99 of each.
func BenchmarkDomainJobRoundTrip(b *testing.B) {
	ctx := context.Background()
	pool, err := postgres.Connect(ctx, pipelinetest.DatabaseURL(b), 10)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(pool.Close)
	var mu sync.Mutex
	seen := map[string]time.Time{}
	rcv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		at := time.Now()
		mu.Lock()
		seen[r.Header.Get("Idempotency-Key")] = at
		mu.Unlock()
		w.WriteHeader(http.StatusNoContent)
	}))
	b.Cleanup(rcv.Close)
	sub, _, err := webhooks.Create(ctx, pool, "acme", "bench", rcv.URL, nil)
	if err != nil {
		b.Fatal(err)
	}

	kind := Job[benchCall]{
		Enqueue: func(_ context.Context, _ pgx.Tx, ev pipeline.Event) ([]benchCall, error) {
			return []benchCall{{Key: JobKey(ev.ID, "bench"), EventID: ev.ID.String()}}, nil
		},
		Work: func(ctx context.Context, a *JobAttempt[benchCall]) error {
			req, err := http.NewRequestWithContext(ctx, http.MethodPost, rcv.URL, nil)
			if err != nil {
				return err
			}
			resp, err := a.Call(ctx, req)
			if err != nil {
				return err
			}
			return resp.Body.Close()
		},
	}
	dep := &Deployment{Domains: []*DeployedDomain{{Domain: &Domain{Name: "bench", Jobs: []JobKind{kind}}}}}
	reg := prometheus.NewRegistry()
	wcfg := jobs.Config{MaxWorkers: 50, FetchPollInterval: time.Second}
	own, err := jobProjections(dep.Domains[0], wcfg, reg)
	if err != nil {
		b.Fatal(err)
	}
	hooks, err := jobs.NewProjection("webhooks", wcfg, webhooks.Router{}, reg)
	if err != nil {
		b.Fatal(err)
	}
	hookReg, err := webhooks.Register(webhooks.Config{Allow: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}, MaxPerTenant: 50}, nil, reg)
	if err != nil {
		b.Fatal(err)
	}
	w, err := jobs.New(wcfg, pool, func(w *jobs.Worker, ws *river.Workers) error {
		if err := hookReg(w, ws); err != nil {
			return err
		}
		return dep.registerJobs(w, ws, webhooks.Guard{Allow: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}}.Client(0))
	}, nil, reg)
	if err != nil {
		b.Fatal(err)
	}
	wctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- w.Run(wctx) }()
	b.Cleanup(func() { cancel(); <-done })
	<-w.Ready()

	// roundTrip applies one event through proj and returns how long until
	// the receiver saw key(ev).
	roundTrip := func(proj pipeline.Projection[pgx.Tx], key func(pipeline.Event) string) time.Duration {
		ev := pipeline.Event{ID: pipeline.NewCommandID(), CommandID: pipeline.NewCommandID(), Tenant: "acme",
			AggregateID: "acme/acc-1", Version: 1, Time: time.Now(), Payload: ledger.Deposited{Amount: 1}}
		if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return proj.Apply(ctx, tx, ev) }); err != nil {
			b.Fatal(err)
		}
		committed, k := time.Now(), key(ev)
		deadline := committed.Add(time.Minute)
		for {
			mu.Lock()
			at, ok := seen[k]
			mu.Unlock()
			if ok {
				return at.Sub(committed)
			}
			if time.Now().After(deadline) {
				b.Fatalf("%s not received within a minute", k)
			}
			time.Sleep(100 * time.Microsecond)
		}
	}
	jobKey := func(ev pipeline.Event) string { return JobKey(ev.ID, "bench") }
	hookKey := func(ev pipeline.Event) string { return jobs.Key(ev.ID, sub.ID.String()) }
	// Warm up: connections, River's first fetches.
	for range 5 {
		roundTrip(own[0], jobKey)
		roundTrip(hooks, hookKey)
	}
	var domain, hook []time.Duration
	b.ResetTimer()
	for range b.N {
		for range 50 {
			domain = append(domain, roundTrip(own[0], jobKey))
			hook = append(hook, roundTrip(hooks, hookKey))
		}
	}
	b.StopTimer()
	q := func(d []time.Duration, p float64) float64 {
		slices.Sort(d)
		return float64(d[min(len(d)-1, int(p*float64(len(d))))].Microseconds()) / 1000
	}
	b.ReportMetric(q(domain, 0.50), "job_p50_ms")
	b.ReportMetric(q(domain, 0.99), "job_p99_ms")
	b.ReportMetric(q(hook, 0.50), "webhook_p50_ms")
	b.ReportMetric(q(hook, 0.99), "webhook_p99_ms")
	b.ReportMetric(0, "ns/op")
}
