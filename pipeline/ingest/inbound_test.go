package ingest_test

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/onceflow/onceflow/examples/ledger"
	"github.com/onceflow/onceflow/pipeline/ingest"
	"github.com/onceflow/onceflow/pipeline/pipelinetest"
)

// The providers of these tests: payments signs the Standard Webhooks way
// and orders a payment's events by precedence (a success beats a failure,
// whatever the order they arrive in); cards signs the Stripe way and has
// a sequence number per account.
var (
	paymentsSecret = "whsec_" + base64.StdEncoding.EncodeToString([]byte("payments-secret-0123456789abcdef"))
	rotatedSecret  = "whsec_" + base64.StdEncoding.EncodeToString([]byte("payments-secret-rotated-98765432"))
	cardsSecret    = "whsec_cards_test_secret"
)

const testProviders = `{"providers": [
	{"name": "payments", "scheme": "standard-webhooks", "secrets_env": "PAYMENTS_SECRETS", "tenant": "acme",
	 "tolerance": "5m", "event_type": "/type", "aggregate_id": "/data/account_id",
	 "events": {
		"account.opened":    {"command": "OpenAccount", "fields": {"currency": "/data/currency"}},
		"payment.succeeded": {"command": "Deposit", "fields": {"amount": "/data/amount"}, "precedence": 2},
		"payment.failed":    {"command": "Withdraw", "fields": {"amount": "/data/amount"}, "precedence": 1},
		"payment.noted":     {}
	 }},
	{"name": "cards", "scheme": "stripe", "secrets": ["whsec_cards_test_secret"], "tenant": "acme",
	 "event_id": "/id", "aggregate_id": "/data/object/account", "version": "/data/object/sequence",
	 "events": {"charge.captured": {"command": "Deposit", "fields": {"amount": "/data/object/amount"}}}}
]}`

