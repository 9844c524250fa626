package webhooks_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/netip"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/onceflow/onceflow/examples/ledger"
	"github.com/onceflow/onceflow/pipeline"
	"github.com/onceflow/onceflow/pipeline/jobs"
	"github.com/onceflow/onceflow/pipeline/pipelinetest"
	"github.com/onceflow/onceflow/pipeline/postgres"
	"github.com/onceflow/onceflow/pipeline/webhooks"
	"github.com/onceflow/onceflow/pipeline/webhooks/webhookstest"
)

// loopback is where the test receivers listen; the guard refuses it
// unless allowed.
var loopback = []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}

type env struct {
	t    *testing.T
	pool *pgxpool.Pool
	proj *jobs.Projection
	jcfg jobs.Config
}

func newEnv(t *testing.T, jcfg jobs.Config) *env {
	pool, _ := pipelinetest.Pool(t)
	if jcfg.FetchPollInterval == 0 {
		jcfg.FetchPollInterval = 100 * time.Millisecond
	}
	proj, err := jobs.NewProjection("webhooks", jcfg, webhooks.Router{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	return &env{t: t, pool: pool, proj: proj, jcfg: jcfg}
}

// subscribe creates tenant's subscription to url for types and returns
// it with its secret.
func (e *env) subscribe(tenant, url string, types ...string) webhooks.Subscription {
	e.t.Helper()
	s, created, err := webhooks.Create(context.Background(), e.pool, tenant, "key-"+url+strings.Join(types, ","), url, types)
	if err != nil || !created {
		e.t.Fatalf("create subscription: %v (created %v)", err, created)
	}
	return s
}

// project applies events as the projector would: the webhooks projection
// in one transaction per batch.
func (e *env) project(evs ...pipeline.Event) {
	e.t.Helper()
	ctx := context.Background()
	if err := pgx.BeginFunc(ctx, e.pool, func(tx pgx.Tx) error {
		out, err := e.proj.ApplyBatch(ctx, tx, evs)
		if err != nil {
			return err
		}
		return errors.Join(out...)
	}); err != nil {
		e.t.Fatal(err)
	}
}

// work runs a worker delivering with cfg until the test ends.
func (e *env) work(cfg webhooks.Config, id string) *jobs.Worker {
	e.t.Helper()
	reg, err := webhooks.Register(cfg, nil, prometheus.NewRegistry())
	if err != nil {
		e.t.Fatal(err)
	}
	c := e.jcfg
	c.ID = id
	w, err := jobs.New(c, e.pool, reg, nil, prometheus.NewRegistry())
	if err != nil {
		e.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	e.t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			e.t.Errorf("worker: %v", err)
		}
	})
	<-w.Ready()
	return w
}

func (e *env) deliveries(tenant string) []webhooks.Delivery {
	e.t.Helper()
	d, err := webhooks.Deliveries(context.Background(), e.pool, webhooks.Filter{Tenant: tenant, Limit: 1000})
	if err != nil {
		e.t.Fatal(err)
	}
	return d
}

// waitStatus waits until every delivery of tenant has a status in want.
func (e *env) waitStatus(tenant string, n int, within time.Duration, want ...string) []webhooks.Delivery {
	e.t.Helper()
	var got []webhooks.Delivery
	pipelinetest.Eventually(e.t, within, func() error {
		got = e.deliveries(tenant)
		if len(got) != n {
			return fmt.Errorf("%d deliveries, want %d", len(got), n)
		}
		for _, d := range got {
			if !contains(want, d.Status) {
				return fmt.Errorf("delivery of %s: %s (attempts %d, last error %v), want %v", d.EventID, d.Status, d.Attempts, deref(d.LastError), want)
			}
		}
		return nil
	})
	return got
}

func contains(s []string, v string) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

func deref[T any](p *T) any {
	if p == nil {
		return nil
	}
	return *p
}

// version numbers the events the tests make; the tests run in parallel.
var version atomic.Int64

func deposit(tenant string, amount int64) pipeline.Event {
	return pipeline.Event{ID: pipeline.NameID(pipeline.NewCommandID(), []byte("0")), CommandID: pipeline.NewCommandID(), Tenant: tenant,
		AggregateID: tenant + "/acc-1", Version: version.Add(1), Time: time.Now(), Payload: ledger.Deposited{Amount: amount}}
}

