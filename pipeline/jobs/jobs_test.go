package jobs_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/riverqueue/river"

	"github.com/onceflow/onceflow/pipeline"
	"github.com/onceflow/onceflow/pipeline/jobs"
	"github.com/onceflow/onceflow/pipeline/pipelinetest"
)

// effectArgs is a test job: it records its key in effects.
type effectArgs struct {
	Key string `json:"key" river:"unique"`
}

func (effectArgs) Kind() string { return "test_effect" }

func (a effectArgs) JobKey() string { return a.Key }

// router makes one effect job per event.
type router struct{}

func (router) Jobs(_ context.Context, _ pgx.Tx, evs []pipeline.Event) ([][]jobs.Args, error) {
	out := make([][]jobs.Args, len(evs))
	for i, ev := range evs {
		out[i] = []jobs.Args{effectArgs{Key: jobs.Key(ev.ID, "effect")}}
	}
	return out, nil
}

// effectWorker runs test_effect jobs with run, which gets the attempt.
type effectWorker struct {
	river.WorkerDefaults[effectArgs]
	run func(ctx context.Context, job *river.Job[effectArgs]) error
}

func (w *effectWorker) Work(ctx context.Context, job *river.Job[effectArgs]) error {
	return w.run(ctx, job)
}

func setup(t *testing.T) *pgxpool.Pool {
	pool, _ := pipelinetest.Pool(t)
	if _, err := pool.Exec(context.Background(), `CREATE TABLE effects (key text, attempt int)`); err != nil {
		t.Fatal(err)
	}
	return pool
}

func event() pipeline.Event {
	return pipeline.Event{ID: pipeline.NameID(pipeline.NewCommandID(), []byte("0")), Tenant: "acme", AggregateID: "acme/acc-1", Version: 1}
}

// enqueue applies the projection to evs in a transaction of pool.
func enqueue(t *testing.T, pool *pgxpool.Pool, proj *jobs.Projection, evs ...pipeline.Event) {
	t.Helper()
	ctx := context.Background()
	if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		out, err := proj.ApplyBatch(ctx, tx, evs)
		if err != nil {
			return err
		}
		return errors.Join(out...)
	}); err != nil {
		t.Fatal(err)
	}
}

func newWorker(t *testing.T, pool *pgxpool.Pool, cfg jobs.Config, reg prometheus.Registerer, run func(context.Context, *river.Job[effectArgs]) error) *jobs.Worker {
	t.Helper()
	w, err := jobs.New(cfg, pool, func(_ *jobs.Worker, ws *river.Workers) error {
		return river.AddWorkerSafely(ws, &effectWorker{run: run})
	}, nil, reg)
	if err != nil {
		t.Fatal(err)
	}
	return w
}

func start(t *testing.T, w *jobs.Worker) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	<-w.Ready()
	var stopped bool
	stop = func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		if err := <-done; err != nil {
			t.Errorf("worker: %v", err)
		}
	}
	t.Cleanup(stop)
	return stop
}

type jobRow struct {
	state   string
	attempt int
	token   *int
	errors  int
}

func readJob(t *testing.T, pool *pgxpool.Pool, kind string) jobRow {
	t.Helper()
	var r jobRow
	err := pool.QueryRow(context.Background(), `SELECT state::text, attempt, (metadata->'output'->>'onceflow_attempt')::int, coalesce(array_length(errors, 1), 0)
		FROM river_job WHERE kind = $1`, kind).Scan(&r.state, &r.attempt, &r.token, &r.errors)
	if err != nil {
		t.Fatalf("read job: %v", err)
	}
	return r
}

func effects(t *testing.T, pool *pgxpool.Pool) []int {
	t.Helper()
	rows, _ := pool.Query(context.Background(), `SELECT attempt FROM effects ORDER BY attempt`)
	got, err := pgx.CollectRows(rows, pgx.RowTo[int])
	if err != nil {
		t.Fatal(err)
	}
	return got
}

func record(pool *pgxpool.Pool) func(context.Context, *river.Job[effectArgs]) error {
	return func(ctx context.Context, job *river.Job[effectArgs]) error {
		return jobs.Complete(ctx, pool, job, func(tx pgx.Tx) error {
			_, err := tx.Exec(ctx, `INSERT INTO effects VALUES ($1, $2)`, job.Args.Key, job.Attempt)
			return err
		})
	}
}