func providers(t testing.TB) []ingest.Provider {
	t.Helper()
	env := map[string]string{"PAYMENTS_SECRETS": paymentsSecret + "," + rotatedSecret}
	p, err := ingest.ParseProviders([]byte(testProviders), func(k string) string { return env[k] })
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func inboundServer(t testing.TB) *server {
	t.Helper()
	pool, _ := ledgerPool(t)
	return startServer(t, pool, ingest.Config{Providers: providers(t)})
}

// delivery is one webhook delivery: a provider, an event, how it is signed.
type delivery struct {
	provider string
	id, typ  string
	data     map[string]any
	at       time.Time // the signed timestamp; zero: now
	secret   string    // zero: the provider's
	tamper   bool      // change the body after signing
}

func (d delivery) body() []byte {
	v := map[string]any{"type": d.typ, "data": d.data}
	if d.provider == "cards" {
		v = map[string]any{"id": d.id, "type": d.typ, "data": map[string]any{"object": d.data}}
	}
	b, _ := json.Marshal(v)
	return b
}

func (s *server) deliver(t testing.TB, d delivery) response {
	t.Helper()
	if d.at.IsZero() {
		d.at = time.Now()
	}
	body := d.body()
	var h http.Header
	switch d.provider {
	case "cards":
		h = ingest.SignStripe(cmpStr(d.secret, cardsSecret), d.at, body)
	default:
		var err error
		if h, err = ingest.SignStandardWebhooks(cmpStr(d.secret, paymentsSecret), d.id, d.at, body); err != nil {
			t.Fatal(err)
		}
	}
	if d.tamper {
		body = []byte(strings.Replace(string(body), "}", `,"x":1}`, 1))
	}
	hdr := map[string]string{}
	for k := range h {
		hdr[k] = h.Get(k)
	}
	return s.do(t, req{path: "/v1/inbound/" + d.provider, body: string(body), header: hdr})
}

func cmpStr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

func answer(t testing.TB, r response) ingest.InboundAnswer {
	t.Helper()
	if r.Status != http.StatusOK {
		t.Fatalf("got %s, want 200", r)
	}
	var a ingest.InboundAnswer
	if err := json.Unmarshal(r.Body, &a); err != nil {
		t.Fatal(err)
	}
	return a
}

type inboundRow struct {
	status     string
	commandID  *string
	deliveries int
}

func inboundRows(t testing.TB, s *server) map[string]inboundRow {
	t.Helper()
	rs, err := s.pool.Query(context.Background(), `SELECT provider || '/' || event_id, status, command_id::text, deliveries FROM inbound_events`)
	if err != nil {
		t.Fatal(err)
	}
	defer rs.Close()
	out := map[string]inboundRow{}
	for rs.Next() {
		var k string
		var r inboundRow
		if err := rs.Scan(&k, &r.status, &r.commandID, &r.deliveries); err != nil {
			t.Fatal(err)
		}
		out[k] = r
	}
	return out
}

// A delivery that is not signed with one of the provider's secrets, or
// whose signed timestamp is outside the tolerance, is refused with a
// problem and stores nothing; a secret being rotated in signs as well as
// the old one.
func TestInboundRefusesBadSignaturesAndStaleTimestamps(t *testing.T) {
	t.Parallel()
	s := inboundServer(t)
	data := map[string]any{"account_id": "acc-1", "amount": 100}
	for _, c := range []struct {
		name   string
		d      delivery
		status int
		typ    string
	}{
		{"another secret", delivery{provider: "payments", secret: "whsec_" + base64.StdEncoding.EncodeToString([]byte("not-the-secret")), id: "e1", typ: "payment.succeeded", data: data}, 401, "inbound-signature-invalid"},
		{"body changed after signing", delivery{provider: "payments", tamper: true, id: "e1", typ: "payment.succeeded", data: data}, 401, "inbound-signature-invalid"},
		{"ten minutes old", delivery{provider: "payments", at: time.Now().Add(-10 * time.Minute), id: "e1", typ: "payment.succeeded", data: data}, 401, "inbound-timestamp-stale"},
		{"ten minutes ahead", delivery{provider: "payments", at: time.Now().Add(10 * time.Minute), id: "e1", typ: "payment.succeeded", data: data}, 401, "inbound-timestamp-stale"},
		{"stripe: another secret", delivery{provider: "cards", secret: "whsec_other", id: "ch1", typ: "charge.captured", data: map[string]any{"account": "acc-1", "amount": 5, "sequence": 1}}, 401, "inbound-signature-invalid"},
		{"stripe: an hour old", delivery{provider: "cards", at: time.Now().Add(-time.Hour), id: "ch1", typ: "charge.captured", data: map[string]any{"account": "acc-1", "amount": 5, "sequence": 1}}, 401, "inbound-timestamp-stale"},
		{"unknown provider", delivery{provider: "nobody", id: "e1", typ: "payment.succeeded", data: data}, 404, "inbound-provider-unknown"},
	} {
		r := s.deliver(t, c.d)
		if p := r.problem(t); r.Status != c.status || p.Type != "https://onceflow.dev/problems/"+c.typ {
			t.Errorf("%s: got %s, want %d %s", c.name, r, c.status, c.typ)
		}
	}
	// Signed, but without the headers at all.
	r := s.do(t, req{path: "/v1/inbound/payments", body: `{"type":"payment.succeeded"}`})
	if p := r.problem(t); r.Status != 400 || !strings.HasSuffix(p.Type, "/inbound-signature-missing") {
		t.Errorf("no signature headers: got %s, want 400 inbound-signature-missing", r)
	}
	if n := len(inboundRows(t, s)); n != 0 || countRows(t, s.pool).outbox != 0 {
		t.Fatalf("refused deliveries stored %d events, %d outbox rows; want none", n, countRows(t, s.pool).outbox)
	}
	// The rotated secret signs as well as the first.
	a := answer(t, s.deliver(t, delivery{provider: "payments", secret: rotatedSecret, id: "e2", typ: "payment.succeeded", data: data}))
	if a.Status != "enqueued" || a.Duplicate {
		t.Fatalf("rotated secret: got %+v, want enqueued", a)
	}
	if got := s.counter(t, "onceflow_api_inbound_deliveries_total", map[string]string{"provider": "payments", "outcome": "bad-signature"}); got != 2 {
		t.Errorf("bad-signature deliveries counted %v, want 2", got)
	}
}

// The same event delivered ten times at once (a provider retrying while
// the first is in flight, each retry signed anew) is stored once and makes
// one command, the outbox row ingest writes for any command; every
// delivery is answered 200 with the event's command.
func TestInboundSameEventTenTimesConcurrently(t *testing.T) {
	t.Parallel()
	s := inboundServer(t)
	d := delivery{provider: "payments", id: "evt_1", typ: "payment.succeeded", data: map[string]any{"account_id": "acc-1", "amount": 1500}}
	var wg sync.WaitGroup
	answers := make([]ingest.InboundAnswer, 10)
	for i := range answers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			answers[i] = answer(t, s.deliver(t, d))
		}()
	}
	wg.Wait()
	want := ingest.InboundCommandID("payments", "evt_1").String()
	fresh := 0
	for _, a := range answers {
		if a.Status != "enqueued" || a.CommandID != want {
			t.Errorf("answer %+v, want enqueued as %s", a, want)
		}
		if !a.Duplicate {
			fresh++
		}
	}
	if fresh != 1 {
		t.Errorf("%d deliveries were not duplicates, want 1", fresh)
	}
	rows := inboundRows(t, s)
	if r := rows["payments/evt_1"]; len(rows) != 1 || r.deliveries != 10 || r.status != "enqueued" {
		t.Errorf("inbound_events %+v, want one enqueued row with 10 deliveries", rows)
	}
	out := outboxRows(t, s)
	if len(out) != 1 {
		t.Fatalf("%d outbox rows, want 1", len(out))
	}
	o := out[0]
	if dep, ok := o.Payload.(ledger.Deposit); !ok || dep.Amount != 1500 || o.Key != "acme/acc-1" ||
		o.Headers["command-id"] != want || o.Headers["command-type"] != "Deposit" || o.Headers["tenant"] != "acme" {
		t.Errorf("outbox row %+v, want a Deposit of 1500 to acme/acc-1 as %s", o, want)
	}
	var status string
	if err := s.pool.QueryRow(context.Background(), `SELECT status FROM command_status WHERE command_id = $1`, want).Scan(&status); err != nil || status != "pending" {
		t.Errorf("command_status: %q, %v; want pending", status, err)
	}
}