func opened(tenant string) pipeline.Event {
	ev := deposit(tenant, 0)
	ev.Payload = ledger.AccountOpened{Currency: "EUR"}
	return ev
}

// Every subscribed event is delivered to every subscription, and applied
// once by the receiver, whatever the receiver does before it answers 200:
// 500s, hangs past the timeout after applying, 429 with Retry-After in
// seconds, 503 with Retry-After as an HTTP date, an acknowledgement lost
// after the effect. Each delivery carries webhook-id = the event id and
// Idempotency-Key = its job key on every attempt, signed.
func TestEveryEventDeliveredAndAppliedOnce(t *testing.T) {
	t.Parallel()
	e := newEnv(t, jobs.Config{MaxAttempts: 8, BaseDelay: 10 * time.Millisecond, MaxDelay: 200 * time.Millisecond, Lease: 10 * time.Second})
	plan := func(key string, n int) *webhookstest.Fault {
		switch key[len(key)-1] % 6 {
		case 0:
			if n <= 2 {
				return &webhookstest.Fault{Status: 500, BeforeApply: true}
			}
		case 1:
			if n == 1 {
				return &webhookstest.Fault{Hang: 2 * time.Second} // applied, answer never came in time
			}
		case 2:
			if n == 1 {
				return &webhookstest.Fault{Status: 429, RetryAfter: "1", BeforeApply: true}
			}
		case 3:
			if n == 1 {
				return &webhookstest.Fault{Status: 503, RetryAfter: time.Now().Add(time.Second).UTC().Format(http.TimeFormat), BeforeApply: true}
			}
		case 4:
			if n == 1 {
				return &webhookstest.Fault{Status: 502} // applied, then the proxy lost the answer
			}
		}
		return nil
	}
	// Two subscriptions of acme (one to every type, one to Deposited
	// only) on two receivers, and one of globex.
	all, deps, other := webhookstest.New(nil, plan), webhookstest.New(nil, plan), webhookstest.New(nil, plan)
	for _, r := range []*webhookstest.Receiver{all, deps, other} {
		t.Cleanup(r.Close)
	}
	sAll := e.subscribe("acme", all.URL)
	sDeps := e.subscribe("acme", deps.URL, "Deposited")
	sOther := e.subscribe("globex", other.URL)
	all.SetSecrets([]string{sAll.Secret})
	deps.SetSecrets([]string{sDeps.Secret})
	other.SetSecrets([]string{sOther.Secret})
	e.work(webhooks.Config{Allow: loopback, Timeout: 500 * time.Millisecond, BreakerFailures: 1000}, "w1")
	e.work(webhooks.Config{Allow: loopback, Timeout: 500 * time.Millisecond, BreakerFailures: 1000}, "w2")

	var acme, globex []pipeline.Event
	acme = append(acme, opened("acme"))
	for i := range 20 {
		acme = append(acme, deposit("acme", int64(i+1)))
	}
	for range 5 {
		globex = append(globex, deposit("globex", 7))
	}
	e.project(acme[:10]...)
	e.project(append(acme[10:], globex...)...)
	e.project(acme[3:6]...) // applied again (the inbox forgot them): nothing new

	got := e.waitStatus("acme", 21+20, 40*time.Second, "delivered")
	e.waitStatus("globex", 5, 10*time.Second, "delivered")
	for _, d := range got {
		if d.JobID == nil || d.Attempts < 1 {
			t.Errorf("delivery %s: job %v attempts %d, want its job and attempts recorded", d.Key(), deref(d.JobID), d.Attempts)
		}
	}
	for _, tc := range []struct {
		r   *webhookstest.Receiver
		sub webhooks.Subscription
		evs []pipeline.Event
	}{{all, sAll, acme}, {deps, sDeps, acme[1:]}, {other, sOther, globex}} {
		if bad := tc.r.Bad(); len(bad) > 0 {
			t.Errorf("%s refused: %v", tc.r.URL, bad)
		}
		seen := tc.r.Seen()
		if len(seen) != len(tc.evs) {
			t.Errorf("%s saw %d keys, want %d", tc.r.URL, len(seen), len(tc.evs))
		}
		byKey := map[string]webhookstest.Stats{}
		for _, s := range seen {
			byKey[s.Key] = s
		}
		retried := 0
		for _, ev := range tc.evs {
			s, ok := byKey[jobs.Key(ev.ID, tc.sub.ID.String())]
			switch {
			case !ok:
				t.Errorf("event %s never reached %s", ev.ID, tc.r.URL)
			case s.Effects != 1 || s.WebhookID != ev.ID.String() || s.Body.Type != ev.Type() || s.Body.Data.EventID != ev.ID:
				t.Errorf("event %s at %s: %d effects, webhook-id %s, type %s; want 1 effect, webhook-id %s, type %s",
					ev.ID, tc.r.URL, s.Effects, s.WebhookID, s.Body.Type, ev.ID, ev.Type())
			case s.Requests > 1:
				retried++
			}
		}
		if retried == 0 {
			t.Errorf("%s: no delivery was retried; the faults did not happen", tc.r.URL)
		}
	}
}

