package webhooks_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/onceflow/onceflow/pipeline"
	"github.com/onceflow/onceflow/pipeline/apiclient"
	"github.com/onceflow/onceflow/pipeline/ingest"
	"github.com/onceflow/onceflow/pipeline/ingest/ingesttest"
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
// type) costs the projector's transaction one event row per event and one
// job per tenant of the batch — not a delivery row and a job per
// subscription, which let one tenant within its rate ask the projector for
// a hundred writes per event and hold back every tenant's read models. The
// worker fans the events out to the subscriptions in transactions of at
// most MaxFanout deliveries: every delivery made and applied once. A
// tenant with one subscription (globex) has its deliveries made in the
// projector's transaction, one row and one job an event, the fan-out's
// bound, without its hop.
func TestProjectorWritesOneRowPerEventAndOneJobPerTenant(t *testing.T) {
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
	globex := e.subscribe("globex", r.URL)
	r.SetSecrets(append(secrets, globex.Secret))
	evs := []pipeline.Event{deposit("acme", 1), deposit("globex", 1), deposit("acme", 2), deposit("acme", 3), deposit("globex", 2)}
	e.project(evs...)
	// What the projector's transaction wrote.
	for _, c := range []struct {
		what, sql string
		want      int
	}{
		{"acme's delivery rows (the worker's fan-out makes them)", `SELECT count(*) FROM webhook_deliveries WHERE tenant = 'acme'`, 0},
		{"acme's jobs (one fan-out for the batch)", `SELECT count(*) FROM river_job WHERE args->>'tenant' = 'acme' AND kind = 'webhook_fanout'`, 1},
		{"acme's event rows", `SELECT count(*) FROM webhook_events WHERE tenant = 'acme'`, 3},
		{"globex's delivery rows (inline)", `SELECT count(*) FROM webhook_deliveries WHERE tenant = 'globex'`, 2},
		{"globex's delivery jobs (inline)", `SELECT count(*) FROM river_job WHERE args->>'tenant' = 'globex' AND kind = 'webhook_delivery'`, 2},
		{"globex's event rows, expanded", `SELECT count(*) FROM webhook_events WHERE tenant = 'globex' AND expanded_at IS NOT NULL`, 2},
		{"jobs", `SELECT count(*) FROM river_job`, 3},
	} {
		if n := e.count(c.sql); n != c.want {
			t.Errorf("the projector wrote %d %s, want %d", n, c.what, c.want)
		}
	}

	// 150 deliveries a transaction: one of acme's events (100) each.
	e.work(webhooks.Config{Allow: loopback, MaxFanout: 150}, "w1")
	want := 3 * webhooks.MaxSubscriptions
	e.waitStatus("acme", want, 3*time.Minute, "delivered") // 300, 10 at a time (MaxPerTenant), under load
	e.waitStatus("globex", 2, time.Minute, "delivered")
	if got, bad := r.Effects(), r.Bad(); got != want+2 || len(bad) > 0 {
		t.Errorf("the receiver applied %d effects (refused %v), want %d", got, bad, want+2)
	}
	if n := e.count(`SELECT count(*) FROM webhook_events WHERE expanded_at IS NULL`); n != 0 {
		t.Errorf("%d events not fanned out", n)
	}
	var notes string
	if err := e.pool.QueryRow(context.Background(), `SELECT string_agg(metadata->'output'->>'note', '; ' ORDER BY id)
		FROM river_job WHERE kind = 'webhook_fanout' AND state = 'completed' AND args->>'tenant' = 'acme'`).Scan(&notes); err != nil {
		t.Fatal(err)
	}
	if want := strings.Repeat("100 deliveries of 1 events; ", 2) + "100 deliveries of 1 events"; notes != want {
		t.Errorf("acme's fan-outs: %q, want %q (three transactions)", notes, want)
	}
}

