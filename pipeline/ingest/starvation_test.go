package ingest_test

import (
	"context"
	"fmt"
	"net/http"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/onceflow/onceflow/pipeline"
	"github.com/onceflow/onceflow/pipeline/ingest"
	"github.com/onceflow/onceflow/pipeline/pipelinetest"
)

// keyLookupSQL is how ingest looks up a key it does not know (apikey.go's
// tenantByKeySQL); lookupCounter counts the statements that start so.
const keyLookupSQL = "SELECT tenant FROM api_keys"

// lookupCounter is a pgx tracer counting the key lookups that reach the
// database.
type lookupCounter struct{ n atomic.Int64 }

func (c *lookupCounter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	if strings.HasPrefix(d.SQL, keyLookupSQL) {
		c.n.Add(1)
	}
	return ctx
}

func (c *lookupCounter) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// countingPool is a pool of conns connections on a database with the
// ledger's tables whose key lookups are counted.
func countingPool(t *testing.T, conns int32) (*pgxpool.Pool, *lookupCounter) {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(pipelinetest.DatabaseURL(t, ledgerMigrations))
	if err != nil {
		t.Fatal(err)
	}
	c := &lookupCounter{}
	cfg.MaxConns = conns
	cfg.ConnConfig.Tracer = c
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool, c
}

// An anonymous client flooding ingest with made-up keys from one address
// costs the database at most its failure budget in key lookups: once the
// budget is spent its requests are 429 (auth-throttled, Retry-After)
// before any lookup. Meanwhile a tenant's commands and reads all succeed,
// on a pool of four connections that the flood would otherwise fill with
// lookups.
func TestAnonymousFloodDoesNotStarveTenants(t *testing.T) {
	t.Parallel()
	pool, lookups := countingPool(t, 4)
	const burst, rate = 20, 1
	s := startServer(t, pool, ingest.Config{AuthFailureRate: rate, AuthFailureBurst: burst})
	good := tenant(t, pool, "good")
	acceptedID(t, s.do(t, req{path: "/v1/accounts", apiKey: good, idemKey: "open", body: `{"account_id":"a","currency":"EUR"}`}))
	before := lookups.n.Load()

	start := time.Now()
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var mu sync.Mutex
	codes := map[int]int{}
	retryAfter := true
	for range 32 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 300; i++ {
				select {
				case <-stop:
					return
				default:
				}
				q := req{method: http.MethodGet, path: "/v1/accounts/a", apiKey: ingest.NewAPIKey()}
				if i%2 == 0 {
					q = req{path: "/v1/accounts/a/deposits", apiKey: ingest.NewAPIKey(), idemKey: "x", body: `{"amount":1}`}
				}
				r, err := s.try(context.Background(), q)
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				codes[r.Status]++
				if r.Status == http.StatusTooManyRequests && (r.Header.Get("Retry-After") == "" || r.problem(t).Type != "https://onceflow.dev/problems/auth-throttled") {
					retryAfter = false
				}
				mu.Unlock()
			}
		}()
	}
	// The tenant's requests, while the flood runs.
	var slowest time.Duration
	for i := range 100 {
		q := req{method: http.MethodGet, path: "/v1/accounts/a", apiKey: good}
		if i%2 == 0 {
			q = req{path: "/v1/accounts/a/deposits", apiKey: good, idemKey: fmt.Sprint("d", i), body: `{"amount":1}`}
		}
		t0 := time.Now()
		r := s.do(t, q)
		slowest = max(slowest, time.Since(t0))
		if r.Status != http.StatusAccepted && r.Status != http.StatusNotFound { // no projector: the account is not there yet
			t.Errorf("the tenant's %s %s during the flood: got %s", q.method, q.path, r)
		}
	}
	close(stop)
	wg.Wait()
	elapsed := time.Since(start)

	// What starved the tenant was the lookups filling the pool, bounded
	// below; its time is the machine's as much as the flood's, so it is
	// shown, not bounded.
	t.Logf("the tenant's slowest request took %s during the flood", slowest)
	// The budget and what refilled while the flood ran: each lookup takes
	// its token before it runs.
	most := int64(burst + rate*elapsed.Seconds() + 1)
	if got := lookups.n.Load() - before; got > most {
		t.Errorf("the flood cost %d key lookups, want at most %d", got, most)
	}
	total := 0
	for _, n := range codes {
		total += n
	}
	if codes[http.StatusTooManyRequests] < total*9/10 || !retryAfter {
		t.Errorf("the flood was answered %v, want nine in ten 429 auth-throttled with Retry-After", codes)
	}
	if n := s.counter(t, "onceflow_api_auth_failures_total", map[string]string{"reason": "throttled"}); n != float64(codes[http.StatusTooManyRequests]) {
		t.Errorf("onceflow_api_auth_failures_total{reason=throttled} = %v, want %d", n, codes[http.StatusTooManyRequests])
	}
}