// A 410 disables the endpoint: the delivery is dead at once, the next
// events of the subscription are not sent, and other subscriptions go on.
// Enabled again, it receives what comes next, and a redelivery sends the
// dead one with the same keys.
func TestGoneDisablesTheEndpoint(t *testing.T) {
	t.Parallel()
	e := newEnv(t, jobs.Config{MaxAttempts: 5, BaseDelay: 10 * time.Millisecond, MaxDelay: 50 * time.Millisecond})
	gone := webhookstest.New(nil, func(string, int) *webhookstest.Fault { return &webhookstest.Fault{Status: 410, BeforeApply: true} })
	fine := webhookstest.New(nil, nil)
	t.Cleanup(gone.Close)
	t.Cleanup(fine.Close)
	sGone, sFine := e.subscribe("acme", gone.URL), e.subscribe("acme", fine.URL)
	gone.SetSecrets([]string{sGone.Secret})
	fine.SetSecrets([]string{sFine.Secret})
	e.work(webhooks.Config{Allow: loopback}, "w1")
	first := deposit("acme", 1)
	e.project(first)
	e.waitStatus("acme", 2, 10*time.Second, "delivered", "dead")
	s, err := webhooks.Get(context.Background(), e.pool, "acme", sGone.ID)
	if err != nil || s.Status != "disabled" || s.DisabledReason == nil || !strings.Contains(*s.DisabledReason, "410") {
		t.Fatalf("after a 410: %+v %v, want disabled with the reason", s, err)
	}
	second := deposit("acme", 2)
	e.project(second)
	// A disabled subscription gets no delivery of the events after it.
	got := e.waitStatus("acme", 3, 10*time.Second, "delivered", "dead")
	for _, d := range got {
		if want := map[pipeline.ID]string{sGone.ID: "dead", sFine.ID: "delivered"}[d.SubscriptionID]; d.Status != want {
			t.Errorf("delivery %s to %s: %s, want %s", d.EventID, d.SubscriptionID, d.Status, want)
		}
		if d.SubscriptionID == sGone.ID && d.EventID == second.ID {
			t.Errorf("the disabled subscription has a delivery of the next event")
		}
	}
	if n := gone.Requests(jobs.Key(second.ID, sGone.ID.String())); n != 0 {
		t.Errorf("the disabled endpoint got %d requests for the next event, want 0", n)
	}

	gone.SetPlan(nil)
	if _, err := webhooks.Enable(context.Background(), e.pool, "acme", sGone.ID); err != nil {
		t.Fatal(err)
	}
	pipelinetest.Eventually(t, 10*time.Second, func() error {
		return webhooks.Redeliver(context.Background(), e.pool, "acme", sGone.ID, first.ID) // ErrRunning until River wrote the 410's outcome
	})
	pipelinetest.Eventually(t, 10*time.Second, func() error {
		if n := gone.Effects(); n != 1 {
			var st string
			var att, max int
			var errs []string
			e.pool.QueryRow(context.Background(), `SELECT state, attempt, max_attempts, errors::text[] FROM river_job WHERE args->>'key' = $1`, jobs.Key(first.ID, sGone.ID.String())).Scan(&st, &att, &max, &errs)
			return fmt.Errorf("redelivered effects %d, want 1 (job %s %d/%d %v; deliveries %+v)", n, st, att, max, errs, e.deliveries("acme"))
		}
		return nil
	})
	if n := gone.Requests(jobs.Key(first.ID, sGone.ID.String())); n != 2 {
		t.Errorf("the first event reached the endpoint %d times, want 2 (the 410, the redelivery) with one key", n)
	}
}

