package ingest_test

import (
	"context"
	"fmt"
	"net/http"
	"net/netip"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/onceflow/onceflow/pipeline/ingest"
	"github.com/onceflow/onceflow/pipeline/pipelinetest"
)

// Right after a restart nothing is warm: no address has spent anything, so
// a flood of made-up keys from thousands of addresses (through the trusted
// proxy, one X-Forwarded-For each), each with a whole failure budget,
// holds every key lookup slot. The keys that exist are read at start and
// a key made afterwards within KeyRefresh, so the good clients' requests
// skip the failure limit and the lookups: every one is served during the
// flood (no 429, no 503), made-up keys never are, and an address that
// spent its budget before the flood is still refused without a lookup
// after it.
func TestFloodAfterRestartDoesNotLockOutAGoodClient(t *testing.T) {
	t.Parallel()
	pool, lookups := countingPool(t, 4)
	proxy := []netip.Prefix{netip.MustParsePrefix("127.0.0.1/32")}
	// Budgets that do not refill while the test runs.
	cfg := ingest.Config{AuthFailureRate: 0.001, AuthFailureBurst: 20, TrustedProxies: proxy, KeyRefresh: 100 * time.Millisecond}
	good := tenant(t, pool, "good")
	from := func(addr string) map[string]string { return map[string]string{"X-Forwarded-For": addr} }

	before := startServer(t, pool, cfg)
	acceptedID(t, before.do(t, req{path: "/v1/accounts", apiKey: good, idemKey: "open", body: `{"account_id":"a","currency":"EUR"}`, header: from("203.0.113.5")}))
	before.stop()

	s := startServer(t, pool, cfg) // the restart
	const attacker = "198.51.100.66"
	for i := range 21 {
		want := http.StatusUnauthorized
		if i == 20 {
			want = http.StatusTooManyRequests
		}
		if r := s.do(t, req{method: http.MethodGet, path: "/v1/accounts/a", apiKey: ingest.NewAPIKey(), header: from(attacker)}); r.Status != want {
			t.Fatalf("the attacker's request %d before the flood: %d, want %d", i+1, r.Status, want)
		}
	}
	fresh := tenant(t, pool, "fresh") // made after the restart
	pipelinetest.Eventually(t, 10*time.Second, func() error {
		if !s.KnowsKey(fresh) {
			return fmt.Errorf("a key made after the start is not known valid yet")
		}
		return nil
	})

	const addrs, perAddr = 1000, 25
	var next atomic.Int64
	var flooded sync.WaitGroup
	var codes [600]atomic.Int64
	for range 16 {
		flooded.Add(1)
		go func() {
			defer flooded.Done()
			for {
				n := next.Add(1) - 1
				if n >= addrs*perAddr {
					return
				}
				addr := fmt.Sprintf("198.18.%d.%d", (n%addrs)/250, (n%addrs)%250+1)
				r, err := s.try(context.Background(), req{method: http.MethodGet, path: "/v1/accounts/a", apiKey: ingest.NewAPIKey(), header: from(addr)})
				if err != nil {
					t.Error(err)
					return
				}
				codes[r.Status].Add(1)
			}
		}()
	}
	// The good clients, from their first request after the restart, while
	// the flood runs.
	for next.Load() < addrs {
		time.Sleep(time.Millisecond)
	}
	var refused []string
	for i := range 40 {
		key, addr := good, "203.0.113.5"
		if i%4 == 3 {
			key, addr = fresh, "203.0.113.9"
		}
		q := req{method: http.MethodGet, path: "/v1/accounts/a", apiKey: key, header: from(addr)}
		if i%2 == 0 {
			q = req{path: "/v1/accounts/a/deposits", apiKey: key, idemKey: fmt.Sprint("d", i), body: `{"amount":1}`, header: from(addr)}
		}
		if r := s.do(t, q); r.Status != http.StatusAccepted && r.Status != http.StatusNotFound { // no projector: the account is not there
			refused = append(refused, fmt.Sprintf("%s %s: %d", q.method, q.path, r.Status))
		}
	}
	flooded.Wait()
	if len(refused) > 0 {
		t.Errorf("the good clients were refused %d of 40 times during the flood: %v", len(refused), refused)
	}
	if ok := codes[http.StatusOK].Load() + codes[http.StatusNotFound].Load(); ok > 0 {
		t.Errorf("%d requests with made-up keys were served", ok)
	}
	n := lookups.n.Load()
	if r := s.do(t, req{method: http.MethodGet, path: "/v1/accounts/a", apiKey: ingest.NewAPIKey(), header: from(attacker)}); r.Status != http.StatusTooManyRequests {
		t.Errorf("the attacker after the flood: got %d, want 429", r.Status)
	}
	if lookups.n.Load() != n {
		t.Error("the attacker past its budget cost a lookup")
	}
	t.Logf("flood: %d requests from %d addresses: 401 %d, 429 %d, 503 %d; key lookups %d",
		addrs*perAddr, addrs, codes[401].Load(), codes[429].Load(), codes[503].Load(), lookups.n.Load())
}