// Deliveries out of order: the provider's version orders events that have
// one, and precedence orders types (a late payment.failed never undoes a
// payment.succeeded). A loser is stored as superseded and makes no
// command.
func TestInboundOutOfOrder(t *testing.T) {
	t.Parallel()
	s := inboundServer(t)
	pay := func(id, typ, account string) delivery {
		return delivery{provider: "payments", id: id, typ: typ, data: map[string]any{"account_id": account, "amount": 10}}
	}
	card := func(id, account string, seq int) delivery {
		return delivery{provider: "cards", id: id, typ: "charge.captured", data: map[string]any{"account": account, "amount": 7, "sequence": seq}}
	}
	for _, c := range []struct {
		name       string
		first, sec delivery
		want       [2]string
	}{
		{"failure after success", pay("p1-ok", "payment.succeeded", "acc-a"), pay("p1-fail", "payment.failed", "acc-a"), [2]string{"enqueued", "superseded"}},
		{"success after failure", pay("p2-fail", "payment.failed", "acc-b"), pay("p2-ok", "payment.succeeded", "acc-b"), [2]string{"enqueued", "enqueued"}},
		{"two of one precedence, in arrival order", pay("p3-a", "payment.succeeded", "acc-c"), pay("p3-b", "payment.succeeded", "acc-c"), [2]string{"enqueued", "enqueued"}},
		{"a lower version after a higher", card("c1-2", "acc-d", 2), card("c1-1", "acc-d", 1), [2]string{"enqueued", "superseded"}},
		{"versions in order", card("c2-1", "acc-e", 1), card("c2-2", "acc-e", 2), [2]string{"enqueued", "enqueued"}},
		{"the same version again, another event id", card("c3-1", "acc-f", 1), card("c3-1b", "acc-f", 1), [2]string{"enqueued", "superseded"}},
		{"other aggregates do not compete", pay("p4-ok", "payment.succeeded", "acc-g"), pay("p4-fail", "payment.failed", "acc-h"), [2]string{"enqueued", "enqueued"}},
	} {
		a1, a2 := answer(t, s.deliver(t, c.first)), answer(t, s.deliver(t, c.sec))
		if a1.Status != c.want[0] || a2.Status != c.want[1] {
			t.Errorf("%s: got %s then %s, want %s then %s", c.name, a1.Status, a2.Status, c.want[0], c.want[1])
		}
		if a2.Status == "superseded" && a2.CommandID != "" {
			t.Errorf("%s: a superseded event answered command %s", c.name, a2.CommandID)
		}
		// Redelivered, the loser stays a loser and the winner makes no
		// second command.
		if r1, r2 := answer(t, s.deliver(t, c.first)), answer(t, s.deliver(t, c.sec)); !r1.Duplicate || !r2.Duplicate || r1.Status != a1.Status || r2.Status != a2.Status {
			t.Errorf("%s: redelivered: got %+v and %+v, want duplicates answering as before", c.name, r1, r2)
		}
	}
	enqueued := 0
	for _, r := range inboundRows(t, s) {
		if r.status == "enqueued" {
			enqueued++
		}
	}
	if n := len(outboxRows(t, s)); n != enqueued || n != 11 {
		t.Errorf("%d outbox rows for %d enqueued events, want 11 of each", n, enqueued)
	}
}