// The guard refuses loopback, private, link-local and the other
// non-public addresses at dial time unless allow-listed; a refused
// delivery is dead at once, with the reason.
func TestGuardRefusesNonPublicAddresses(t *testing.T) {
	t.Parallel()
	g := webhooks.Guard{Allow: []netip.Prefix{netip.MustParsePrefix("10.1.0.0/16")}}
	for addr, want := range map[string]bool{
		"127.0.0.1": false, "::1": false, "10.0.0.1": false, "10.1.2.3": true, "172.16.5.4": false, "192.168.1.1": false,
		"169.254.169.254": false, "fe80::1": false, "fd00::1": false, "0.0.0.0": false, "100.64.0.1": false,
		"224.0.0.1": false, "::ffff:127.0.0.1": false, "8.8.8.8": true, "2606:4700:4700::1111": true,
	} {
		if got := g.Allowed(netip.MustParseAddr(addr)); got != want {
			t.Errorf("Allowed(%s): got %v, want %v", addr, got, want)
		}
	}

	e := newEnv(t, jobs.Config{MaxAttempts: 5, BaseDelay: 10 * time.Millisecond, MaxDelay: 50 * time.Millisecond})
	r := webhookstest.New(nil, nil)
	t.Cleanup(r.Close)
	// localhost resolves to loopback: refused at dial time, whatever the
	// name.
	sub := e.subscribe("acme", strings.Replace(r.URL, "127.0.0.1", "localhost", 1))
	r.SetSecrets([]string{sub.Secret})
	e.work(webhooks.Config{}, "w1")
	e.project(deposit("acme", 1))
	got := e.waitStatus("acme", 1, 10*time.Second, "dead")
	if got[0].LastError == nil || *got[0].LastError != webhooks.CategoryAddressNotAllowed || got[0].Attempts != 1 {
		t.Errorf("refused delivery: attempts %d, error %v; want dead after 1 attempt, address not allowed", got[0].Attempts, deref(got[0].LastError))
	}
	if n := len(r.Seen()); n != 0 {
		t.Errorf("the receiver got %d requests, want none", n)
	}
}

// A rotation signs with both secrets until the previous one is dropped: a
// receiver that knows only either accepts the delivery.
func TestRotationSignsWithBothSecrets(t *testing.T) {
	t.Parallel()
	e := newEnv(t, jobs.Config{})
	oldOnly, newOnly := webhookstest.New(nil, nil), webhookstest.New(nil, nil)
	t.Cleanup(oldOnly.Close)
	t.Cleanup(newOnly.Close)
	ctx := context.Background()
	sOld := e.subscribe("acme", oldOnly.URL)
	sNew := e.subscribe("acme", newOnly.URL)
	rotOld, err := webhooks.Rotate(ctx, e.pool, "acme", sOld.ID)
	if err != nil {
		t.Fatal(err)
	}
	rotNew, err := webhooks.Rotate(ctx, e.pool, "acme", sNew.ID)
	if err != nil {
		t.Fatal(err)
	}
	if !rotOld.Rotating || rotOld.Secret == sOld.Secret {
		t.Fatalf("after Rotate: %+v, want a new secret and rotating", rotOld)
	}
	oldOnly.SetSecrets([]string{sOld.Secret})
	newOnly.SetSecrets([]string{rotNew.Secret})
	e.work(webhooks.Config{Allow: loopback}, "w1")
	e.project(deposit("acme", 1))
	e.waitStatus("acme", 2, 10*time.Second, "delivered")
	if b := append(oldOnly.Bad(), newOnly.Bad()...); len(b) > 0 {
		t.Errorf("refused during the rotation: %v", b)
	}
	// Dropped: the old secret no longer signs.
	if _, err := webhooks.DropPrevious(ctx, e.pool, "acme", sOld.ID); err != nil {
		t.Fatal(err)
	}
	time.Sleep(webhooks.DefaultCacheTTL) // what the worker read of it expires
	e.project(deposit("acme", 2))
	pipelinetest.Eventually(t, 10*time.Second, func() error {
		if len(oldOnly.Bad()) == 0 {
			return errors.New("the old secret still signs")
		}
		return nil
	})
}