// A tenant's deliveries in flight are capped (MaxPending): at the cap its
// new events wait unfanned, counted, and go out once deliveries finish —
// nothing dropped, each delivered once. The tenant sees it through the
// API it uses for its webhooks: GET /v1/webhooks and a subscription's
// deliveries say it is at its cap (how many in flight, the cap, since
// when) while it is, and null before and after; another tenant sees
// nothing of it.
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
	sub := e.subscribe("acme", srv.URL)
	e.subscribe("globex", srv.URL)
	api := tenantAPI(t, e.pool, "acme", "globex")
	cfg := webhooks.Config{Allow: loopback, MaxPending: 3, Timeout: 30 * time.Second}
	// The projector knows the cap: one subscription's deliveries are made
	// inline below it only.
	proj, err := jobs.NewProjection("webhooks", e.jcfg, webhooks.Router{MaxPending: cfg.MaxPending}, nil)
	if err != nil {
		t.Fatal(err)
	}
	e.proj = proj
	if c := api.capped(t, "acme", "/v1/webhooks"); c != nil {
		t.Errorf("below the cap: %+v, want null", c)
	}
	e.work(cfg, "w1")
	first := []pipeline.Event{deposit("acme", 1), deposit("acme", 2), deposit("acme", 3)}
	e.project(first...)
	pipelinetest.Eventually(t, 20*time.Second, func() error {
		if n := requests.Load(); n != 3 {
			return fmt.Errorf("%d deliveries at the receiver, want 3 held", n)
		}
		return nil
	})
	// Three batches, three fan-outs: one waits, the others leave it
	// their events.
	more := []pipeline.Event{deposit("acme", 4), deposit("acme", 5), deposit("acme", 6)}
	for _, ev := range more {
		e.project(ev)
	}
	pipelinetest.Eventually(t, 20*time.Second, func() error {
		// The one waiting has run and been put back: River's snooze
		// schedules it later without spending an attempt.
		if n := e.count(`SELECT count(*) FROM river_job WHERE kind = 'webhook_fanout' AND state = 'scheduled' AND scheduled_at > now()`); n != 1 ||
			e.count(`SELECT count(*) FROM river_job WHERE kind = 'webhook_fanout' AND state = 'completed'`) != 2 {
			var states string
			e.pool.QueryRow(context.Background(), `SELECT string_agg(state::text || ' ' || attempt || ' ' || (scheduled_at > now())::text, ', ') FROM river_job WHERE kind = 'webhook_fanout'`).Scan(&states)
			return fmt.Errorf("want one fan-out waiting for the cap and two completed (%s)", states)
		}
		return nil
	})
	if n := e.count(`SELECT count(*) FROM webhook_deliveries WHERE tenant = 'acme'`); n != 3 {
		t.Errorf("%d deliveries made at the cap of 3", n)
	}
	if n := e.count(`SELECT count(*) FROM webhook_events WHERE expanded_at IS NULL`); n != 3 {
		t.Errorf("%d events wait to be fanned out, want 3", n)
	}
	for _, path := range []string{"/v1/webhooks", "/v1/webhooks/" + sub.ID.String() + "/deliveries"} {
		c := api.capped(t, "acme", path)
		if c == nil || c.InFlight != 3 || c.MaxPending != 3 || c.Since.IsZero() || c.CheckedAt.Before(c.Since) ||
			time.Since(c.Since) > time.Minute || !strings.Contains(c.Detail, "none is dropped") {
			t.Errorf("GET %s at the cap: capped %+v, want 3 in flight of 3, since a moment ago", path, c)
		}
	}
	if c := api.capped(t, "globex", "/v1/webhooks"); c != nil {
		t.Errorf("another tenant sees %+v, want null", c)
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
	if c := api.capped(t, "acme", "/v1/webhooks"); c != nil {
		t.Errorf("below the cap again: %+v, want null", c)
	}
}

// api is an ingest server on a test's database, and an API key of each of
// its tenants.
type api struct {
	url  string
	keys map[string]string
}

func tenantAPI(t *testing.T, pool *pgxpool.Pool, tenants ...string) *api {
	t.Helper()
	srv, err := ingest.New(ingest.Config{RateLimit: -1, AuthFailureRate: -1}, nil, nil, pool, slog.New(slog.DiscardHandler), prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	a := &api{keys: map[string]string{}}
	a.url, _ = ingesttest.Serve(t, srv)
	for _, tenant := range tenants {
		a.keys[tenant] = ingest.NewAPIKey()
		if err := ingest.CreateAPIKey(context.Background(), pool, tenant, "test", a.keys[tenant]); err != nil {
			t.Fatal(err)
		}
	}
	return a
}

// capped is the capped member of what GET path answers tenant.
func (a *api) capped(t *testing.T, tenant, path string) *webhooks.Capped {
	t.Helper()
	c := &apiclient.Client{BaseURL: a.url, APIKey: a.keys[tenant]}
	resp, err := c.Do(context.Background(), http.MethodGet, path, "", nil)
	if err != nil {
		t.Fatal(err)
	}
	var body map[string]json.RawMessage
	if err := json.Unmarshal(resp.Body, &body); err != nil || resp.Status != http.StatusOK {
		t.Fatalf("GET %s as %s: %d %s", path, tenant, resp.Status, resp.Body)
	}
	raw, ok := body["capped"]
	if !ok {
		t.Fatalf("GET %s as %s: no capped member in %s", path, tenant, resp.Body)
	}
	var capped *webhooks.Capped
	if err := json.Unmarshal(raw, &capped); err != nil {
		t.Fatalf("GET %s: capped %s: %v", path, raw, err)
	}
	return capped
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
