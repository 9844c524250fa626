package ingest_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/onceflow/onceflow/examples/ledger"
	"github.com/onceflow/onceflow/pipeline"
	"github.com/onceflow/onceflow/pipeline/ingest"
	"github.com/onceflow/onceflow/pipeline/pipelinetest"
	"github.com/onceflow/onceflow/pipeline/postgres"
)

// Every command route (docs/ingest.md#routes) puts the right command, on
// the right aggregate, in the outbox.
func TestCommandRoutes(t *testing.T) {
	t.Parallel()
	pool, _ := ledgerPool(t)
	s := startServer(t, pool, ingest.Config{})
	key := tenant(t, pool, "acme")
	for i, tc := range []struct {
		path, body string
		noCT       bool
		aggregate  string
		want       any
	}{
		{"/v1/accounts", `{"account_id":"acc-1","currency":"EUR"}`, false, "acme/acc-1", ledger.OpenAccount{Currency: "EUR"}},
		{"/v1/accounts/acc-1/deposits", `{"amount":1500}`, false, "acme/acc-1", ledger.Deposit{Amount: 1500}},
		{"/v1/accounts/acc-1/withdrawals", `{"amount":9223372036854775807}`, false, "acme/acc-1", ledger.Withdraw{Amount: 1<<63 - 1}},
		{"/v1/transfers", `{"transfer_id":"tr-1","from":"acc-1","to":"acc-2","amount":25}`, false, "acme/acc-1",
			ledger.RequestTransfer{TransferID: "tr-1", To: "acc-2", Amount: 25}},
		{"/v1/accounts/acc-1/close", ``, true, "acme/acc-1", ledger.CloseAccount{}},
		{"/v1/accounts/acc-2/close", `{}`, false, "acme/acc-2", ledger.CloseAccount{}},
	} {
		r := s.do(t, req{path: tc.path, apiKey: key, idemKey: "k" + strconv.Itoa(i), body: tc.body, noCT: tc.noCT})
		id := acceptedID(t, r)
		out := outboxRows(t, s)
		if len(out) != i+1 {
			t.Fatalf("%s: outbox has %d rows, want %d", tc.path, len(out), i+1)
		}
		got := out[i]
		if got.Key != tc.aggregate || got.Payload != tc.want || got.Headers["command-id"] != id ||
			got.Headers["command-type"] != tc.want.(interface{ MessageType() string }).MessageType() {
			t.Errorf("%s: outbox row %+v, want %s %+v with command %s", tc.path, got, tc.aggregate, tc.want, id)
		}
	}
}