// An event type the configuration does not map is stored as ignored and
// answered 200 (a refusal would be retried for days); a type mapped to no
// command is recorded and still takes part in ordering; a delivery whose
// fields make no valid command is a 422 and stores nothing.
func TestInboundIgnoredRecordedAndInvalid(t *testing.T) {
	t.Parallel()
	s := inboundServer(t)
	if a := answer(t, s.deliver(t, delivery{provider: "payments", id: "x1", typ: "customer.created", data: map[string]any{}})); a.Status != "ignored" || a.CommandID != "" {
		t.Errorf("unmapped type: got %+v, want ignored", a)
	}
	if a := answer(t, s.deliver(t, delivery{provider: "payments", id: "x2", typ: "payment.noted", data: map[string]any{"account_id": "acc-1"}})); a.Status != "recorded" || a.CommandID != "" {
		t.Errorf("type without a command: got %+v, want recorded", a)
	}
	for name, data := range map[string]map[string]any{
		"negative amount":  {"account_id": "acc-1", "amount": -5},
		"no amount":        {"account_id": "acc-1"},
		"bad account id":   {"account_id": "a b", "amount": 5},
		"amount as a text": {"account_id": "acc-1", "amount": "5"},
	} {
		r := s.deliver(t, delivery{provider: "payments", id: "bad-" + name, typ: "payment.succeeded", data: data})
		if p := r.problem(t); r.Status != 422 || !strings.HasSuffix(p.Type, "/invalid-request") || len(p.Errors) == 0 {
			t.Errorf("%s: got %s, want 422 naming the field", name, r)
		}
	}
	if rows := inboundRows(t, s); len(rows) != 2 || countRows(t, s.pool).outbox != 0 {
		t.Errorf("stored %v and %d outbox rows, want the ignored and the recorded events only", rows, countRows(t, s.pool).outbox)
	}
}

