package webhooks_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/onceflow/onceflow/pipeline"
	"github.com/onceflow/onceflow/pipeline/jobs"
	"github.com/onceflow/onceflow/pipeline/pipelinetest"
	"github.com/onceflow/onceflow/pipeline/webhooks"
)

// heldReceiver holds every request until release; then a request to a
// path in gone answers 410, any other 200.
type heldReceiver struct {
	*httptest.Server
	gate chan struct{}
	once sync.Once
}

func newHeldReceiver(t *testing.T, gone ...string) *heldReceiver {
	r := &heldReceiver{gate: make(chan struct{})}
	r.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		select {
		case <-r.gate:
		case <-req.Context().Done():
			return
		}
		for _, p := range gone {
			if req.URL.Path == p {
				w.WriteHeader(http.StatusGone)
				return
			}
		}
	}))
	t.Cleanup(r.Close)
	t.Cleanup(r.release)
	return r
}

func (r *heldReceiver) release() { r.once.Do(func() { close(r.gate) }) }

// cappedEnv is acme with two subscriptions (so its events are fanned out,
// never made inline) on receiver, the projector and a worker holding it
// to a cap of maxPending deliveries in flight and maxQueued queued events.
func cappedEnv(t *testing.T, r *heldReceiver, maxPending, maxQueued int) (*env, [2]webhooks.Subscription) {
	e := newEnv(t, jobs.Config{})
	subs := [2]webhooks.Subscription{e.subscribe("acme", r.URL+"/a"), e.subscribe("acme", r.URL+"/b")}
	proj, err := jobs.NewProjection("webhooks", e.jcfg, webhooks.Router{MaxPending: maxPending, MaxQueued: maxQueued}, nil)
	if err != nil {
		t.Fatal(err)
	}
	e.proj = proj
	e.work(webhooks.Config{Allow: loopback, MaxPending: maxPending, MaxQueued: maxQueued, Timeout: time.Minute}, "w1")
	return e, subs
}

const waitingFanouts = `SELECT count(*) FROM river_job WHERE kind = 'webhook_fanout' AND args->>'tenant' = 'acme'
	AND state IN ('available', 'pending', 'retryable', 'running', 'scheduled')`

// capAcme projects one event, whose two deliveries fill acme's cap of 2
// and hang at the receiver.
func capAcme(e *env) {
	e.t.Helper()
	e.project(deposit("acme", 1))
	pipelinetest.Eventually(e.t, 30*time.Second, func() error {
		if n := e.count(`SELECT count(*) FROM webhook_deliveries WHERE tenant = 'acme'`); n != 2 {
			return fmt.Errorf("%d deliveries, want 2", n)
		}
		return nil
	})
}

// A tenant at its cap has one fan-out waiting, however many projector
// batches come: each batch's fan-out finds the one waiting and leaves its
// events to it, so the queue holds no pile of snoozed fan-outs for every
// other tenant's jobs to wait behind. Once deliveries finish, the waiting
// one fans out every event, each delivered once.
func TestCappedTenantHasOneWaitingFanout(t *testing.T) {
	t.Parallel()
	r := newHeldReceiver(t)
	e, _ := cappedEnv(t, r, 2, 0)
	capAcme(e)
	const batches = 30
	for i := range batches {
		e.project(deposit("acme", int64(i+2)))
	}
	pipelinetest.Eventually(t, 60*time.Second, func() error {
		// Every batch's fan-out has run once: none is waiting to start.
		if n := e.count(waitingFanouts + ` AND NOT metadata ? 'snoozes'`); n != 0 {
			return fmt.Errorf("%d fan-outs not run yet", n)
		}
		return nil
	})
	if n := e.count(waitingFanouts); n > 1 {
		t.Errorf("%d batches of a capped tenant left %d fan-outs waiting, want at most 1", batches, n)
	}
	if n := e.count(`SELECT count(*) FROM webhook_events WHERE tenant = 'acme' AND expanded_at IS NULL`); n != batches {
		t.Errorf("%d events wait to be fanned out, want %d", n, batches)
	}
	r.release()
	got := e.waitStatus("acme", 2*(batches+1), 2*time.Minute, "delivered")
	seen := map[[2]pipeline.ID]bool{}
	for _, d := range got {
		seen[[2]pipeline.ID{d.EventID, d.SubscriptionID}] = true
	}
	if len(seen) != 2*(batches+1) {
		t.Errorf("%d distinct deliveries, want %d", len(seen), 2*(batches+1))
	}
	if n := e.count(waitingFanouts); n != 0 {
		t.Errorf("%d fan-outs still waiting below the cap", n)
	}
}