// Hostile and broken requests get a clear 4xx naming what is wrong, and
// nothing is stored for any of them.
func TestHostileInput(t *testing.T) {
	t.Parallel()
	pool, _ := ledgerPool(t)
	s := startServer(t, pool, ingest.Config{})
	key := tenant(t, pool, "acme")
	big := `{"amount":1,"pad":"` + strings.Repeat("x", 1<<20) + `"}`
	for _, tc := range []struct {
		name, path, body string
		header           map[string]string
		want             int
		fields           []string // for a 422, the fields listed
	}{
		{name: "body over 1 MiB", path: "/v1/accounts/a/deposits", body: big, want: 413},
		{name: "text/plain", path: "/v1/accounts/a/deposits", body: `{"amount":1}`, header: map[string]string{"Content-Type": "text/plain"}, want: 415},
		{name: "form", path: "/v1/accounts", body: `account_id=a`, header: map[string]string{"Content-Type": "application/x-www-form-urlencoded"}, want: 415},
		{name: "malformed JSON", path: "/v1/accounts/a/deposits", body: `{"amount":`, want: 422, fields: []string{""}},
		{name: "not an object", path: "/v1/accounts/a/deposits", body: `[1]`, want: 422, fields: []string{""}},
		{name: "trailing data", path: "/v1/accounts/a/deposits", body: `{"amount":1} {}`, want: 422, fields: []string{""}},
		{name: "unknown field", path: "/v1/accounts/a/deposits", body: `{"amount":1,"amonut":2}`, want: 422, fields: []string{"amonut"}},
		{name: "repeated field", path: "/v1/accounts/a/deposits", body: `{"amount":1,"amount":1000}`, want: 422, fields: []string{"amount"}},
		{name: "negative amount", path: "/v1/accounts/a/deposits", body: `{"amount":-5}`, want: 422, fields: []string{"amount"}},
		{name: "zero amount", path: "/v1/accounts/a/withdrawals", body: `{"amount":0}`, want: 422, fields: []string{"amount"}},
		{name: "zero amount spelled 0e5", path: "/v1/accounts/a/withdrawals", body: `{"amount":0e5}`, want: 422, fields: []string{"amount"}},
		{name: "overflowing amount", path: "/v1/accounts/a/deposits", body: `{"amount":9223372036854775808}`, want: 422, fields: []string{"amount"}},
		{name: "huge exponent", path: "/v1/accounts/a/deposits", body: `{"amount":1e999999999}`, want: 422, fields: []string{"amount"}},
		{name: "fractional amount", path: "/v1/accounts/a/deposits", body: `{"amount":10.5}`, want: 422, fields: []string{"amount"}},
		{name: "amount as a string", path: "/v1/accounts/a/deposits", body: `{"amount":"100"}`, want: 422, fields: []string{"amount"}},
		{name: "missing amount", path: "/v1/accounts/a/deposits", body: `{}`, want: 422, fields: []string{"amount"}},
		{name: "bad id in the path", path: "/v1/accounts/a%20b/deposits", body: `{"amount":1}`, want: 422, fields: []string{"id"}},
		{name: "bad id and bad amount", path: "/v1/accounts/a%2Fb/deposits", body: `{"amount":-1}`, want: 422, fields: []string{"id", "amount"}},
		{name: "id too long", path: "/v1/accounts", body: `{"account_id":"` + strings.Repeat("a", 129) + `","currency":"EUR"}`, want: 422, fields: []string{"account_id"}},
		{name: "empty id and bad currency", path: "/v1/accounts", body: `{"account_id":"","currency":"eur"}`, want: 422, fields: []string{"account_id", "currency"}},
		{name: "id of the wrong type", path: "/v1/accounts", body: `{"account_id":7,"currency":"EUR"}`, want: 422, fields: []string{"account_id"}},
		{name: "transfer to itself", path: "/v1/transfers", body: `{"transfer_id":"t","from":"a","to":"a","amount":1}`, want: 422, fields: []string{"to"}},
		{name: "transfer missing everything", path: "/v1/transfers", body: `{}`, want: 422, fields: []string{"from", "transfer_id", "to", "amount"}},
		{name: "close with a field", path: "/v1/accounts/a/close", body: `{"force":true}`, want: 422, fields: []string{"force"}},
	} {
		r := s.do(t, req{path: tc.path, apiKey: key, idemKey: "k-" + tc.name, body: tc.body, header: tc.header})
		if r.Status != tc.want {
			t.Errorf("%s: got %s, want %d", tc.name, r, tc.want)
			continue
		}
		p := r.problem(t)
		if p.Status != tc.want {
			t.Errorf("%s: problem status %d", tc.name, p.Status)
		}
		if tc.fields != nil && !slices.Equal(p.fields(), tc.fields) {
			t.Errorf("%s: problem lists fields %q, want %q (%s)", tc.name, p.fields(), tc.fields, r)
		}
		if n := countRows(t, pool); n != (rows{}) {
			t.Fatalf("%s: stored %+v, want nothing", tc.name, n)
		}
	}
	// A declared length over the limit is refused before the body is read.
	hr, _ := http.NewRequest(http.MethodPost, s.URL+"/v1/accounts/a/deposits", strings.NewReader(big))
	hr.Header.Set("Authorization", "Bearer "+key)
	hr.Header.Set("Idempotency-Key", "declared")
	hr.Header.Set("Content-Type", "application/json")
	hr.ContentLength = -1 // chunked: only the reader's limit can catch it
	resp, err := httpClient.Do(hr)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusRequestEntityTooLarge {
		t.Errorf("chunked body over 1 MiB: got %d, want 413", resp.StatusCode)
	}
	if n := countRows(t, pool); n != (rows{}) {
		t.Fatalf("stored %+v, want nothing", n)
	}
}

