package webhooks_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/onceflow/onceflow/pipeline"
	"github.com/onceflow/onceflow/pipeline/jobs"
	"github.com/onceflow/onceflow/pipeline/pipelinetest"
	"github.com/onceflow/onceflow/pipeline/webhooks"
	"github.com/onceflow/onceflow/pipeline/webhooks/webhookstest"
)

func (e *env) count(sql string, args ...any) int {
	e.t.Helper()
	var n int
	if err := e.pool.QueryRow(context.Background(), sql, args...).Scan(&n); err != nil {
		e.t.Fatal(err)
	}
	return n
}

// A tenant with the most subscriptions it may have (100, every event
// type) costs the projector's transaction one event row and one job per
// event — not a delivery row and a job per subscription, which let one
// tenant within its rate ask the projector for a hundred writes per event
// and hold back every tenant's read models. The worker fans each event out
// to its subscriptions: every delivery made and applied once.
func TestProjectorWritesOneRowAndOneJobPerEvent(t *testing.T) {
	t.Parallel()
	e := newEnv(t, jobs.Config{})
	r := webhookstest.New(nil, nil)
	t.Cleanup(r.Close)
	var secrets []string
	for i := range webhooks.MaxSubscriptions {
		s, _, err := webhooks.Create(context.Background(), e.pool, "acme", fmt.Sprint("hook-", i), r.URL, nil)
		if err != nil {
			t.Fatal(err)
		}
		secrets = append(secrets, s.Secret)
	}
	r.SetSecrets(secrets)
	evs := make([]pipeline.Event, 3)
	for i := range evs {
		evs[i] = deposit("acme", int64(i+1))
	}
	e.project(evs...)
	// What the projector's transaction wrote.
	if n := e.count(`SELECT count(*) FROM webhook_deliveries`); n != 0 {
		t.Errorf("the projector wrote %d delivery rows, want none (the worker's fan-out makes them)", n)
	}
	if n := e.count(`SELECT count(*) FROM webhook_events`); n != len(evs) {
		t.Errorf("the projector wrote %d event rows, want %d", n, len(evs))
	}
	if n := e.count(`SELECT count(*) FROM river_job`); n != len(evs) {
		t.Errorf("the projector enqueued %d jobs, want %d (one fan-out per event)", n, len(evs))
	}

	e.work(webhooks.Config{Allow: loopback}, "w1")
	want := len(evs) * webhooks.MaxSubscriptions
	e.waitStatus("acme", want, 3*time.Minute, "delivered") // 300, 10 at a time (MaxPerTenant), under load
	if got, bad := r.Effects(), r.Bad(); got != want || len(bad) > 0 {
		t.Errorf("the receiver applied %d effects (refused %v), want %d", got, bad, want)
	}
	if n := e.count(`SELECT count(*) FROM webhook_events WHERE expanded_at IS NULL`); n != 0 {
		t.Errorf("%d events not fanned out", n)
	}
}

// A tenant's deliveries in flight are capped (MaxPending): at the cap its
// new events wait unfanned, counted, and go out once deliveries finish —
// nothing dropped, each delivered once.
func TestTenantBacklogIsCapped(t *testing.T) {
	t.Parallel()
	e := newEnv(t, jobs.Config{})
	gate := make(chan struct{})
	var requests atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		requests.Add(1)
		select {
		case <-gate:
		case <-r.Context().Done():
		}
	}))
	t.Cleanup(srv.Close)
	t.Cleanup(func() {
		select {
		case <-gate:
		default:
			close(gate)
		}
	})
	e.subscribe("acme", srv.URL)
	e.work(webhooks.Config{Allow: loopback, MaxPending: 3, Timeout: 30 * time.Second}, "w1")
	first := []pipeline.Event{deposit("acme", 1), deposit("acme", 2), deposit("acme", 3)}
	e.project(first...)
	pipelinetest.Eventually(t, 20*time.Second, func() error {
		if n := requests.Load(); n != 3 {
			return fmt.Errorf("%d deliveries at the receiver, want 3 held", n)
		}
		return nil
	})
	more := []pipeline.Event{deposit("acme", 4), deposit("acme", 5), deposit("acme", 6)}
	e.project(more...)
	pipelinetest.Eventually(t, 20*time.Second, func() error {
		// Each has run and been put back: River's snooze schedules it
		// later without spending an attempt.
		if n := e.count(`SELECT count(*) FROM river_job WHERE kind = 'webhook_fanout' AND state = 'scheduled' AND scheduled_at > now()`); n != 3 {
			var states string
			e.pool.QueryRow(context.Background(), `SELECT string_agg(state::text || ' ' || attempt || ' ' || (scheduled_at > now())::text, ', ') FROM river_job WHERE kind = 'webhook_fanout'`).Scan(&states)
			return fmt.Errorf("%d fan-outs wait for the cap, want 3 (%s)", n, states)
		}
		return nil
	})
	if n := e.count(`SELECT count(*) FROM webhook_deliveries WHERE tenant = 'acme'`); n != 3 {
		t.Errorf("%d deliveries made at the cap of 3", n)
	}
	if n := e.count(`SELECT count(*) FROM webhook_events WHERE expanded_at IS NULL`); n != 3 {
		t.Errorf("%d events wait to be fanned out, want 3", n)
	}
	close(gate)
	got := e.waitStatus("acme", 6, 60*time.Second, "delivered")
	seen := map[pipeline.ID]bool{}
	for _, d := range got {
		seen[d.EventID] = true
	}
	if len(seen) != 6 {
		t.Errorf("deliveries of %d events, want 6", len(seen))
	}
}

