package ingest_test

import (
	"context"
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/onceflow/onceflow/pipeline"
	"github.com/onceflow/onceflow/pipeline/ingest"
	"github.com/onceflow/onceflow/pipeline/webhooks"
)

// The webhook subscription routes do what docs/webhooks.md says, and every
// answer of a battery of requests, success and failure, has a status the
// OpenAPI document lists for its route and a body with the documented
// fields.
func TestWebhookRoutesMatchTheDocument(t *testing.T) {
	t.Parallel()
	doc := loadDoc(t)
	pool, _ := ledgerPool(t)
	s := startServer(t, pool, ingest.Config{})
	key := tenant(t, pool, "acme")
	type seen struct {
		route string
		r     response
	}
	var answers []seen
	do := func(route string, q req) response {
		t.Helper()
		q.method = strings.SplitN(route, " ", 2)[0]
		if q.apiKey == "" && !strings.HasPrefix(q.path, "!") {
			q.apiKey = key
		}
		q.path = strings.TrimPrefix(q.path, "!")
		r := s.do(t, q)
		answers = append(answers, seen{route, r})
		return r
	}
	var sub webhooks.Subscription
	decode := func(r response, v any) {
		t.Helper()
		if err := json.Unmarshal(r.Body, v); err != nil {
			t.Fatalf("%s: %v", r, err)
		}
	}

	const create = "POST /v1/webhooks"
	body := `{"url":"https://example.com/hooks","event_types":["Deposited","Withdrawn"]}`
	r := do(create, req{path: "/v1/webhooks", idemKey: "w1", body: body})
	decode(r, &sub)
	if r.Status != http.StatusCreated || !strings.HasPrefix(sub.Secret, "whsec_") || r.Header.Get("Location") != "/v1/webhooks/"+sub.ID.String() ||
		strings.Join(sub.EventTypes, ",") != "Deposited,Withdrawn" || sub.Status != "enabled" {
		t.Fatalf("create: got %s, want 201 with a whsec_ secret and its Location", r)
	}
	if err := webhooks.ValidSecret(sub.Secret); err != nil {
		t.Errorf("the secret cannot sign: %v", err)
	}
	var again webhooks.Subscription
	r = do(create, req{path: "/v1/webhooks", idemKey: "w1", body: body})
	decode(r, &again)
	if r.Status != http.StatusOK || r.Header.Get("Idempotent-Replayed") != "true" || again.ID != sub.ID || again.Secret != "" ||
		strings.Contains(string(r.Body), sub.Secret) {
		t.Errorf("create again with the key: got %s, want 200 replayed with the same subscription, without its secret", r)
	}
	for _, bad := range []struct {
		q      req
		status int
		field  string
	}{
		{req{path: "/v1/webhooks", idemKey: "w1", body: `{"url":"https://example.com/other"}`}, 409, ""},
		{req{path: "/v1/webhooks", body: body}, 400, ""},
		{req{path: "!/v1/webhooks", idemKey: "w2", body: body}, 401, ""},
		{req{path: "/v1/webhooks", idemKey: "w2", body: `{"url":"ftp://example.com"}`}, 422, "url"},
		{req{path: "/v1/webhooks", idemKey: "w2", body: `{"url":"https://u:p@example.com"}`}, 422, "url"},
		{req{path: "/v1/webhooks", idemKey: "w2", body: `{"url":"https://example.com","event_types":["bad type"]}`}, 422, "event_types"},
		{req{path: "/v1/webhooks", idemKey: "w2", body: `{"url":"https://example.com","event_types":"Deposited"}`}, 422, "event_types"},
		{req{path: "/v1/webhooks", idemKey: "w2", body: `{"event_types":[]}`}, 422, "url"},
		{req{path: "/v1/webhooks", idemKey: "w2", body: `{"url":"https://example.com","secret":"mine"}`}, 422, "secret"},
		{req{path: "/v1/webhooks", idemKey: "w2", body: body, header: map[string]string{"Content-Type": "text/plain"}}, 415, ""},
		{req{path: "/v1/webhooks", idemKey: "w2", body: `{"url":"https://example.com/` + strings.Repeat("x", 1<<20) + `"}`}, 413, ""},
	} {
		r := do(create, bad.q)
		if r.Status != bad.status || bad.field != "" && !containsStr(r.problem(t).fields(), bad.field) {
			t.Errorf("create %s: got %s, want %d naming %q", bad.q.body, r, bad.status, bad.field)
		}
	}

	id := sub.ID.String()
	var list struct{ Subscriptions []webhooks.Subscription }
	r = do("GET /v1/webhooks", req{path: "/v1/webhooks"})
	decode(r, &list)
	if r.Status != 200 || len(list.Subscriptions) != 1 || list.Subscriptions[0].ID != sub.ID || list.Subscriptions[0].Secret != "" {
		t.Errorf("list: got %s, want the one subscription without its secret", r)
	}
	do("GET /v1/webhooks", req{path: "!/v1/webhooks"})
	r = do("GET /v1/webhooks/{id}", req{path: "/v1/webhooks/" + id})
	if r.Status != 200 || strings.Contains(string(r.Body), sub.Secret) {
		t.Errorf("get: got %s, want it without its secret", r)
	}
	for _, p := range []string{"/v1/webhooks/nope", "/v1/webhooks/0190a5d0-0000-7000-8000-000000000000"} {
		if r := do("GET /v1/webhooks/{id}", req{path: p}); r.Status != 404 {
			t.Errorf("get %s: got %s, want 404", p, r)
		}
	}
	var rotated webhooks.Subscription
	r = do("POST /v1/webhooks/{id}/rotate", req{path: "/v1/webhooks/" + id + "/rotate"})
	decode(r, &rotated)
	if r.Status != 200 || !rotated.Rotating || rotated.Secret == sub.Secret || rotated.Secret == "" {
		t.Errorf("rotate: got %s, want a new secret and rotating", r)
	}
	// The creating request replayed after a rotation shows neither the
	// first secret nor the rotated one.
	r = do(create, req{path: "/v1/webhooks", idemKey: "w1", body: body})
	if r.Status != http.StatusOK || strings.Contains(string(r.Body), "whsec_") {
		t.Errorf("create again after a rotation: got %s, want 200 without a secret", r)
	}
	r = do("DELETE /v1/webhooks/{id}/previous-secret", req{path: "/v1/webhooks/" + id + "/previous-secret"})
	if r.Status != 200 || strings.Contains(string(r.Body), `"rotating":true`) {
		t.Errorf("drop previous: got %s, want rotating false", r)
	}
	if r := do("POST /v1/webhooks/{id}/enable", req{path: "/v1/webhooks/" + id + "/enable"}); r.Status != 200 {
		t.Errorf("enable: got %s", r)
	}
	var log struct{ Deliveries []webhooks.Delivery }
	r = do("GET /v1/webhooks/{id}/deliveries", req{path: "/v1/webhooks/" + id + "/deliveries?status=dead&limit=5"})
	decode(r, &log)
	if r.Status != 200 || log.Deliveries == nil {
		t.Errorf("deliveries: got %s, want an empty list", r)
	}
	for _, q := range []string{"?status=lost", "?limit=0", "?limit=x"} {
		if r := do("GET /v1/webhooks/{id}/deliveries", req{path: "/v1/webhooks/" + id + "/deliveries" + q}); r.Status != 422 {
			t.Errorf("deliveries%s: got %s, want 422", q, r)
		}
	}
	do("GET /v1/webhooks/{id}/deliveries", req{path: "/v1/webhooks/nope/deliveries"})
	if r := do("DELETE /v1/webhooks/{id}", req{path: "/v1/webhooks/" + id}); r.Status != 204 {
		t.Errorf("delete: got %s, want 204", r)
	}
	for _, route := range []string{"DELETE /v1/webhooks/{id}", "POST /v1/webhooks/{id}/rotate", "DELETE /v1/webhooks/{id}/previous-secret", "POST /v1/webhooks/{id}/enable"} {
		_, path, _ := strings.Cut(route, " ")
		if r := do(route, req{path: strings.Replace(path, "{id}", id, 1)}); r.Status != 404 {
			t.Errorf("%s after the delete: got %s, want 404", route, r)
		}
	}
	// Over the limit of subscriptions per tenant.
	for i := range webhooks.MaxSubscriptions {
		if r := s.do(t, req{method: "POST", path: "/v1/webhooks", apiKey: key, idemKey: "many-" + strconv.Itoa(i), body: body}); r.Status != 201 {
			t.Fatalf("subscription %d: got %s", i, r)
		}
	}
	if r := do(create, req{path: "/v1/webhooks", idemKey: "one-too-many", body: body}); r.Status != 409 {
		t.Errorf("over the limit: got %s, want 409", r)
	}

	for _, a := range answers {
		op := doc.op(t, a.route)
		raw, ok := op.Responses[strconv.Itoa(a.r.Status)]
		if !ok {
			t.Errorf("%s answered %s, a status the document does not list", a.route, a.r)
			continue
		}
		if a.r.Status != http.StatusNoContent {
			checkBody(t, a.route, a.r, doc.responseSchema(t, raw))
		}
	}
}