// A key found unknown, or revoked, is refused from then on without a
// lookup (the negative cache); the failure limit is off here, so only the
// cache stands between the requests and the database. A valid key is
// looked up once, however many requests carry it at once (the keys made
// after the start are not read again here: KeyRefresh off).
func TestNegativeKeyCache(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, lookups := countingPool(t, 4)
	s := startServer(t, pool, ingest.Config{KeyRefresh: -1})
	bad := ingest.NewAPIKey()
	for range 200 {
		if r := s.do(t, req{method: http.MethodGet, path: "/v1/accounts/a", apiKey: bad}); r.Status != http.StatusUnauthorized {
			t.Fatalf("an unknown key: got %s, want 401", r)
		}
	}
	if n := lookups.n.Load(); n != 1 {
		t.Errorf("200 requests with one unknown key cost %d lookups, want 1", n)
	}

	key := tenant(t, pool, "acme")
	var wg sync.WaitGroup
	for i := range 50 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r, err := s.try(ctx, req{path: "/v1/accounts/a/deposits", apiKey: key, idemKey: fmt.Sprint(i), body: `{"amount":1}`})
			if err != nil || r.Status != http.StatusAccepted {
				t.Errorf("a valid key's first requests at once: got %v %v, want 202", r, err)
			}
		}()
	}
	wg.Wait()
	if n := lookups.n.Load(); n != 2 {
		t.Errorf("50 concurrent requests with one new valid key cost %d lookups, want 1 more", n-1)
	}

	// Revoked: the next request is refused (its transaction checks the
	// key), and the ones after it never reach a lookup.
	keys, err := ingest.ListAPIKeys(ctx, pool, "acme")
	if err != nil || len(keys) != 1 {
		t.Fatalf("keys %v, %v", keys, err)
	}
	if _, err := ingest.RevokeAPIKeyByID(ctx, pool, keys[0].ID); err != nil {
		t.Fatal(err)
	}
	for i, q := range []req{
		{method: http.MethodGet, path: "/v1/accounts/a"},
		{method: http.MethodGet, path: "/v1/commands/0190b7a2-0000-7000-8000-000000000000"},
		{path: "/v1/accounts/a/deposits", idemKey: "after", body: `{"amount":1}`},
	} {
		q.apiKey = key
		for range 20 {
			if r := s.do(t, q); r.Status != http.StatusUnauthorized {
				t.Fatalf("%d: %s %s with the revoked key: got %s, want 401", i, q.method, q.path, r)
			}
		}
	}
	if n := lookups.n.Load(); n != 2 {
		t.Errorf("60 requests with a revoked key cost %d lookups, want none", n-2)
	}
	if n := s.counter(t, "onceflow_api_key_lookups_total", map[string]string{"result": "unknown"}); n != 1 {
		t.Errorf("onceflow_api_key_lookups_total{result=unknown} = %v, want 1", n)
	}
}

