package e2e

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/onceflow/onceflow/examples/ledger"
	"github.com/onceflow/onceflow/pipeline"
	"github.com/onceflow/onceflow/pipeline/jobs"
	"github.com/onceflow/onceflow/pipeline/pipelinetest"
	"github.com/onceflow/onceflow/pipeline/webhooks"
	"github.com/onceflow/onceflow/pipeline/webhooks/webhookstest"
)

// A worker process paused (SIGSTOP) past its lease while it delivers: River
// gives the job to another worker, whose attempt delivers it; the receiver
// sees the delivery's key twice and applies it once; and when the paused
// worker wakes up, its attempt's end — its request fails, it tries to
// record that and River writes its error — changes nothing: the delivery
// stays delivered by attempt 2 and the job completed by it.
func TestWorkerPausedPastLease(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-process end-to-end test; skipped with -short")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	pool, url := pipelinetest.Pool(t)
	pl := newPipeline(t, url)
	env := map[string]string{
		"ONCEFLOW_WORKER_LEASE": "2s", "ONCEFLOW_WORKER_ATTEMPT_TIMEOUT": "1500ms", "ONCEFLOW_WEBHOOK_TIMEOUT": "1s",
		"ONCEFLOW_WORKER_BASE_DELAY": "50ms", "ONCEFLOW_WORKER_MAX_DELAY": "200ms", "ONCEFLOW_WEBHOOK_ALLOW_NETWORKS": "127.0.0.0/8",
		// No broker runs: the worker needs none.
		"KAFKA_BROKERS": "127.0.0.1:1", "ONCEFLOW_LAG_EXPORT": "off",
	}

	// The first request of the key is applied, then held until the test
	// ends; every later one is answered at once.
	receiver := webhookstest.New(nil, func(_ string, n int) *webhookstest.Fault {
		if n == 1 {
			return &webhookstest.Fault{Hang: 2 * time.Minute}
		}
		return nil
	})
	t.Cleanup(receiver.Close)
	sub, _, err := webhooks.Create(ctx, pool, "acme", "hook", receiver.URL, nil)
	if err != nil {
		t.Fatal(err)
	}
	receiver.SetSecrets([]string{sub.Secret})

	a, err := pl.StartComponent(ctx, "worker", "worker-a", env)
	if err != nil {
		t.Fatal(err)
	}
	// The projector's part: the event's delivery row and job, in one
	// transaction.
	proj, err := jobs.NewProjection("webhooks", jobs.Config{}, webhooks.Router{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	ev := pipeline.Event{ID: pipeline.NameID(pipeline.NewCommandID(), []byte("0")), CommandID: pipeline.NewCommandID(), Tenant: "acme",
		AggregateID: "acme/acc-1", Version: 1, Time: time.Now(), Payload: ledger.Deposited{Amount: 100}}
	if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		out, err := proj.ApplyBatch(ctx, tx, []pipeline.Event{ev})
		if err != nil {
			return err
		}
		return errors.Join(out...)
	}); err != nil {
		t.Fatal(err)
	}
	key := jobs.Key(ev.ID, sub.ID.String())

	pipelinetest.Eventually(t, 20*time.Second, func() error {
		if n := receiver.Requests(key); n != 1 {
			return fmt.Errorf("worker-a's request: the receiver has %d, want 1", n)
		}
		return nil
	})
	a.Pause() // mid-request, holding the job's lease
	paused := time.Now()
	b, err := pl.StartComponent(ctx, "worker", "worker-b", env)
	if err != nil {
		t.Fatal(err)
	}

	type row struct {
		delivery, job string
		attempts, jobAttempt,
		token int
	}
	read := func() (r row, err error) {
		err = pool.QueryRow(ctx, `SELECT d.status, d.attempts, j.state::text, j.attempt, coalesce((j.metadata->'output'->>'onceflow_attempt')::int, 0)
			FROM webhook_deliveries d JOIN river_job j ON j.args->>'key' = $1 WHERE d.event_id = $2`, key, [16]byte(ev.ID)).
			Scan(&r.delivery, &r.attempts, &r.job, &r.jobAttempt, &r.token)
		return r, err
	}
	want := row{delivery: "delivered", attempts: 2, job: "completed", jobAttempt: 2, token: 2}
	// River's rescuer runs on its leader: worker-b becomes it once
	// worker-a's leadership lapsed (15 s), and rescues at once.
	pipelinetest.Eventually(t, 60*time.Second, func() error {
		r, err := read()
		if err == nil && r != want {
			err = fmt.Errorf("%+v, want %+v", r, want)
		}
		return err
	})
	t.Logf("worker-b delivered it %s after worker-a was paused", time.Since(paused).Round(time.Second))
	if n, e := receiver.Requests(key), receiver.Effects(); n != 2 || e != 1 {
		t.Fatalf("the receiver saw the key %d times and applied %d effects, want 2 and 1", n, e)
	}

	a.Resume()
	pipelinetest.Eventually(t, 20*time.Second, func() error {
		v, err := a.Metric(ctx, `onceflow_worker_fenced_total{kind="webhook_delivery"}`)
		if err == nil && v != 1 {
			err = fmt.Errorf("worker-a fenced %v attempts, want 1", v)
		}
		return err
	})
	time.Sleep(time.Second) // River's completer writes worker-a's outcome (refused) after the attempt returned
	if r, err := read(); err != nil || r != want {
		t.Errorf("after worker-a's late attempt: %+v (%v), want %+v", r, err, want)
	}
	var errs int
	if err := pool.QueryRow(ctx, `SELECT coalesce(array_length(errors, 1), 0) FROM river_job WHERE args->>'key' = $1`, key).Scan(&errs); err != nil || errs != 1 {
		t.Errorf("the job's errors: %d (%v), want 1 (the rescue's; the late attempt's refused)", errs, err)
	}
	if n, e := receiver.Requests(key), receiver.Effects(); n != 2 || e != 1 || len(receiver.Bad()) > 0 {
		t.Errorf("after worker-a woke up: the receiver saw the key %d times, applied %d effects (refused %v), want 2 and 1", n, e, receiver.Bad())
	}
	if v, err := b.Metric(ctx, `onceflow_worker_attempts_total{kind="webhook_delivery",outcome="completed"}`); err != nil || v != 1 {
		t.Errorf("worker-b's completed attempts: %v (%v), want 1", v, err)
	}
}
