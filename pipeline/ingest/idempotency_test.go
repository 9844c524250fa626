package ingest_test

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/onceflow/onceflow/examples/ledger"
	"github.com/onceflow/onceflow/pipeline/ingest"
)

// A retry with the same key and the same request, however its body is
// spelled, gets the first response byte for byte plus Idempotent-Replayed;
// a changed value is a 409 that leaves the first command alone.
func TestReplayAndConflict(t *testing.T) {
	t.Parallel()
	pool, _ := ledgerPool(t)
	s := startServer(t, pool, ingest.Config{})
	key := tenant(t, pool, "acme")
	const route = "POST /v1/accounts/{id}/deposits"
	dep := func(body string) req {
		return req{path: "/v1/accounts/acc-1/deposits", apiKey: key, idemKey: "dep-1", body: body}
	}

	first := s.do(t, dep(`{"amount":100}`))
	id := acceptedID(t, first)
	if first.Header.Get("Idempotent-Replayed") != "" {
		t.Errorf("first answer carries Idempotent-Replayed")
	}
	for _, body := range []string{
		`{"amount":100}`,
		` { "amount" : 100 } `,
		"{\n\t\"amount\": 1e2\n}",
		`{"amount":100.0}`,
		`{"amount":1.00E+2}`,
	} {
		again := s.do(t, dep(body))
		if again.Status != first.Status || !bytes.Equal(again.Body, first.Body) ||
			again.Header.Get("Location") != first.Header.Get("Location") ||
			again.Header.Get("Content-Type") != first.Header.Get("Content-Type") {
			t.Errorf("retry with body %s: got %s Location %q, want %s Location %q",
				body, again, again.Header.Get("Location"), first, first.Header.Get("Location"))
		}
		if again.Header.Get("Idempotent-Replayed") != "true" {
			t.Errorf("retry with body %s: Idempotent-Replayed %q, want true", body, again.Header.Get("Idempotent-Replayed"))
		}
	}

	for _, q := range []req{
		dep(`{"amount":101}`),
		{path: "/v1/accounts/acc-2/deposits", apiKey: key, idemKey: "dep-1", body: `{"amount":100}`},
		{path: "/v1/accounts/acc-1/withdrawals", apiKey: key, idemKey: "dep-1", body: `{"amount":100}`},
	} {
		r := s.do(t, q)
		if r.Status != http.StatusConflict {
			t.Fatalf("%s with a used key: got %s, want 409", q.path, r)
		}
		if p := r.problem(t); !strings.HasSuffix(p.Type, "idempotency-key-reused") {
			t.Errorf("409 type %q, want …idempotency-key-reused", p.Type)
		}
	}

	// One command, untouched by the conflicts.
	out := outboxRows(t, s)
	if len(out) != 1 {
		t.Fatalf("outbox has %d rows, want 1", len(out))
	}
	if got, want := out[0].Payload, (ledger.Deposit{Amount: 100}); got != want {
		t.Errorf("outbox payload %+v, want %+v", got, want)
	}
	if out[0].Key != "acme/acc-1" || out[0].Headers["command-id"] != id || out[0].Headers["tenant"] != "acme" ||
		out[0].Headers["command-type"] != "Deposit" {
		t.Errorf("outbox row key %q headers %v, want acme/acc-1 and command %s", out[0].Key, out[0].Headers, id)
	}
	if n := countRows(t, pool); n != (rows{1, 1, 1}) {
		t.Errorf("stored %+v, want one of each", n)
	}
	var replays, conflicts int
	if err := pool.QueryRow(context.Background(),
		`SELECT replays, conflicts FROM idempotency_keys WHERE tenant = 'acme' AND key = 'dep-1'`).Scan(&replays, &conflicts); err != nil {
		t.Fatal(err)
	}
	if replays != 5 || conflicts != 3 {
		t.Errorf("key record counts %d replays and %d conflicts, want 5 and 3", replays, conflicts)
	}
	if got := s.counter(t, "onceflow_api_idempotency_hits_total", map[string]string{"route": route}); got != 5 {
		t.Errorf("onceflow_api_idempotency_hits_total{route=%q} = %v, want 5", route, got)
	}
	var conflictTotal float64
	for _, r := range []string{route, "POST /v1/accounts/{id}/withdrawals"} {
		conflictTotal += s.counter(t, "onceflow_api_idempotency_conflicts_total", map[string]string{"route": r})
	}
	if conflictTotal != 3 {
		t.Errorf("onceflow_api_idempotency_conflicts_total = %v, want 3", conflictTotal)
	}
}