// No key, a wrong key and a revoked key are 401 on every route; a revoked
// key stops working at once, for reads and for commands, even one the
// server has just seen valid.
func TestAuthentication(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, _ := ledgerPool(t)
	s := startServer(t, pool, ingest.Config{})
	key := tenant(t, pool, "acme")
	open := func(apiKey, idem string) response {
		return s.do(t, req{path: "/v1/accounts", apiKey: apiKey, idemKey: idem, body: `{"account_id":"a","currency":"EUR"}`})
	}
	acceptedID(t, open(key, "1"))
	routes := []req{
		{path: "/v1/accounts", body: `{"account_id":"a","currency":"EUR"}`},
		{path: "/v1/accounts/a/deposits", body: `{"amount":1}`},
		{path: "/v1/accounts/a/withdrawals", body: `{"amount":1}`},
		{path: "/v1/accounts/a/close"},
		{path: "/v1/transfers", body: `{"transfer_id":"t","from":"a","to":"b","amount":1}`},
		{method: http.MethodGet, path: "/v1/accounts/a"},
		{method: http.MethodGet, path: "/v1/commands/0190b7a2-0000-7000-8000-000000000000"},
	}
	check := func(label, apiKey string, header map[string]string) {
		t.Helper()
		for _, q := range routes {
			q.apiKey, q.idemKey, q.header = apiKey, "k-"+label, header
			r := s.do(t, q)
			if r.Status != http.StatusUnauthorized || r.Header.Get("WWW-Authenticate") == "" {
				t.Errorf("%s, %s %s: got %s, want 401 with WWW-Authenticate", label, q.method, q.path, r)
			}
		}
	}
	check("no key", "", nil)
	check("wrong key", ingest.NewAPIKey(), nil)
	check("basic auth", "", map[string]string{"Authorization": "Basic YTpi"})

	if err := ingest.RevokeAPIKey(ctx, pool, key); err != nil {
		t.Fatal(err)
	}
	// The very next requests, with a key the server has cached as valid.
	if r := open(key, "2"); r.Status != http.StatusUnauthorized {
		t.Fatalf("a command right after the revocation: got %s, want 401", r)
	}
	check("revoked key", key, nil)
	if n := countRows(t, pool); n != (rows{1, 1, 1}) {
		t.Errorf("stored %+v, want only the first command", n)
	}
}

// A tenant over its rate gets 429 with Retry-After, and its flood does not
// take another tenant's share: the other's requests all pass.
func TestRateLimitPerTenant(t *testing.T) {
	t.Parallel()
	pool, _ := ledgerPool(t)
	s := startServer(t, pool, ingest.Config{RateLimit: 5, RateBurst: 20})
	flood, calm := tenant(t, pool, "flood"), tenant(t, pool, "calm")
	var mu sync.Mutex
	codes := map[int]int{}
	var retryAfter []string
	var wg sync.WaitGroup
	start := time.Now()
	for i := range 200 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r, err := s.try(context.Background(), req{path: "/v1/accounts/f/deposits", apiKey: flood, idemKey: fmt.Sprint("f", i), body: `{"amount":1}`})
			if err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			codes[r.Status]++
			if r.Status == http.StatusTooManyRequests {
				retryAfter = append(retryAfter, r.Header.Get("Retry-After"))
			}
			mu.Unlock()
		}()
	}
	for i := range 15 {
		r := s.do(t, req{path: "/v1/accounts/c/deposits", apiKey: calm, idemKey: fmt.Sprint("c", i), body: `{"amount":1}`})
		acceptedID(t, r)
	}
	wg.Wait()
	// The bucket admits its burst plus the rate for the time the flood
	// took, however slow the machine.
	most := 20 + int(5*time.Since(start).Seconds()) + 1
	if codes[http.StatusAccepted] < 20 || codes[http.StatusAccepted] > most || codes[http.StatusAccepted]+codes[http.StatusTooManyRequests] != 200 {
		t.Errorf("flood: %v, want 20 to %d accepted and the rest 429", codes, most)
	}
	for _, ra := range retryAfter {
		if n, err := strconv.Atoi(ra); err != nil || n < 1 {
			t.Fatalf("Retry-After %q, want whole seconds ≥ 1", ra)
		}
	}
}