// An endpoint that keeps failing opens its breaker: its deliveries wait
// without spending attempts, and one success closes it.
func TestBreakerOpensAndCloses(t *testing.T) {
	t.Parallel()
	e := newEnv(t, jobs.Config{MaxAttempts: 20, BaseDelay: 10 * time.Millisecond, MaxDelay: 20 * time.Millisecond})
	r := webhookstest.New(nil, func(string, int) *webhookstest.Fault { return &webhookstest.Fault{Status: 500, BeforeApply: true} })
	t.Cleanup(r.Close)
	sub := e.subscribe("acme", r.URL)
	r.SetSecrets([]string{sub.Secret})
	e.work(webhooks.Config{Allow: loopback, BreakerFailures: 3, BreakerCooldown: 2 * time.Second}, "w1")
	e.project(deposit("acme", 1))
	var openUntil *time.Time
	pipelinetest.Eventually(t, 10*time.Second, func() error {
		return e.pool.QueryRow(context.Background(), `SELECT open_until FROM webhook_subscriptions WHERE id = $1 AND open_until > now()`, [16]byte(sub.ID)).Scan(&openUntil)
	})
	attempts := e.deliveries("acme")[0].Attempts
	time.Sleep(time.Second) // open: nothing is sent
	if got := e.deliveries("acme")[0].Attempts; got != attempts {
		t.Errorf("attempts while the breaker was open: %d, then %d; want none", attempts, got)
	}
	r.SetPlan(nil)
	e.waitStatus("acme", 1, 10*time.Second, "delivered")
	var failures int
	if err := e.pool.QueryRow(context.Background(), `SELECT failures FROM webhook_subscriptions WHERE id = $1 AND open_until IS NULL`, [16]byte(sub.ID)).Scan(&failures); err != nil || failures != 0 {
		t.Errorf("after a success: failures %d (%v), want the breaker closed", failures, err)
	}
}

// One tenant's slow endpoint and backlog do not hold the others': a worker
// runs at most MaxPerTenant of a tenant's deliveries at once, and another
// tenant's deliveries go through meanwhile.
func TestTenantsShareTheWorkers(t *testing.T) {
	t.Parallel()
	e := newEnv(t, jobs.Config{MaxWorkers: 10})
	slow := webhookstest.New(nil, func(string, int) *webhookstest.Fault { return &webhookstest.Fault{Hang: 300 * time.Millisecond} })
	fast := webhookstest.New(nil, nil)
	t.Cleanup(slow.Close)
	t.Cleanup(fast.Close)
	sSlow, sFast := e.subscribe("acme", slow.URL), e.subscribe("globex", fast.URL)
	slow.SetSecrets([]string{sSlow.Secret})
	fast.SetSecrets([]string{sFast.Secret})
	e.work(webhooks.Config{Allow: loopback, MaxPerTenant: 2}, "w1")
	// acme's backlog takes at least 60 × 300 ms / 2 = 9 s however fast the
	// machine; globex's deliveries are through while most of it waits.
	const backlogSize = 60
	var backlog []pipeline.Event
	for range backlogSize {
		backlog = append(backlog, deposit("acme", 1))
	}
	e.project(backlog...)
	e.project(deposit("globex", 1), deposit("globex", 2), deposit("globex", 3))
	e.waitStatus("globex", 3, 30*time.Second, "delivered")
	if n := e.count(`SELECT count(*) FROM webhook_deliveries WHERE tenant = 'acme' AND status = 'delivered'`); n >= backlogSize/2 {
		t.Errorf("globex's deliveries came through after %d of acme's %d, want them through while acme's backlog waits", n, backlogSize)
	}
	e.waitStatus("acme", backlogSize, 60*time.Second, "delivered")
	if n := slow.MaxInFlight("acme"); n > 2 {
		t.Errorf("acme had %d deliveries in flight at once, want at most MaxPerTenant 2", n)
	}
}