// A subscription disabled while its tenant was capped (its endpoint
// answered 410) still gets a delivery row for every event it was
// subscribed to when the event came: the fan-out, which runs later, makes
// them for the subscriptions enabled when the event was stored, and their
// jobs end them dead (the endpoint is disabled), in the tenant's log.
func TestSubscriptionDisabledWhileCappedKeepsItsDeliveries(t *testing.T) {
	t.Parallel()
	r := newHeldReceiver(t, "/b")
	e, subs := cappedEnv(t, r, 2, 0)
	capAcme(e)
	for i := range 3 {
		e.project(deposit("acme", int64(i+2)))
	}
	pipelinetest.Eventually(t, 30*time.Second, func() error {
		if n := e.count(`SELECT count(*) FROM webhook_fanout_waiting WHERE tenant = 'acme'`); n != 1 {
			return fmt.Errorf("no fan-out waits for acme yet")
		}
		return nil
	})
	r.release() // b answers 410 and is disabled; acme goes below its cap
	got := e.waitStatus("acme", 8, 2*time.Minute, "delivered", "dead")
	per := map[pipeline.ID][]string{}
	for _, d := range got {
		per[d.SubscriptionID] = append(per[d.SubscriptionID], d.Status)
	}
	if a := per[subs[0].ID]; len(a) != 4 || strings.Count(strings.Join(a, " "), "delivered") != 4 {
		t.Errorf("the enabled subscription's deliveries: %v, want 4 delivered", a)
	}
	if b := per[subs[1].ID]; len(b) != 4 || strings.Count(strings.Join(b, " "), "dead") != 4 {
		t.Errorf("the subscription disabled while capped: %v, want 4 dead (one 410, three disabled)", b)
	}
}

// A capped tenant's queued events are bounded (MaxQueued): past the
// bound an event is stored refused, without its body, and its deliveries
// are made dead with the reason when the tenant's fan-out runs — in the
// tenant's delivery log, never dropped unseen; the events within the
// bound are delivered.
func TestCappedTenantsQueueIsBounded(t *testing.T) {
	t.Parallel()
	r := newHeldReceiver(t)
	e, _ := cappedEnv(t, r, 2, 3)
	capAcme(e)
	e.project(deposit("acme", 2))
	pipelinetest.Eventually(t, 30*time.Second, func() error {
		if n := e.count(`SELECT count(*) FROM webhook_fanout_waiting WHERE tenant = 'acme' AND queued = 1`); n != 1 {
			return fmt.Errorf("no fan-out waits for acme with its one event yet")
		}
		return nil
	})
	for i := range 5 { // two more within the bound of 3, three past it
		e.project(deposit("acme", int64(i+3)))
	}
	if n := e.count(`SELECT count(*) FROM webhook_events WHERE tenant = 'acme' AND refused AND body = ''`); n != 3 {
		t.Errorf("%d events stored refused, want 3", n)
	}
	r.release()
	got := e.waitStatus("acme", 14, 2*time.Minute, "delivered", "dead")
	var delivered, refused int
	for _, d := range got {
		switch {
		case d.Status == "delivered":
			delivered++
		case d.Status == "dead" && d.LastError != nil && strings.HasPrefix(*d.LastError, "queue-full"):
			refused++
		default:
			t.Errorf("delivery of %s: %s (%v)", d.EventID, d.Status, deref(d.LastError))
		}
	}
	if delivered != 8 || refused != 6 {
		t.Errorf("%d deliveries delivered and %d refused, want 8 (four events) and 6 (three)", delivered, refused)
	}
}