// A configuration that cannot work is refused when the server is built,
// every mistake at once.
func TestInboundConfigurationIsChecked(t *testing.T) {
	t.Parallel()
	pool, _ := ledgerPool(t)
	bad := []ingest.Provider{
		{Name: "Bad Name", Scheme: "standard-webhooks", Secrets: []string{paymentsSecret}, Tenant: "acme", AggregateID: "/a"},
		{Name: "p2", Scheme: "hmac", Secrets: []string{"x"}, Tenant: "acme", AggregateID: "/a"},
		{Name: "p3", Scheme: "standard-webhooks", Secrets: []string{"not base64!"}, Tenant: "acme", AggregateID: "/a"},
		{Name: "p4", Scheme: "stripe", Secrets: []string{"s"}, Tenant: "acme", AggregateID: "a",
			Events: map[string]ingest.ProviderEvent{
				"x": {Command: "NoSuchCommand"},
				"y": {Command: "Deposit"},
				"z": {Command: "Deposit", Fields: map[string]string{"amount": "/a", "color": "/c"}},
			}},
		// What a provider's signature does not cover, whoever replays a
		// captured delivery within its tolerance can change: an event id,
		// type, aggregate, version or command field read from an unsigned
		// header would let them make another command of it.
		{Name: "p5", Scheme: "standard-webhooks", Secrets: []string{paymentsSecret}, Tenant: "acme",
			EventID: "header:X-Event-Id", EventType: "header:X-Event-Type", AggregateID: "header:X-Account", Version: "header:X-Seq",
			Events: map[string]ingest.ProviderEvent{
				"d": {Command: "Deposit", Fields: map[string]string{"amount": "header:X-Amount"}, AggregateID: "header:X-Other"},
			}},
		{Name: "p6", Scheme: "stripe", Secrets: []string{"s"}, Tenant: "acme", AggregateID: "/a", EventID: "header:webhook-id"},
	}
	_, err := ingest.New(ingest.Config{Providers: bad}, ledgerRoutes(commandSerde(t)), nil, pool, slog.New(slog.DiscardHandler), prometheus.NewRegistry())
	if err == nil {
		t.Fatal("New accepted a bad configuration")
	}
	for _, want := range []string{`"Bad Name": name`, `"p2": scheme "hmac"`, `"p3": secret 1`, `aggregate_id "a"`,
		`"NoSuchCommand" is no command type`, `Deposit needs field "amount"`, `Deposit has no field "color"`,
		`"p5": event_id "header:X-Event-Id": the standard-webhooks signature does not cover that header`,
		`"p5": event_type "header:X-Event-Type": the standard-webhooks signature`, `"p5": aggregate_id "header:X-Account"`,
		`"p5": version "header:X-Seq"`, `"p5": event "d": aggregate_id "header:X-Other"`, `"p5": event "d": field "amount": "header:X-Amount"`,
		`"p6": event_id "header:webhook-id": the stripe signature does not cover that header`} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %s", err, want)
		}
	}
	if _, err := ingest.ParseProviders([]byte(`{"providers":[{"name":"p","secrets_env":"UNSET"}]}`), func(string) string { return "" }); err == nil ||
		!strings.Contains(err.Error(), "UNSET is not set") {
		t.Errorf("an unset secrets_env: %v", err)
	}
	if _, err := ingest.ParseProviders([]byte(`{"providers":[{"name":"p","secret":"x"}]}`), func(string) string { return "" }); err == nil {
		t.Error("an unknown member was accepted")
	}
}

