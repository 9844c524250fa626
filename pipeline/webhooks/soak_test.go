package webhooks_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/onceflow/onceflow/pipeline"
	"github.com/onceflow/onceflow/pipeline/jobs"
	"github.com/onceflow/onceflow/pipeline/pipelinetest"
	"github.com/onceflow/onceflow/pipeline/webhooks"
)

// TestSoakCappedTenant is issue 41's long test of a capped tenant
// (docs/webhooks.md#soak-a-capped-tenant), run only when
// ONCEFLOW_SOAK_CAPPED gives its duration (make soak-capped; 10m as the
// issue asks, 60s for a short one). acme has 10 subscriptions on a
// receiver that never answers, capped at 50 deliveries in flight;
// globex has one on a receiver that answers at once. First globex's
// events alone for a fifth of the duration (the baseline, at least 30 s),
// then both tenants' for the duration: a batch every 100 ms, one globex
// event and ten acme events. It logs the snoozed fan-outs every 10 s and
// globex's delivery p99 in each phase, and fails when acme has more than
// one fan-out waiting or globex's p99 is past twice the baseline's (a
// baseline under 100 ms counts as 100 ms: scheduler noise on a loaded
// machine is not a finding).
func TestSoakCappedTenant(t *testing.T) {
	d, err := time.ParseDuration(os.Getenv("ONCEFLOW_SOAK_CAPPED"))
	if err != nil || d <= 0 {
		t.Skip("set ONCEFLOW_SOAK_CAPPED=10m (or 60s) to run it: make soak-capped")
	}
	stop := make(chan struct{})
	hang := httptest.NewServer(http.HandlerFunc(func(_ http.ResponseWriter, r *http.Request) {
		select {
		case <-r.Context().Done():
		case <-stop:
		}
	}))
	t.Cleanup(func() { close(stop); hang.Close() })
	var mu sync.Mutex
	projected := map[string]time.Time{} // globex's event id -> when its batch committed
	received := map[string]time.Time{}  // globex's event id -> its first delivery
	fast := httptest.NewServer(http.HandlerFunc(func(_ http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		if id := r.Header.Get("webhook-id"); received[id].IsZero() {
			received[id] = time.Now()
		}
	}))
	t.Cleanup(fast.Close)

	e := newEnv(t, jobs.Config{})
	for i := range 10 {
		if _, _, err := webhooks.Create(context.Background(), e.pool, "acme", fmt.Sprint("soak-", i), hang.URL, nil); err != nil {
			t.Fatal(err)
		}
	}
	e.subscribe("globex", fast.URL)
	const maxPending = 50
	proj, err := jobs.NewProjection("webhooks", e.jcfg, webhooks.Router{MaxPending: maxPending}, nil)
	if err != nil {
		t.Fatal(err)
	}
	e.proj = proj
	e.work(webhooks.Config{Allow: loopback, MaxPending: maxPending}, "w1")

	// phase sends batches for d, with acme's events or not, and returns
	// globex's delivery latencies of it.
	phase := func(name string, d time.Duration, acme bool) []time.Duration {
		start, sample, maxSnoozed := time.Now(), time.Now(), 0
		for time.Since(start) < d {
			g := deposit("globex", 1)
			evs := []pipeline.Event{g}
			if acme {
				for range 10 {
					evs = append(evs, deposit("acme", 1))
				}
			}
			e.project(evs...)
			mu.Lock()
			projected[g.ID.String()] = time.Now()
			mu.Unlock()
			if time.Since(sample) >= 10*time.Second {
				sample = time.Now()
				n := e.count(`SELECT count(*) FROM river_job WHERE kind = 'webhook_fanout' AND state = 'scheduled' AND args->>'tenant' = 'acme'`)
				maxSnoozed = max(maxSnoozed, n)
				t.Logf("%s %3.0fs: acme's snoozed fan-outs %d, its events waiting %d, its deliveries in flight %d", name, time.Since(start).Seconds(), n,
					e.count(`SELECT count(*) FROM webhook_events WHERE tenant = 'acme' AND expanded_at IS NULL`),
					e.count(`SELECT count(*) FROM webhook_deliveries WHERE tenant = 'acme' AND status IN ('pending', 'failed')`))
			}
			time.Sleep(100 * time.Millisecond)
		}
		// The last deliveries of the phase.
		pipelinetest.Eventually(t, time.Minute, func() error {
			mu.Lock()
			defer mu.Unlock()
			for id := range projected {
				if received[id].IsZero() {
					return fmt.Errorf("globex's event %s not delivered", id)
				}
			}
			return nil
		})
		if acme && maxSnoozed > 1 {
			t.Errorf("%s: acme had %d fan-outs snoozed at once, want at most 1", name, maxSnoozed)
		}
		mu.Lock()
		defer mu.Unlock()
		var latencies []time.Duration
		for id, at := range projected {
			// A delivery can come before its batch's commit was noted.
			latencies = append(latencies, max(0, received[id].Sub(at)))
		}
		clear(projected)
		return latencies
	}
	base := phase("baseline", max(d/5, 30*time.Second), false)
	capped := phase("capped", d, true)
	bp, cp := p99(base), p99(capped)
	t.Logf("globex's delivery p99: %v alone (%d deliveries), %v beside capped acme (%d deliveries); p50 %v and %v",
		bp, len(base), cp, len(capped), quantile(base, 0.5), quantile(capped, 0.5))
	if cp > 2*max(bp, 100*time.Millisecond) {
		t.Errorf("globex's delivery p99 beside capped acme is %v, past twice its baseline %v", cp, bp)
	}
}

func p99(ds []time.Duration) time.Duration { return quantile(ds, 0.99) }

func quantile(ds []time.Duration, q float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[min(len(s)-1, int(q*float64(len(s))))]
}