// The runtime role (docs/security.md#database-roles), which reads and
// writes rows only, runs all of it: the projection enqueues, River's
// client works (leadership, queues, notifications, completion), the
// worker records, the fence trigger fires; and a tenant-scoped session
// sees only its own subscriptions and deliveries.
func TestRuntimeRoleDelivers(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	_, rtURL := pipelinetest.LeastPrivilege(t)
	pool, err := postgres.Connect(ctx, rtURL, 0) // across tenants, as the components' pools
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	proj, err := jobs.NewProjection("webhooks", jobs.Config{}, webhooks.Router{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	e := &env{t: t, pool: pool, proj: proj, jcfg: jobs.Config{FetchPollInterval: 100 * time.Millisecond, BaseDelay: 10 * time.Millisecond, MaxDelay: 50 * time.Millisecond}}
	r := webhookstest.New(nil, func(_ string, n int) *webhookstest.Fault {
		if n == 1 {
			return &webhookstest.Fault{Status: 500, BeforeApply: true}
		}
		return nil
	})
	t.Cleanup(r.Close)
	sub := e.subscribe("acme", r.URL)
	other := e.subscribe("globex", r.URL+"/other")
	r.SetSecrets([]string{sub.Secret, other.Secret})
	e.work(webhooks.Config{Allow: loopback}, "w1")
	e.project(deposit("acme", 1), deposit("acme", 2), deposit("globex", 3))
	e.waitStatus("acme", 2, 15*time.Second, "delivered")
	e.waitStatus("globex", 1, 15*time.Second, "delivered")
	if n := r.Effects(); n != 3 {
		t.Errorf("effects: %d, want 3", n)
	}
	// Scoped to acme, as ingest's reads are.
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, `SELECT set_config('onceflow.tenant', 'acme', true)`); err != nil {
		t.Fatal(err)
	}
	var subs, deliveries, events int
	if err := tx.QueryRow(ctx, `SELECT (SELECT count(*) FROM webhook_subscriptions), (SELECT count(*) FROM webhook_deliveries),
		(SELECT count(*) FROM webhook_events)`).Scan(&subs, &deliveries, &events); err != nil {
		t.Fatal(err)
	}
	if subs != 1 || deliveries != 2 || events != 2 {
		t.Errorf("scoped to acme, without a tenant predicate: %d subscriptions, %d deliveries and %d events, want acme's 1, 2 and 2", subs, deliveries, events)
	}
}

// An event applied again long after — its River jobs cleaned away, the
// inbox's memory gone — is not delivered again: the event row is the
// lasting memory, whether the projector made its delivery (one
// subscription) or a fan-out did (two).
func TestEventAppliedAgainLaterIsNotSentAgain(t *testing.T) {
	t.Parallel()
	for _, n := range []int{1, 2} {
		t.Run(fmt.Sprint("subs=", n), func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, jobs.Config{})
			r := webhookstest.New(nil, nil)
			t.Cleanup(r.Close)
			var subs []webhooks.Subscription
			var secrets []string
			for i := range n {
				s, _, err := webhooks.Create(context.Background(), e.pool, "acme", fmt.Sprint("hook-", i), r.URL, nil)
				if err != nil {
					t.Fatal(err)
				}
				subs, secrets = append(subs, s), append(secrets, s.Secret)
			}
			r.SetSecrets(secrets)
			e.work(webhooks.Config{Allow: loopback}, "w1")
			ev := deposit("acme", 1)
			e.project(ev)
			e.waitStatus("acme", n, 10*time.Second, "delivered")
			// Its jobs: the deliveries, and the fan-out's with two.
			want := int64(n)
			if n > 1 {
				want++
			}
			pipelinetest.Eventually(t, 10*time.Second, func() error {
				// River's cleaner, after its retention, once the jobs are
				// completed.
				var running int
				if err := e.pool.QueryRow(context.Background(), `SELECT count(*) FROM river_job WHERE kind IN ('webhook_fanout', 'webhook_delivery') AND state <> 'completed'`).Scan(&running); err != nil || running != 0 {
					return fmt.Errorf("%d jobs not completed yet (%v)", running, err)
				}
				tag, err := e.pool.Exec(context.Background(), `DELETE FROM river_job WHERE state = 'completed' AND kind IN ('webhook_fanout', 'webhook_delivery')`)
				if err == nil && tag.RowsAffected() != want {
					err = fmt.Errorf("deleted %d completed jobs, want %d", tag.RowsAffected(), want)
				}
				return err
			})
			e.project(ev)
			time.Sleep(500 * time.Millisecond)
			var jobsLeft int
			if err := e.pool.QueryRow(context.Background(), `SELECT count(*) FROM river_job WHERE kind IN ('webhook_fanout', 'webhook_delivery')`).Scan(&jobsLeft); err != nil || jobsLeft != 0 {
				t.Errorf("jobs after the event came again: %d (%v), want none", jobsLeft, err)
			}
			for _, s := range subs {
				if got := r.Requests(jobs.Key(ev.ID, s.ID.String())); got != 1 {
					t.Errorf("the receiver got the event for %s %d times, want 1", s.ID, got)
				}
			}
		})
	}
}