// GET /v1/commands/{id}?wait= answers as soon as the outcome is known;
// without wait it answers at once.
func TestCommandWait(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, _ := ledgerPool(t)
	s := startServer(t, pool, ingest.Config{})
	key := tenant(t, pool, "acme")
	id := acceptedID(t, s.do(t, req{path: "/v1/accounts", apiKey: key, idemKey: "o", body: `{"account_id":"a","currency":"EUR"}`}))
	get := func(query string) (response, map[string]any) {
		r := s.do(t, req{method: http.MethodGet, path: "/v1/commands/" + id + query, apiKey: key})
		var body map[string]any
		json.Unmarshal(r.Body, &body)
		return r, body
	}
	if r, body := get(""); r.Status != 200 || body["status"] != "pending" || body["command_type"] != "OpenAccount" || body["aggregate_id"] != "acme/a" {
		t.Fatalf("without wait: %s", r)
	}
	// Nothing happens: the request holds for the whole wait, then answers
	// pending.
	start := time.Now()
	if r, body := get("?wait=300ms"); r.Status != 200 || body["status"] != "pending" {
		t.Fatalf("a short wait: %s", r)
	}
	if took := time.Since(start); took < 300*time.Millisecond {
		t.Fatalf("?wait=300ms on a pending command answered after %s: it did not wait", took)
	}

	// The outcome arrives while a client waits (the projector's update).
	waiting := make(chan struct{})
	done := make(chan struct{})
	var r response
	var body map[string]any
	go func() {
		defer close(done)
		close(waiting)
		r, body = get("?wait=30s")
	}()
	<-waiting
	if _, err := pool.Exec(ctx, `UPDATE command_status SET status = 'rejected', reason = 'account_exists', detail = 'x' WHERE command_id = $1`, id); err != nil {
		t.Fatal(err)
	}
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		t.Fatal("the waiting request did not answer once the outcome was known")
	}
	if r.Status != 200 || body["status"] != "rejected" || body["reason"] != "account_exists" {
		t.Fatalf("waited: %s", r)
	}

	for _, bad := range []string{"?wait=soon", "?wait=-1s"} {
		if r, _ := get(bad); r.Status != http.StatusUnprocessableEntity || !slices.Equal(r.problem(t).fields(), []string{"wait"}) {
			t.Errorf("%s: got %s, want 422 naming wait", bad, r)
		}
	}
	if r := s.do(t, req{method: http.MethodGet, path: "/v1/commands/not-a-uuid?wait=5s", apiKey: key}); r.Status != http.StatusNotFound {
		t.Errorf("malformed id: got %s, want 404", r)
	}
}