// Event ids are kept for the retention and deleted after it (by every
// ingest process, from its start); a delivery of an event older than that
// is a new event, but it makes no second command: the aggregate's winner
// does not win over itself, and an event whose command's status row is
// there (kept for good) is enqueued as it was.
func TestInboundRetention(t *testing.T) {
	t.Parallel()
	pool, _ := ledgerPool(t)
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `INSERT INTO inbound_events (provider, event_id, event_type, tenant, status, payload, received_at)
		VALUES ('payments', 'old', 'customer.created', 'acme', 'ignored', '{}', now() - interval '2 hours'),
		       ('payments', 'young', 'customer.created', 'acme', 'ignored', '{}', now() - interval '30 minutes')`); err != nil {
		t.Fatal(err)
	}
	s := startServer(t, pool, ingest.Config{Providers: providers(t), InboundRetention: time.Hour})
	pipelinetest.Eventually(t, 10*time.Second, func() error {
		if rows := inboundRows(t, s); len(rows) != 1 || rows["payments/young"].status != "ignored" {
			return fmt.Errorf("inbound_events %v, want the young event only", rows)
		}
		return nil
	})

	d := delivery{provider: "payments", id: "evt_r", typ: "payment.succeeded", data: map[string]any{"account_id": "acc-r", "amount": 9}}
	if a := answer(t, s.deliver(t, d)); a.Status != "enqueued" {
		t.Fatalf("first delivery: %+v", a)
	}
	// As the retention would.
	if _, err := pool.Exec(ctx, `DELETE FROM inbound_events WHERE event_id = 'evt_r'`); err != nil {
		t.Fatal(err)
	}
	if a := answer(t, s.deliver(t, d)); a.Status != "enqueued" || a.Duplicate || a.CommandID != ingest.InboundCommandID("payments", "evt_r").String() {
		t.Errorf("the same event after the retention: %+v, want a new delivery answering its command, made once", a)
	}
	if n := len(outboxRows(t, s)); n != 1 {
		t.Errorf("%d outbox rows, want 1", n)
	}
	// An event that lost its place as the winner (a later one of the same
	// precedence won) and comes again after the retention: its command is
	// known, so it is not made twice.
	later := delivery{provider: "payments", id: "evt_r2", typ: "payment.succeeded", data: map[string]any{"account_id": "acc-r", "amount": 4}}
	if a := answer(t, s.deliver(t, later)); a.Status != "enqueued" {
		t.Fatalf("a later event: %+v", a)
	}
	first := delivery{provider: "payments", id: "evt_r0", typ: "payment.succeeded", data: map[string]any{"account_id": "acc-q", "amount": 1}}
	then := delivery{provider: "payments", id: "evt_r1", typ: "payment.succeeded", data: map[string]any{"account_id": "acc-q", "amount": 2}}
	answer(t, s.deliver(t, first))
	answer(t, s.deliver(t, then))
	if _, err := pool.Exec(ctx, `DELETE FROM inbound_events WHERE event_id = 'evt_r0'`); err != nil {
		t.Fatal(err)
	}
	if a := answer(t, s.deliver(t, first)); a.Status != "enqueued" || a.Duplicate || a.CommandID != ingest.InboundCommandID("payments", "evt_r0").String() {
		t.Errorf("an old event whose command exists, after the retention: %+v, want enqueued as its command, made once", a)
	}
	var winner string
	if err := pool.QueryRow(ctx, `SELECT event_id FROM inbound_aggregates WHERE aggregate_id = 'acme/acc-q'`).Scan(&winner); err != nil || winner != "evt_r1" {
		t.Errorf("acc-q's winner %q (%v), want evt_r1 still", winner, err)
	}
	if n := len(outboxRows(t, s)); n != 4 {
		t.Errorf("%d outbox rows, want 4 (evt_r, evt_r2, evt_r0, evt_r1, each once)", n)
	}
}

// Every answer of the inbound route is a status its OpenAPI operation
// lists, with a body of the documented shape.
func TestInboundAnswersAsDocumented(t *testing.T) {
	t.Parallel()
	doc := loadDoc(t)
	s := inboundServer(t)
	const route = "POST /v1/inbound/{provider}"
	data := map[string]any{"account_id": "acc-1", "amount": 100}
	answers := []response{
		s.deliver(t, delivery{provider: "payments", id: "d1", typ: "payment.succeeded", data: data}),
		s.deliver(t, delivery{provider: "payments", id: "d1", typ: "payment.succeeded", data: data}),
		s.deliver(t, delivery{provider: "payments", id: "d2", typ: "customer.created", data: data}),
		s.deliver(t, delivery{provider: "payments", tamper: true, id: "d3", typ: "payment.succeeded", data: data}),
		s.deliver(t, delivery{provider: "payments", at: time.Now().Add(-time.Hour), id: "d4", typ: "payment.succeeded", data: data}),
		s.deliver(t, delivery{provider: "nobody", id: "d5", typ: "payment.succeeded", data: data}),
		s.deliver(t, delivery{provider: "payments", id: "d6", typ: "payment.succeeded", data: map[string]any{"account_id": "acc-1"}}),
		s.do(t, req{path: "/v1/inbound/payments", body: `{}`}),
		s.do(t, req{path: "/v1/inbound/payments", body: `{}`, header: map[string]string{"Content-Type": "text/plain"}}),
		s.do(t, req{path: "/v1/inbound/payments", body: `{"a":"` + strings.Repeat("x", 1<<20) + `"}`}),
	}
	statuses := map[int]bool{}
	for _, r := range answers {
		statuses[r.Status] = true
		raw, ok := doc.op(t, route).Responses[fmt.Sprint(r.Status)]
		if !ok {
			t.Errorf("%s answered %s, a status the document does not list", route, r)
			continue
		}
		checkBody(t, route, r, doc.responseSchema(t, raw))
	}
	for _, want := range []int{200, 400, 401, 404, 413, 415, 422} {
		if !statuses[want] {
			t.Errorf("the battery provoked no %d", want)
		}
	}
}