// An event produces its job once: applied twice (the inbox forgot it), the
// second enqueue finds the key; a rolled-back transaction enqueues
// nothing.
func TestProjectionEnqueuesOncePerEvent(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	reg := prometheus.NewRegistry()
	proj, err := jobs.NewProjection("effects", jobs.Config{}, router{}, reg)
	if err != nil {
		t.Fatal(err)
	}
	ev := event()
	enqueue(t, pool, proj, ev)
	enqueue(t, pool, proj, ev, ev)
	ctx := context.Background()
	other := event()
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := proj.ApplyBatch(ctx, tx, []pipeline.Event{other}); err != nil {
		t.Fatal(err)
	}
	tx.Rollback(ctx)
	var n int
	var key string
	if err := pool.QueryRow(ctx, `SELECT count(*), min(args->>'key') FROM river_job`).Scan(&n, &key); err != nil {
		t.Fatal(err)
	}
	if n != 1 || key != jobs.Key(ev.ID, "effect") {
		t.Fatalf("got %d jobs (key %s), want 1 with key %s", n, key, jobs.Key(ev.ID, "effect"))
	}
	if got := testutil.ToFloat64(proj.Metrics().Duplicates.WithLabelValues("test_effect")); got != 2 {
		t.Errorf("duplicates: got %v, want 2", got)
	}
}

// A late attempt — its lease expired and attempt 2 completed the job —
// changes nothing when it finishes: not through Complete (ErrFenced, its
// writes rolled back) and not through River's own update of the row
// (refused by the trigger), whether it returns nil or an error.
func TestLateAttemptIsFenced(t *testing.T) {
	t.Parallel()
	for _, late := range []string{"complete", "error"} {
		t.Run(late, func(t *testing.T) {
			t.Parallel()
			pool := setup(t)
			ctx := context.Background()
			proj, err := jobs.NewProjection("effects", jobs.Config{}, router{}, nil)
			if err != nil {
				t.Fatal(err)
			}
			cfg := jobs.Config{Lease: time.Second, AttemptTimeout: 500 * time.Millisecond, FetchPollInterval: 100 * time.Millisecond}
			started, release, finished := make(chan struct{}), make(chan struct{}), make(chan struct{})
			var lateErr atomic.Value
			regA := prometheus.NewRegistry()
			a := newWorker(t, pool, jobs.Config{ID: "a", Lease: cfg.Lease, AttemptTimeout: cfg.AttemptTimeout, FetchPollInterval: cfg.FetchPollInterval}, regA,
				func(ctx context.Context, job *river.Job[effectArgs]) error {
					if job.Attempt > 1 { // A fetched the job again itself: an ordinary attempt
						return record(pool)(ctx, job)
					}
					close(started)
					defer close(finished)
					<-release // paused past its lease: deaf to its context too
					if late == "error" {
						return errors.New("late failure")
					}
					// Its context is long past its deadline; it finishes
					// recording anyway.
					err := record(pool)(context.WithoutCancel(ctx), job)
					lateErr.Store(fmt.Sprint(err))
					return err
				})
			stopA := start(t, a)
			enqueue(t, pool, proj, event())
			<-started
			// What River's rescuer does to a job past its lease.
			if _, err := pool.Exec(ctx, `UPDATE river_job SET state = 'retryable', scheduled_at = now() WHERE state = 'running'`); err != nil {
				t.Fatal(err)
			}
			b := newWorker(t, pool, jobs.Config{ID: "b", Lease: cfg.Lease, AttemptTimeout: cfg.AttemptTimeout, FetchPollInterval: cfg.FetchPollInterval}, nil, record(pool))
			start(t, b)
			pipelinetest.Eventually(t, 10*time.Second, func() error {
				if r := readJob(t, pool, "test_effect"); r.state != "completed" {
					return fmt.Errorf("job %s, want completed by attempt 2", r.state)
				}
				return nil
			})
			time.Sleep(cfg.Lease) // the late attempt overruns its lease
			close(release)
			// The late attempt runs to its end whatever the load (stopping
			// A gives up on it after AttemptTimeout and 5 s more).
			select {
			case <-finished:
			case <-time.After(time.Minute):
				t.Fatal("the late attempt did not return within a minute of its release")
			}
			// The fence middleware judges the outcome after the attempt
			// returns (a query when the attempt overran its lease).
			fenced := func() float64 { return testutil.ToFloat64(a.Metrics().Fenced.WithLabelValues("test_effect")) }
			pipelinetest.Eventually(t, 30*time.Second, func() error {
				if got := fenced(); got != 1 {
					return fmt.Errorf("fenced: got %v, want 1", got)
				}
				return nil
			})
			stopA() // waits for River's update of A's attempt
			r := readJob(t, pool, "test_effect")
			if r.state != "completed" || r.attempt != 2 || r.token == nil || *r.token != 2 || r.errors != 0 {
				t.Errorf("after the late attempt: job %+v (token %v), want completed by attempt 2 with no error", r, deref(r.token))
			}
			if got := effects(t, pool); len(got) != 1 || got[0] != 2 {
				t.Errorf("effects: got attempts %v, want [2]", got)
			}
			if late == "complete" && lateErr.Load() != jobs.ErrFenced.Error() {
				t.Errorf("late Complete: got %v, want ErrFenced", lateErr.Load())
			}
			if got := fenced(); got != 1 {
				t.Errorf("fenced after stopping: got %v, want 1", got)
			}
		})
	}
}