// Idempotency-Key is required, at most 255 characters, and one only.
func TestIdempotencyKeyHeader(t *testing.T) {
	t.Parallel()
	pool, _ := ledgerPool(t)
	s := startServer(t, pool, ingest.Config{})
	key := tenant(t, pool, "acme")
	body := `{"account_id":"acc-1","currency":"EUR"}`
	for _, tc := range []struct {
		name    string
		headers map[string]string
		idem    string
		want    int
	}{
		{name: "missing", want: http.StatusBadRequest},
		{name: "256 characters", idem: strings.Repeat("k", 256), want: http.StatusBadRequest},
		{name: "256 characters, multi-byte", idem: strings.Repeat("é", 256), want: http.StatusBadRequest},
	} {
		r := s.do(t, req{path: "/v1/accounts", apiKey: key, idemKey: tc.idem, body: body, header: tc.headers})
		if r.Status != tc.want {
			t.Errorf("%s: got %s, want %d", tc.name, r, tc.want)
			continue
		}
		if p := r.problem(t); !strings.Contains(p.Type, "idempotency-key") {
			t.Errorf("%s: problem type %q", tc.name, p.Type)
		}
	}
	// Two Idempotency-Key headers are ambiguous.
	hr, _ := http.NewRequest(http.MethodPost, s.URL+"/v1/accounts", strings.NewReader(body))
	hr.Header.Set("Authorization", "Bearer "+key)
	hr.Header.Set("Content-Type", "application/json")
	hr.Header.Add("Idempotency-Key", "a")
	hr.Header.Add("Idempotency-Key", "b")
	resp, err := httpClient.Do(hr)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest {
		t.Errorf("two keys: got %d, want 400", resp.StatusCode)
	}
	if n := countRows(t, pool); n != (rows{}) {
		t.Fatalf("refused requests stored %+v", n)
	}
	acceptedID(t, s.do(t, req{path: "/v1/accounts", apiKey: key, idemKey: strings.Repeat("é", 255), body: body}))
}

// The same key from two tenants is two independent requests.
func TestKeysAreScopedToTheTenant(t *testing.T) {
	t.Parallel()
	pool, _ := ledgerPool(t)
	s := startServer(t, pool, ingest.Config{})
	a, b := tenant(t, pool, "a"), tenant(t, pool, "b")
	ra := s.do(t, req{path: "/v1/accounts/acc/deposits", apiKey: a, idemKey: "k", body: `{"amount":1}`})
	rb := s.do(t, req{path: "/v1/accounts/acc/deposits", apiKey: b, idemKey: "k", body: `{"amount":2}`})
	if ida, idb := acceptedID(t, ra), acceptedID(t, rb); ida == idb {
		t.Fatalf("two tenants got one command %s", ida)
	}
	if rb.Header.Get("Idempotent-Replayed") != "" {
		t.Errorf("tenant b's first request was answered as a replay")
	}
	out := outboxRows(t, s)
	if len(out) != 2 || out[0].Key != "a/acc" || out[1].Key != "b/acc" {
		t.Fatalf("outbox %+v, want a/acc then b/acc", out)
	}
}

// Many simultaneous requests with one key create exactly one command, and
// every one of them gets the same response; across many keys at once,
// each key gets its own single command.
func TestConcurrentRequestsWithOneKey(t *testing.T) {
	t.Parallel()
	pool, _ := ledgerPool(t)
	s := startServer(t, pool, ingest.Config{})
	key := tenant(t, pool, "acme")
	const keys, perKey = 20, 16
	var wg sync.WaitGroup
	start := make(chan struct{})
	results := make([][]response, keys)
	for k := range keys {
		results[k] = make([]response, perKey)
		for i := range perKey {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				r, err := s.try(context.Background(), req{path: fmt.Sprintf("/v1/accounts/acc-%d/deposits", k),
					apiKey: key, idemKey: fmt.Sprintf("key-%d", k), body: `{"amount":7}`})
				if err != nil {
					t.Error(err)
				}
				results[k][i] = r
			}()
		}
	}
	close(start)
	wg.Wait()
	if t.Failed() {
		return
	}
	for k := range keys {
		var fresh int
		for _, r := range results[k] {
			if r.Status != http.StatusAccepted || !bytes.Equal(r.Body, results[k][0].Body) {
				t.Fatalf("key %d: answers differ: %s and %s", k, r, results[k][0])
			}
			if r.Header.Get("Idempotent-Replayed") == "" {
				fresh++
			}
		}
		if fresh != 1 {
			t.Errorf("key %d: %d answers were not replays, want exactly 1", k, fresh)
		}
	}
	if n := countRows(t, pool); n != (rows{keys, keys, keys}) {
		t.Errorf("stored %+v, want %d of each", n, keys)
	}
}