// acceptFresh opens an account and returns its command id once the server
// knows it as just accepted: the outcome listener's first connection
// forgets every command accepted before it (a connection may have missed
// notifications), so it opens accounts until one is accepted after it.
func acceptFresh(t *testing.T, s *server, key string) string {
	t.Helper()
	for i := 0; ; i++ {
		id := acceptedID(t, s.do(t, req{path: "/v1/accounts", apiKey: key, idemKey: fmt.Sprint("o-", i), body: fmt.Sprintf(`{"account_id":"a%d","currency":"EUR"}`, i)}))
		if s.Fresh() == 1 {
			return id
		}
		if i == 50 {
			t.Fatalf("the server knows %d commands it just accepted, want 1", s.Fresh())
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// A client's first ?wait= right after its 202 does not read the row: the
// process that accepted the command knows it pending, and the outcome's
// notification wakes the wait, whose one read answers. A second wait, on
// a command whose outcome is known, reads at once.
func TestCommandWaitAfterItsAcceptReadsOnce(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, _ := ledgerPool(t)
	s := startServer(t, pool, ingest.Config{WaitPoll: time.Minute})
	key := tenant(t, pool, "acme")
	id := acceptFresh(t, s, key)
	done := make(chan response, 1)
	go func() {
		done <- s.do(t, req{method: http.MethodGet, path: "/v1/commands/" + id + "?wait=30s", apiKey: key})
	}()
	pipelinetest.Eventually(t, 10*time.Second, func() error {
		if s.Waiters() != 1 {
			return errors.New("the request has not registered yet")
		}
		return nil
	})
	if _, err := pool.Exec(ctx, `UPDATE command_status SET status = 'accepted' WHERE command_id = $1`, id); err != nil {
		t.Fatal(err)
	}
	if err := postgres.Notify(ctx, pool, postgres.OutcomesChannel, postgres.OutcomePayloads([]pipeline.ID{pipeline.MustParseID(id)})...); err != nil {
		t.Fatal(err)
	}
	select {
	case r := <-done:
		var body map[string]any
		json.Unmarshal(r.Body, &body)
		if r.Status != 200 || body["status"] != "accepted" || body["command_type"] != "OpenAccount" || !strings.HasPrefix(fmt.Sprint(body["aggregate_id"]), "acme/a") {
			t.Fatalf("woken: %s", r)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the waiting request did not answer after its command's notification")
	}
	if got := s.counter(t, "onceflow_api_command_reads_total", nil); got != 1 {
		t.Errorf("the wait read the row %v times, want 1 (after the notification only)", got)
	}
	if r := s.do(t, req{method: http.MethodGet, path: "/v1/commands/" + id + "?wait=30s", apiKey: key}); r.Status != 200 || !strings.Contains(string(r.Body), `"accepted"`) {
		t.Fatalf("a second wait: %s", r)
	}
	if got := s.counter(t, "onceflow_api_command_reads_total", nil); got != 2 {
		t.Errorf("after a second wait: %v reads, want 2", got)
	}
}

// An outcome notified before the client's first ?wait= arrives is read at
// once: the notification ends what the process knew of the command it
// accepted, so the wait does not sleep through WaitPoll on it. A key
// revoked after the 202 is refused by the wait.
func TestCommandWaitAfterItsOutcomeWasNotified(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, _ := ledgerPool(t)
	s := startServer(t, pool, ingest.Config{WaitPoll: time.Minute})
	key := tenant(t, pool, "acme")
	id := acceptFresh(t, s, key)
	if _, err := pool.Exec(ctx, `UPDATE command_status SET status = 'rejected', reason = 'account_exists', detail = 'x' WHERE command_id = $1`, id); err != nil {
		t.Fatal(err)
	}
	if err := postgres.Notify(ctx, pool, postgres.OutcomesChannel, postgres.OutcomePayloads([]pipeline.ID{pipeline.MustParseID(id)})...); err != nil {
		t.Fatal(err)
	}
	pipelinetest.Eventually(t, 10*time.Second, func() error {
		if s.Fresh() != 0 {
			return errors.New("the notification has not arrived yet")
		}
		return nil
	})
	start := time.Now()
	r := s.do(t, req{method: http.MethodGet, path: "/v1/commands/" + id + "?wait=30s", apiKey: key})
	if r.Status != 200 || !strings.Contains(string(r.Body), `"rejected"`) {
		t.Fatalf("a wait after the outcome: %s", r)
	}
	if took := time.Since(start); took > 10*time.Second {
		t.Errorf("a wait after the outcome's notification answered after %s: it slept on a stale pending", took)
	}

	other := acceptedID(t, s.do(t, req{path: "/v1/accounts", apiKey: key, idemKey: "p", body: `{"account_id":"b","currency":"EUR"}`}))
	if err := ingest.RevokeAPIKey(ctx, pool, key); err != nil {
		t.Fatal(err)
	}
	if r := s.do(t, req{method: http.MethodGet, path: "/v1/commands/" + other + "?wait=1s", apiKey: key}); r.Status != http.StatusUnauthorized {
		t.Errorf("a wait with a key revoked after the 202: got %s, want 401", r)
	}
}

// A ?wait= answers when the projector notifies its command's outcome
// (postgres.OutcomesChannel), not at its next read: here the reads
// without a notification are a minute apart, so only the notification can
// answer it in time. A notification of other commands does not.
func TestCommandWaitWakesOnNotification(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, _ := ledgerPool(t)
	s := startServer(t, pool, ingest.Config{WaitPoll: time.Minute})
	key := tenant(t, pool, "acme")
	id := acceptFresh(t, s, key)
	done := make(chan response, 1)
	go func() {
		done <- s.do(t, req{method: http.MethodGet, path: "/v1/commands/" + id + "?wait=30s", apiKey: key})
	}()
	// The request registers for its command's notifications, then reads
	// the row once: wait for the registration, then give the read time to
	// finish before the outcome is written behind it (a sleep alone was
	// too short on a loaded machine: the read saw the outcome).
	pipelinetest.Eventually(t, 10*time.Second, func() error {
		if s.Waiters() != 1 {
			return errors.New("the request has not registered yet")
		}
		return nil
	})
	time.Sleep(200 * time.Millisecond)
	if _, err := pool.Exec(ctx, `UPDATE command_status SET status = 'accepted' WHERE command_id = $1`, id); err != nil {
		t.Fatal(err)
	}
	other := postgres.OutcomePayloads([]pipeline.ID{pipeline.NewCommandID()})
	if err := postgres.Notify(ctx, pool, postgres.OutcomesChannel, other...); err != nil {
		t.Fatal(err)
	}
	select {
	case r := <-done:
		t.Fatalf("answered %s after another command's notification", r)
	case <-time.After(time.Second):
	}
	start := time.Now()
	if err := postgres.Notify(ctx, pool, postgres.OutcomesChannel, postgres.OutcomePayloads([]pipeline.ID{pipeline.MustParseID(id)})...); err != nil {
		t.Fatal(err)
	}
	select {
	case r := <-done:
		var body map[string]any
		json.Unmarshal(r.Body, &body)
		if r.Status != 200 || body["status"] != "accepted" {
			t.Fatalf("woken: %s", r)
		}
		t.Logf("answered %v after the notification", time.Since(start))
	case <-time.After(20 * time.Second):
		t.Fatal("the waiting request did not answer after its command's notification")
	}
}

// A commit tells the relays which outbox shards it wrote to, on
// OutboxChannel and through OnAccept: a relay reads only those shards'
// heads. The notification names only the shards OnAccept did not see to
// (a relay in the same process holds them), and none is sent when it saw
// to them all (docs/decisions/0012-waking-up-without-polling.md).
func TestAcceptNamesItsShards(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, _ := ledgerPool(t)
	listener, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer listener.Release()
	if _, err := listener.Exec(ctx, "LISTEN "+postgres.OutboxChannel); err != nil {
		t.Fatal(err)
	}
	shardOf := func(account string) int {
		return pipeline.OutboxShard(pipeline.AggregateID("acme", account), pipeline.DefaultOutboxShards)
	}
	// Accounts on distinct shards, so a notification says whose it is.
	var accounts []string
	seen := map[int]bool{}
	for i := 0; len(accounts) < 4; i++ {
		if a := fmt.Sprint("a", i); !seen[shardOf(a)] {
			seen[shardOf(a)] = true
			accounts = append(accounts, a)
		}
	}
	// The in-process relay sees to the even commands' shards.
	seenTo := map[int]bool{shardOf(accounts[0]): true, shardOf(accounts[2]): true}
	accepted := make(chan []int, 10)
	s := startServer(t, pool, ingest.Config{OnAccept: func(shards []int) []int {
		accepted <- slices.Clone(shards)
		if seenTo[shards[0]] {
			return nil
		}
		return shards
	}})
	key := tenant(t, pool, "acme")
	for i, account := range accounts {
		acceptedID(t, s.do(t, req{path: "/v1/accounts", apiKey: key, idemKey: fmt.Sprint("o-", i), body: fmt.Sprintf(`{"account_id":%q,"currency":"EUR"}`, account)}))
		want := []int{shardOf(account)}
		select {
		case got := <-accepted:
			if !slices.Equal(got, want) {
				t.Errorf("command %d: OnAccept got shards %v, want %v", i, got, want)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("command %d: OnAccept not called", i)
		}
		if i%2 == 0 {
			continue // no notification: the next one received must be command i+1's
		}
		wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		n, err := listener.Conn().WaitForNotification(wctx)
		cancel()
		if err != nil {
			t.Fatalf("command %d: no notification: %v", i, err)
		}
		if got := postgres.ParseOutboxPayload(n.Payload); !slices.Equal(got, want) {
			t.Errorf("command %d: notified %q, want shards %v (only the shards OnAccept left)", i, n.Payload, want)
		}
	}
}