// A client cannot buy itself a new failure budget by writing
// X-Forwarded-For: reaching ingest itself, its header is ignored (only the
// proxy's is read) and its failures are counted on its own address;
// through a proxy that writes the peer it saw over the header (the
// compose stack's nginx, which TestComposeTrustsOnlyItsProxy checks), its
// failures are counted on the address the proxy saw, and another client
// of the proxy keeps its own budget. A proxy that appends instead, with
// the clients' network trusted too, would hand the client the choice:
// TestClientAddr's last rows.
func TestForgedForwardedForBuysNoBudget(t *testing.T) {
	t.Parallel()
	pool, _ := ledgerPool(t)
	cfg := ingest.Config{AuthFailureRate: 0.001, AuthFailureBurst: 20}
	refusedAfter := func(s *server, header func(i int) map[string]string) int {
		t.Helper()
		for i := range 40 {
			r := s.do(t, req{method: http.MethodGet, path: "/v1/accounts/a", apiKey: ingest.NewAPIKey(), header: header(i)})
			if r.Status == http.StatusTooManyRequests {
				return i
			}
		}
		return -1
	}
	forged := func(i int) map[string]string {
		return map[string]string{"X-Forwarded-For": fmt.Sprintf("203.0.113.%d, 198.18.0.%d", i+1, i+1)}
	}

	// Straight to ingest: the proxy is elsewhere, the header ignored.
	direct := cfg
	direct.TrustedProxies = []netip.Prefix{netip.MustParsePrefix("192.0.2.10/32")}
	if n := refusedAfter(startServer(t, pool, direct), forged); n != 20 {
		t.Errorf("a client writing a new X-Forwarded-For each time, straight to ingest: refused after %d failures, want 20", n)
	}

	// Through the proxy (here the test, at 127.0.0.1), which writes the
	// peer it saw: whatever the client wrote is gone.
	proxied := cfg
	proxied.TrustedProxies = []netip.Prefix{netip.MustParsePrefix("127.0.0.1/32")}
	s := startServer(t, pool, proxied)
	seen := func(addr string) func(int) map[string]string {
		return func(int) map[string]string { return map[string]string{"X-Forwarded-For": addr} }
	}
	if n := refusedAfter(s, seen("198.51.100.7")); n != 20 {
		t.Errorf("a client through the proxy: refused after %d failures, want 20", n)
	}
	if r := s.do(t, req{method: http.MethodGet, path: "/v1/accounts/a", apiKey: ingest.NewAPIKey(), header: seen("198.51.100.8")(0)}); r.Status != http.StatusUnauthorized {
		t.Errorf("another client of the proxy: got %d, want 401 (its own budget)", r.Status)
	}
}