// Two ingest servers on one database (two processes behind a load
// balancer) still accept each key once: the advisory lock and the lookup
// are in Postgres, not in the process.
func TestTwoServersOneDatabase(t *testing.T) {
	t.Parallel()
	pool, url := ledgerPool(t)
	pool2, err := pgxpoolConnect(url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool2.Close)
	servers := []*server{startServer(t, pool, ingest.Config{}), startServer(t, pool2, ingest.Config{})}
	key := tenant(t, pool, "acme")
	const keys, perKey = 30, 8
	ids := make([]map[string]bool, keys)
	var mu sync.Mutex
	var wg sync.WaitGroup
	for k := range keys {
		ids[k] = map[string]bool{}
		for i := range perKey {
			wg.Add(1)
			go func() {
				defer wg.Done()
				r, err := servers[i%2].try(context.Background(), req{path: "/v1/accounts", apiKey: key,
					idemKey: fmt.Sprintf("open-%d", k), body: fmt.Sprintf(`{"account_id":"acc-%d","currency":"EUR"}`, k)})
				if err != nil || r.Status != http.StatusAccepted {
					t.Errorf("key %d: %v %s", k, err, r)
					return
				}
				mu.Lock()
				ids[k][string(r.Body)] = true
				mu.Unlock()
			}()
		}
	}
	wg.Wait()
	for k := range keys {
		if len(ids[k]) != 1 {
			t.Errorf("key %d got %d different responses across the two servers", k, len(ids[k]))
		}
	}
	if n := countRows(t, pool); n != (rows{keys, keys, keys}) {
		t.Errorf("stored %+v, want %d of each", n, keys)
	}
}

// A key is remembered for the retention and no longer: past it, the same
// key is a new request. Expired records that are still in a partition the
// janitor has not dropped yet do not count, and dropping a partition
// forgets its keys.
func TestRetention(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, _ := ledgerPool(t)
	s := startServer(t, pool, ingest.Config{IdempotencyRetention: time.Hour})
	key := tenant(t, pool, "acme")
	dep := req{path: "/v1/accounts/acc-1/deposits", apiKey: key, idemKey: "dep", body: `{"amount":5}`}
	first := acceptedID(t, s.do(t, dep))

	// 59 minutes old: remembered.
	age := func(d time.Duration) {
		if _, err := pool.Exec(ctx, `UPDATE idempotency_keys SET created_at = now() - make_interval(secs => $1)`, d.Seconds()); err != nil {
			t.Fatal(err)
		}
	}
	age(59 * time.Minute)
	if r := s.do(t, dep); r.Header.Get("Idempotent-Replayed") != "true" || acceptedID(t, r) != first {
		t.Fatalf("a key inside the retention: got %s, want the replay of %s", r, first)
	}
	// 61 minutes old: a new request, with a new command.
	age(61 * time.Minute)
	r := s.do(t, dep)
	second := acceptedID(t, r)
	if second == first || r.Header.Get("Idempotent-Replayed") != "" {
		t.Fatalf("a key past the retention: got %s (replayed %q), want a new command", r, r.Header.Get("Idempotent-Replayed"))
	}
	// And that new record is the one retries get now.
	if r := s.do(t, dep); acceptedID(t, r) != second {
		t.Fatalf("retry after renewal: got %s, want the replay of %s", r, second)
	}

	// The janitor drops whole days past the retention (its function is
	// the one the relay runs): a record in a dropped partition is gone.
	if _, err := pool.Exec(ctx, `SELECT onceflow_ensure_daily_partitions('idempotency_keys', (now() AT TIME ZONE 'UTC')::date - 5, 1)`); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `UPDATE idempotency_keys SET created_at = now() - interval '5 days' WHERE command_id = $1`, second); err != nil {
		t.Fatal(err)
	}
	var dropped []string
	rs, err := pool.Query(ctx, `SELECT onceflow_drop_daily_partitions('idempotency_keys', now() - interval '24 hours')`)
	if err != nil {
		t.Fatal(err)
	}
	for rs.Next() {
		var n string
		rs.Scan(&n)
		dropped = append(dropped, n)
	}
	if rs.Err() != nil || len(dropped) == 0 {
		t.Fatalf("dropped %v, err %v", dropped, rs.Err())
	}
	var left int
	pool.QueryRow(ctx, `SELECT count(*) FROM idempotency_keys WHERE command_id = $1`, second).Scan(&left)
	if left != 0 {
		t.Fatalf("the record in the dropped partition is still there")
	}
	if third := acceptedID(t, s.do(t, dep)); third == second || third == first {
		t.Fatalf("after the drop: got command %s again", third)
	}
}