// The delivery log keeps finished deliveries and fanned-out events for
// the retention and no longer; what is still in flight stays, and so does
// the event it belongs to.
func TestRetentionDeletesFinishedDeliveries(t *testing.T) {
	t.Parallel()
	e := newEnv(t, jobs.Config{})
	sub := e.subscribe("acme", "http://127.0.0.1:1/hook")
	ctx := context.Background()
	old, inFlight, recent := deposit("acme", 1), deposit("acme", 2), deposit("acme", 3)
	for _, c := range []struct {
		ev     pipeline.Event
		status string
		age    string
	}{{old, "delivered", "49 hours"}, {inFlight, "failed", "49 hours"}, {recent, "delivered", "1 hour"}} {
		if _, err := e.pool.Exec(ctx, `INSERT INTO webhook_events (tenant, event_id, event_type, body, created_at, expanded_at)
			VALUES ('acme', $1, 'Deposited', '{}', now() - $2::interval, now() - $2::interval)`, [16]byte(c.ev.ID), c.age); err != nil {
			t.Fatal(err)
		}
		if _, err := e.pool.Exec(ctx, `INSERT INTO webhook_deliveries (tenant, subscription_id, event_id, event_type, status, created_at, updated_at)
			VALUES ('acme', $1, $2, 'Deposited', $3, now() - $4::interval, now() - $4::interval)`, [16]byte(sub.ID), [16]byte(c.ev.ID), c.status, c.age); err != nil {
			t.Fatal(err)
		}
	}
	e.work(webhooks.Config{Retention: 48 * time.Hour}, "w1") // the retention runs at start
	want := inFlight.ID.String() + "," + recent.ID.String()
	pipelinetest.Eventually(t, 30*time.Second, func() error {
		if n := e.count(`SELECT count(*) FROM webhook_deliveries`); n != 2 {
			return fmt.Errorf("%d delivery rows, want 2 (the old finished one deleted)", n)
		}
		var left string
		if err := e.pool.QueryRow(ctx, `SELECT coalesce(string_agg(event_id::text, ',' ORDER BY created_at), '') FROM webhook_events`).Scan(&left); err != nil {
			return err
		}
		if left != want {
			return fmt.Errorf("events kept %s, want the one in flight and the recent one (%s)", left, want)
		}
		return nil
	})
}

// A tenant with a backlog of its own (BacklogThreshold deliveries in
// flight) has its new deliveries queued in the worker's backlog queue,
// which only its BacklogWorkers slots take; another tenant's stay in the
// queue every tenant shares, never behind the backlog. Both are delivered.
func TestBacklogQueuesApart(t *testing.T) {
	t.Parallel()
	e := newEnv(t, jobs.Config{})
	r := webhookstest.New(nil, nil)
	t.Cleanup(r.Close)
	acme, globex := e.subscribe("acme", r.URL), e.subscribe("globex", r.URL)
	r.SetSecrets([]string{acme.Secret, globex.Secret})
	// acme's backlog: deliveries in flight, as a slow endpoint leaves them.
	if _, err := e.pool.Exec(context.Background(), `INSERT INTO webhook_deliveries (tenant, subscription_id, event_id, event_type, status)
		SELECT 'acme', $1, gen_random_uuid(), 'Deposited', 'failed' FROM generate_series(1, $2)`, [16]byte(acme.ID), webhooks.BacklogThreshold); err != nil {
		t.Fatal(err)
	}
	e.work(webhooks.Config{Allow: loopback}, "w1")
	a, g := deposit("acme", 1), deposit("globex", 1)
	e.project(a, g)
	e.waitStatus("globex", 1, 30*time.Second, "delivered")
	pipelinetest.Eventually(t, 30*time.Second, func() error {
		if n := r.Requests(jobs.Key(a.ID, acme.ID.String())); n != 1 {
			return fmt.Errorf("acme's new delivery reached the receiver %d times, want once", n)
		}
		return nil
	})
	for _, c := range []struct {
		tenant, queue string
	}{{"acme", jobs.Config{Queue: jobs.DefaultQueue}.BacklogQueue()}, {"globex", jobs.DefaultQueue}} {
		var queue string
		if err := e.pool.QueryRow(context.Background(), `SELECT queue FROM river_job WHERE kind = 'webhook_delivery' AND args->>'tenant' = $1`, c.tenant).Scan(&queue); err != nil {
			t.Fatal(err)
		}
		if queue != c.queue {
			t.Errorf("%s's delivery was queued in %q, want %q", c.tenant, queue, c.queue)
		}
	}
}