func containsStr(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

// The cap of subscriptions per tenant holds against creates at once: with
// 96 subscriptions, 20 creates sent together make 4 and refuse 16 (each
// counted 99 or less before its insert, and a tenant went past the cap).
func TestSubscriptionCapHoldsUnderConcurrentCreates(t *testing.T) {
	t.Parallel()
	pool, _ := ledgerPool(t)
	s := startServer(t, pool, ingest.Config{})
	key := tenant(t, pool, "acme")
	body := `{"url":"https://hooks.example.com/onceflow"}`
	for i := range webhooks.MaxSubscriptions - 4 {
		if r := s.do(t, req{method: "POST", path: "/v1/webhooks", apiKey: key, idemKey: "before-" + strconv.Itoa(i), body: body}); r.Status != 201 {
			t.Fatalf("subscription %d: got %s", i, r)
		}
	}
	codes := make(chan int, 20)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			codes <- s.do(t, req{method: "POST", path: "/v1/webhooks", apiKey: key, idemKey: "race-" + strconv.Itoa(i), body: body}).Status
		}()
	}
	close(start)
	wg.Wait()
	close(codes)
	count := map[int]int{}
	for c := range codes {
		count[c]++
	}
	var n int
	if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM webhook_subscriptions WHERE tenant = 'acme'`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if count[201] != 4 || count[409] != 16 || n != webhooks.MaxSubscriptions {
		t.Errorf("20 creates at once with 4 places left: %v by status, %d subscriptions; want 4 made, 16 refused, %d", count, n, webhooks.MaxSubscriptions)
	}
}

// A rotate retried with its Idempotency-Key (its first answer lost) rotates
// once: the retry answers the same rotation, its secret included, and the
// subscription still signs with the secret before it, which the receiver
// may not have replaced yet. The key on another subscription, or on a
// command, is a 409; a new key rotates again.
func TestRotateRetriedWithItsKeyRotatesOnce(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, _ := ledgerPool(t)
	s := startServer(t, pool, ingest.Config{})
	key := tenant(t, pool, "acme")
	subscribe := func(idem string) webhooks.Subscription {
		t.Helper()
		var sub webhooks.Subscription
		r := s.do(t, req{path: "/v1/webhooks", apiKey: key, idemKey: idem, body: `{"url":"https://example.com/hooks"}`})
		if err := json.Unmarshal(r.Body, &sub); err != nil || r.Status != http.StatusCreated {
			t.Fatalf("create: %s (%v)", r, err)
		}
		return sub
	}
	sub, other := subscribe("w1"), subscribe("w2")
	rotate := func(id pipeline.ID, idem string) (response, webhooks.Subscription) {
		t.Helper()
		r := s.do(t, req{path: "/v1/webhooks/" + id.String() + "/rotate", apiKey: key, idemKey: idem})
		var got webhooks.Subscription
		json.Unmarshal(r.Body, &got)
		return r, got
	}
	secrets := func(id pipeline.ID) []string {
		t.Helper()
		var s []string
		if err := pool.QueryRow(ctx, `SELECT secrets FROM webhook_subscriptions WHERE id = $1`, [16]byte(id)).Scan(&s); err != nil {
			t.Fatal(err)
		}
		return s
	}

	r1, first := rotate(sub.ID, "rot-1")
	if r1.Status != http.StatusOK || first.Secret == "" || first.Secret == sub.Secret || r1.Header.Get("Idempotent-Replayed") != "" {
		t.Fatalf("rotate: %s, want 200 with a new secret", r1)
	}
	r2, again := rotate(sub.ID, "rot-1")
	if r2.Status != http.StatusOK || again.Secret != first.Secret || r2.Header.Get("Idempotent-Replayed") != "true" {
		t.Errorf("rotate retried with its key: %s, want 200 replayed with the secret the rotation made (%s)", r2, first.Secret)
	}
	if got := secrets(sub.ID); len(got) != 2 || got[0] != first.Secret || got[1] != sub.Secret {
		t.Errorf("after a rotate and its retry the subscription signs with %d secrets, want the new one and the one before it (rotated once)", len(got))
	}
	if r, _ := rotate(other.ID, "rot-1"); r.Status != http.StatusConflict {
		t.Errorf("the key again on another subscription: %s, want 409", r)
	}
	if r := s.do(t, req{path: "/v1/accounts", apiKey: key, idemKey: "rot-1", body: `{"account_id":"a","currency":"EUR"}`}); r.Status != http.StatusConflict {
		t.Errorf("the key again on a command: %s, want 409", r)
	}
	if r, next := rotate(sub.ID, "rot-2"); r.Status != http.StatusOK || next.Secret == first.Secret {
		t.Errorf("rotate with a new key: %s, want a new secret", r)
	}
}