// A failing job is retried after what it asked for (RetryAfter), is
// cancelled at once on a permanent error, and is discarded with every
// attempt's error kept when its attempts run out.
func TestRetriesAndDeadJobs(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name      string
		err       func(attempt int) error
		state     string
		attempts  int
		wantDead  string
		minSpread time.Duration
	}{
		{"retry-after", func(a int) error {
			if a == 1 {
				return pipeline.RetryAfter(1500*time.Millisecond, errors.New("429"))
			}
			return nil
		}, "completed", 2, "", 1500 * time.Millisecond},
		{"permanent", func(int) error { return pipeline.Permanent(errors.New("410 gone")) }, "cancelled", 1, "permanent", 0},
		{"out-of-attempts", func(int) error { return errors.New("503") }, "discarded", 3, "attempts", 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			pool := setup(t)
			proj, err := jobs.NewProjection("effects", jobs.Config{MaxAttempts: 3}, router{}, nil)
			if err != nil {
				t.Fatal(err)
			}
			var times []time.Time
			w := newWorker(t, pool, jobs.Config{MaxAttempts: 3, BaseDelay: time.Millisecond, MaxDelay: 10 * time.Millisecond, FetchPollInterval: 100 * time.Millisecond},
				prometheus.NewRegistry(), func(ctx context.Context, job *river.Job[effectArgs]) error {
					times = append(times, time.Now())
					return tc.err(job.Attempt)
				})
			start(t, w)
			enqueue(t, pool, proj, event())
			pipelinetest.Eventually(t, 20*time.Second, func() error {
				if r := readJob(t, pool, "test_effect"); r.state != tc.state {
					return fmt.Errorf("job %s, want %s", r.state, tc.state)
				}
				return nil
			})
			r := readJob(t, pool, "test_effect")
			if r.attempt != tc.attempts {
				t.Errorf("attempts: got %d, want %d", r.attempt, tc.attempts)
			}
			if tc.state == "discarded" && r.errors != tc.attempts {
				t.Errorf("errors kept: got %d, want %d", r.errors, tc.attempts)
			}
			if tc.minSpread > 0 && len(times) > 1 && times[1].Sub(times[0]) < tc.minSpread {
				t.Errorf("retried after %s, want at least the asked %s", times[1].Sub(times[0]), tc.minSpread)
			}
			if tc.wantDead != "" {
				if got := testutil.ToFloat64(w.Metrics().Dead.WithLabelValues("test_effect", tc.wantDead)); got != 1 {
					t.Errorf("dead %s: got %v, want 1", tc.wantDead, got)
				}
			}
		})
	}
}

func deref(p *int) any {
	if p == nil {
		return nil
	}
	return *p
}