// A delivery whose River completion was lost after its row was written
// (the worker died in between: the job runs again) is not sent again, and
// the worker counts the attempt it skipped in
// onceflow_worker_idempotency_skipped_total.
func TestDeliveredJobRunAgainIsSkippedAndCounted(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newEnv(t, jobs.Config{})
	r := webhookstest.New(nil, nil)
	t.Cleanup(r.Close)
	s := e.subscribe("acme", r.URL)
	r.SetSecrets([]string{s.Secret})
	reg := prometheus.NewRegistry()
	register, err := webhooks.Register(webhooks.Config{Allow: loopback}, nil, prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	jcfg := e.jcfg
	jcfg.ID = "w1"
	w, err := jobs.New(jcfg, e.pool, register, nil, reg)
	if err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- w.Run(wctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("worker: %v", err)
		}
	})
	<-w.Ready()

	ev := deposit("acme", 1)
	e.project(ev)
	e.waitStatus("acme", 1, 10*time.Second, "delivered")
	var id int64
	pipelinetest.Eventually(t, 10*time.Second, func() error {
		return e.pool.QueryRow(ctx, `SELECT id FROM river_job WHERE kind = 'webhook_delivery' AND state = 'completed'`).Scan(&id)
	})
	// What the rescuer does with a job whose worker died after writing
	// the delivery and before River completed it: available again, for
	// its next attempt.
	if _, err := e.pool.Exec(ctx, `UPDATE river_job SET state = 'available', finalized_at = NULL, scheduled_at = now() WHERE id = $1`, id); err != nil {
		t.Fatal(err)
	}
	pipelinetest.Eventually(t, 10*time.Second, func() error {
		var state string
		var attempt int
		if err := e.pool.QueryRow(ctx, `SELECT state, attempt FROM river_job WHERE id = $1`, id).Scan(&state, &attempt); err != nil {
			return err
		}
		if state != "completed" || attempt != 2 {
			return fmt.Errorf("job %s after attempt %d, want completed after attempt 2", state, attempt)
		}
		return nil
	})
	if got := counterValue(t, reg, "onceflow_worker_idempotency_skipped_total", webhooks.Kind); got != 1 {
		t.Errorf("onceflow_worker_idempotency_skipped_total{kind=%q} = %v, want 1", webhooks.Kind, got)
	}
	if got := r.Requests(jobs.Key(ev.ID, s.ID.String())); got != 1 {
		t.Errorf("the receiver got the event %d times, want 1", got)
	}
}

// counterValue is reg's counter name{kind=kind}, 0 when it has none.
func counterValue(t *testing.T, reg prometheus.Gatherer, name, kind string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if mf.GetName() == name && l.GetName() == "kind" && l.GetValue() == kind {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	return 0
}