// Key lookups beyond MaxKeyLookups at once are a 503 with Retry-After at
// once rather than a wait for a connection: here one slot, held by a
// lookup the database is made to hold.
func TestKeyLookupsAreBounded(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, _ := countingPool(t, 4)
	s := startServer(t, pool, ingest.Config{MaxKeyLookups: 1})
	// Serving: the keys read at start are read (a lock taken before would
	// hold the start, not the lookup).
	if r := s.do(t, req{method: http.MethodGet, path: "/openapi.json"}); r.Status != http.StatusOK {
		t.Fatalf("GET /openapi.json: %s", r)
	}
	// Hold api_keys so the first lookup waits on the lock.
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, `LOCK TABLE api_keys IN ACCESS EXCLUSIVE MODE`); err != nil {
		t.Fatal(err)
	}
	first := make(chan response, 1)
	go func() {
		r, _ := s.try(ctx, req{method: http.MethodGet, path: "/v1/accounts/a", apiKey: ingest.NewAPIKey()})
		first <- r
	}()
	pipelinetest.Eventually(t, 10*time.Second, func() error {
		var waiting int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE $1`, keyLookupSQL+"%").Scan(&waiting); err != nil {
			return err
		}
		if waiting == 0 {
			return fmt.Errorf("the first lookup is not waiting yet")
		}
		return nil
	})
	r := s.do(t, req{method: http.MethodGet, path: "/v1/accounts/a", apiKey: ingest.NewAPIKey()})
	if r.Status != http.StatusServiceUnavailable || r.Header.Get("Retry-After") == "" {
		t.Errorf("a second unknown key while the only slot is taken: got %s, want 503 with Retry-After", r)
	}
	tx.Rollback(ctx)
	if r := <-first; r.Status != http.StatusUnauthorized {
		t.Errorf("the first lookup, once the lock went: got %s, want 401", r)
	}
}

// ?wait= long-polls beyond MaxWaitsPerTenant for one tenant, or MaxWaits
// in all, answer at once with the current status and Retry-After: 1; the
// others keep waiting, and a slot freed is taken again.
func TestCommandWaitsAreBounded(t *testing.T) {
	t.Parallel()
	pool, _ := ledgerPool(t)
	s := startServer(t, pool, ingest.Config{MaxWaits: 3, MaxWaitsPerTenant: 2})
	a, b := tenant(t, pool, "a"), tenant(t, pool, "b")
	aCmd := acceptedID(t, s.do(t, req{path: "/v1/accounts", apiKey: a, idemKey: "o", body: `{"account_id":"x","currency":"EUR"}`}))
	bCmd := acceptedID(t, s.do(t, req{path: "/v1/accounts", apiKey: b, idemKey: "o", body: `{"account_id":"x","currency":"EUR"}`}))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var wg sync.WaitGroup
	defer wg.Wait()
	wait := func(key, id string) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s.try(ctx, req{method: http.MethodGet, path: "/v1/commands/" + id + "?wait=30s", apiKey: key})
		}()
	}
	waiting := func(n float64) {
		t.Helper()
		pipelinetest.Eventually(t, 10*time.Second, func() error {
			if got := s.gauge(t, "onceflow_api_command_waits"); got != n {
				return fmt.Errorf("%v waits in flight, want %v", got, n)
			}
			return nil
		})
	}
	atOnce := func(label, key, id string) {
		t.Helper()
		start := time.Now()
		r, body := s.command(t, key, id, "?wait=30s")
		if r.Status != http.StatusOK || body.Status != "pending" || r.Header.Get("Retry-After") != "1" {
			t.Errorf("%s: got %s, want 200 pending with Retry-After: 1", label, r)
		}
		if took := time.Since(start); took > 5*time.Second {
			t.Errorf("%s: answered after %s, want at once", label, took)
		}
	}
	wait(a, aCmd)
	wait(a, aCmd)
	waiting(2)
	atOnce("a third wait of a", a, aCmd)
	wait(b, bCmd)
	waiting(3)
	atOnce("a second wait of b beyond the total", b, bCmd)
	if n := s.counter(t, "onceflow_api_command_waits_refused_total", map[string]string{"limit": "tenant"}); n != 1 {
		t.Errorf("refused by the tenant bound: %v, want 1", n)
	}
	if n := s.counter(t, "onceflow_api_command_waits_refused_total", map[string]string{"limit": "total"}); n != 1 {
		t.Errorf("refused by the total bound: %v, want 1", n)
	}
	// The waits end (their clients leave); a new one waits again.
	cancel()
	wg.Wait()
	waiting(0)
	start := time.Now()
	if r, body := s.command(t, a, aCmd, "?wait=300ms"); r.Status != http.StatusOK || body.Status != "pending" || r.Header.Get("Retry-After") != "" {
		t.Errorf("a wait once the others ended: got %s", r)
	}
	if took := time.Since(start); took < 300*time.Millisecond {
		t.Errorf("a wait once the others ended answered after %s: it did not wait", took)
	}
}

// The address failures count against: the peer's, and X-Forwarded-For's
// last hop outside the trusted proxies only when the peer is one of them;
// IPv6 per /64.
func TestClientAddr(t *testing.T) {
	trusted := []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("fd00::/8")}
	for _, tc := range []struct {
		peer, xff string
		trusted   []netip.Prefix
		want      string
	}{
		{"192.0.2.1:5000", "", nil, "192.0.2.1"},
		{"192.0.2.1:5000", "198.51.100.7", nil, "192.0.2.1"},                 // not a proxy: its header is the client's own
		{"192.0.2.1:5000", "198.51.100.7", trusted, "192.0.2.1"},             // untrusted peer
		{"10.1.2.3:5000", "198.51.100.7", trusted, "198.51.100.7"},           // the proxy's client
		{"10.1.2.3:5000", "6.6.6.6, 198.51.100.7", trusted, "198.51.100.7"},  // what the client wrote comes first
		{"10.1.2.3:5000", "198.51.100.7, 10.9.9.9", trusted, "198.51.100.7"}, // two proxies
		{"10.1.2.3:5000", "junk", trusted, "10.1.2.3"},
		{"10.1.2.3:5000", "", trusted, "10.1.2.3"},
		{"[2001:db8:1:2:3:4:5:6]:5000", "", nil, "2001:db8:1:2::/64"},
		{"[::ffff:192.0.2.1]:5000", "", nil, "192.0.2.1"},
		// A proxy that appends to the client's header, with the network
		// its clients come from trusted too (Docker's gateway is private):
		// the client names its own address. Hence the compose stack trusts
		// nginx's address only, and nginx writes the peer over the header.
		{"10.1.2.3:5000", "6.6.6.6, 10.200.0.1", trusted, "6.6.6.6"},
		{"10.1.2.3:5000", "10.200.0.1", []netip.Prefix{netip.MustParsePrefix("10.1.2.3/32")}, "10.200.0.1"},
	} {
		r := &http.Request{RemoteAddr: tc.peer, Header: http.Header{}}
		if tc.xff != "" {
			r.Header.Set("X-Forwarded-For", tc.xff)
		}
		if got := ingest.ClientAddr(r, tc.trusted); got != tc.want {
			t.Errorf("peer %s, X-Forwarded-For %q, trusted %v: got %s, want %s", tc.peer, tc.xff, tc.trusted, got, tc.want)
		}
	}
}

// A GET of a command that is not the caller's, or not there, leaves no
// wake-up registration behind, with or without ?wait=: each one held
// memory for the life of the process.
func TestCommandReadsForgetTheirWakeups(t *testing.T) {
	t.Parallel()
	pool, _ := ledgerPool(t)
	s := startServer(t, pool, ingest.Config{})
	a := tenant(t, pool, "a")
	id := acceptedID(t, s.do(t, req{path: "/v1/accounts", apiKey: a, idemKey: "o", body: `{"account_id":"x","currency":"EUR"}`}))
	for i := range 50 {
		missing := pipeline.NewCommandID().String()
		for _, q := range []string{"", "?wait=20ms"} {
			if r := s.do(t, req{method: http.MethodGet, path: "/v1/commands/" + missing + q, apiKey: a}); r.Status != http.StatusNotFound {
				t.Fatalf("%d: a missing command: got %s", i, r)
			}
		}
	}
	if r, _ := s.command(t, a, id, "?wait=20ms"); r.Status != http.StatusOK {
		t.Fatalf("its own command: got %s", r)
	}
	if n := s.Waiters(); n != 0 {
		t.Errorf("%d wake-up registrations left after the reads ended, want 0", n)
	}
}
