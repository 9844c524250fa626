package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode"

	"github.com/onceflow/onceflow/examples/ledger/ledgerapp"
	"github.com/onceflow/onceflow/pipeline/apiclient"
	"github.com/onceflow/onceflow/pipeline/ingest"
	"github.com/onceflow/onceflow/pipeline/pipelinetest"
	"github.com/onceflow/onceflow/pipeline/webhooks"
	"github.com/onceflow/onceflow/pipeline/webhooks/webhookstest"
)

// A hostile tenant's webhooks through the whole deployment: a subscription
// aimed at the deployment's own loopback is refused by the worker's guard
// at dial time, a receiver that answers with escape sequences and internal
// addresses in its body reaches the tenant's delivery log as a category
// and the operator's log and `onceflow jobs list` without a control
// character, and a secret is shown once: the creating request replayed,
// before and after a rotation, answers without it.
func TestHostileTenantWebhooks(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	d := deployWith(t, ctx, map[string]string{
		// The receivers listen on 127.0.0.1; ::1 stays refused.
		"ONCEFLOW_WEBHOOK_ALLOW_NETWORKS": "127.0.0.0/8", "ONCEFLOW_WORKER_MAX_ATTEMPTS": "2",
		"ONCEFLOW_WORKER_BASE_DELAY": "50ms", "ONCEFLOW_WORKER_MAX_DELAY": "100ms",
	})
	worker, err := d.StartComponent(ctx, "worker", "worker", nil)
	if err != nil {
		t.Fatal(err)
	}
	good := webhookstest.New(nil, nil)
	t.Cleanup(good.Close)
	const body = "upstream 10.20.30.40 refused\x1b[2J\x1b]0;owned\x07\u202e"
	hostile := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(http.StatusInternalServerError)
		fmt.Fprint(w, body)
	}))
	t.Cleanup(hostile.Close)

	subscribe := func(key, url string) (webhooks.Subscription, *apiclient.Response) {
		t.Helper()
		r, err := d.client.Do(ctx, "POST", "/v1/webhooks", key, []byte(fmt.Sprintf(`{"url":%q,"event_types":["Deposited"]}`, url)))
		if err != nil {
			t.Fatal(err)
		}
		var s webhooks.Subscription
		if err := json.Unmarshal(r.Body, &s); err != nil {
			t.Fatalf("POST /v1/webhooks: %d %s", r.Status, r.Body)
		}
		return s, r
	}
	goodSub, r := subscribe("hook-good", good.URL+"/hook")
	if r.Status != http.StatusCreated || goodSub.Secret == "" {
		t.Fatalf("create: %d %s, want 201 with the secret", r.Status, r.Body)
	}
	good.SetSecrets([]string{goodSub.Secret})
	hostileSub, _ := subscribe("hook-hostile", hostile.URL+"/hook")
	loopSub, _ := subscribe("hook-loopback", fmt.Sprintf("http://[::1]:%d/hook", FreePort()))

	// Shown once: a replay of the creating request, before and after a
	// rotation, has no secret.
	if s, r := subscribe("hook-good", good.URL+"/hook"); r.Status != http.StatusOK || s.Secret != "" || strings.Contains(string(r.Body), "whsec_") {
		t.Errorf("create replayed: %d %s, want 200 without a secret", r.Status, r.Body)
	}
	r, err = d.client.Do(ctx, "POST", "/v1/webhooks/"+goodSub.ID.String()+"/rotate", "rotate-1", nil)
	var rotated webhooks.Subscription
	if err != nil || r.Status != http.StatusOK || json.Unmarshal(r.Body, &rotated) != nil || rotated.Secret == "" {
		t.Fatalf("rotate: %v %+v", err, r)
	}
	good.SetSecrets([]string{rotated.Secret, goodSub.Secret})
	if s, r := subscribe("hook-good", good.URL+"/hook"); r.Status != http.StatusOK || s.Secret != "" || strings.Contains(string(r.Body), rotated.Secret) {
		t.Errorf("create replayed after a rotation: %d %s, want 200 without the rotated secret", r.Status, r.Body)
	}

	acct := "acc-hostile-tenant"
	if _, _, err := d.client.OpenAccount(ctx, "open-1", acct, "EUR"); err != nil {
		t.Fatal(err)
	}
	if _, _, err := d.client.Deposit(ctx, "dep-1", acct, 100); err != nil {
		t.Fatal(err)
	}

	want := map[string]struct{ status, lastError string }{
		goodSub.ID.String():    {"delivered", ""},
		hostileSub.ID.String(): {"dead", "http 500"},
		loopSub.ID.String():    {"dead", webhooks.CategoryAddressNotAllowed},
	}
	pipelinetest.Eventually(t, 60*time.Second, func() error {
		for id, w := range want {
			r, err := d.client.Do(ctx, "GET", "/v1/webhooks/"+id+"/deliveries", "", nil)
			if err != nil {
				return err
			}
			var got struct{ Deliveries []webhooks.Delivery }
			if err := json.Unmarshal(r.Body, &got); err != nil || len(got.Deliveries) != 1 {
				return fmt.Errorf("deliveries of %s: %d %s", id, r.Status, r.Body)
			}
			dl := got.Deliveries[0]
			last := ""
			if dl.LastError != nil {
				last = *dl.LastError
			}
			if dl.Status != w.status || last != w.lastError {
				return fmt.Errorf("delivery to %s: %s, last error %q; want %s, %q", id, dl.Status, last, w.status, w.lastError)
			}
		}
		return nil
	})
	if good.Effects() != 1 || len(good.Bad()) > 0 {
		t.Errorf("the good receiver applied %d effects (refused %v), want 1", good.Effects(), good.Bad())
	}
	// The projector wrote one event row and one fan-out job for the
	// deposit, whatever the subscriptions; the worker's fan-out the three
	// deliveries.
	var events, fanouts int
	if err := d.pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM webhook_events WHERE expanded_at IS NOT NULL),
		(SELECT count(*) FROM river_job WHERE kind = 'webhook_fanout')`).Scan(&events, &fanouts); err != nil || events != 1 || fanouts != 1 {
		t.Errorf("fanned-out event rows %d, fan-out jobs %d (%v), want one each", events, fanouts, err)
	}

	// The operator's side: the transport's text, printable, in each job's
	// errors (onceflow jobs list) and in the worker's log, which has one
	// failure a second at most (the others counted in failures_not_logged:
	// the fan-out makes the three deliveries at once).
	log := worker.Tail(500)
	if !strings.Contains(log, "::1") && !strings.Contains(log, "upstream 10.20.30.40 refused") {
		t.Errorf("the worker's log lacks the transport's text of the failures:\n%s", log)
	}
	out, err := runCLI(ctx, d.Pipeline, "jobs", "list")
	if err != nil {
		t.Fatalf("onceflow jobs list: %v\n%s", err, out)
	}
	if !strings.Contains(out, "::1") || !strings.Contains(out, "upstream 10.20.30.40 refused") {
		t.Errorf("onceflow jobs list lacks the transport's text of the failures:\n%s", out)
	}
	for name, text := range map[string]string{"the worker's log": log, "onceflow jobs list": out} {
		if strings.ContainsFunc(text, func(r rune) bool {
			return r != '\n' && r != '\t' && (unicode.IsControl(r) || unicode.Is(unicode.Cf, r))
		}) {
			t.Errorf("%s holds a control character of the receiver's answer:\n%q", name, text)
		}
	}
}

// forwardedFor is a transport that sends every request as a proxy would
// forward it from addr.
type forwardedFor string

func (a forwardedFor) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("X-Forwarded-For", string(a))
	return http.DefaultTransport.RoundTrip(r)
}

// Hostile clients at ingest, on real processes: an ingest restarted behind
// its proxy (the test, at 127.0.0.1) meets a flood of made-up keys from
// five hundred addresses at once, and the tenant's client, from its own
// address, is served from its first request after the restart; and an
// ingest whose inbound provider would read the aggregate from a header
// the provider's signature does not cover refuses to start, saying so.
func TestHostileClientsAtIngest(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	d := deployWith(t, ctx, map[string]string{"ONCEFLOW_TRUSTED_PROXIES": "127.0.0.1/32"})
	good := &ledgerapp.Client{Client: &apiclient.Client{BaseURL: d.client.BaseURL, APIKey: d.client.APIKey,
		HTTP: &http.Client{Timeout: 10 * time.Second, Transport: forwardedFor("203.0.113.5")}}}
	if _, _, err := good.OpenAccount(ctx, "open-1", "acc-flood", "EUR"); err != nil {
		t.Fatal(err)
	}
	if err := d.comps["ingest"].Stop(10 * time.Second); err != nil {
		t.Fatal(err)
	}
	restarted, err := d.StartComponent(ctx, "ingest", "ingest-restarted", nil)
	if err != nil {
		t.Fatal(err)
	}
	good.BaseURL = restarted.HTTP

	stop := make(chan struct{})
	var wg sync.WaitGroup
	var mu sync.Mutex
	codes := map[int]int{}
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				c := &apiclient.Client{BaseURL: restarted.HTTP, APIKey: ingest.NewAPIKey(),
					HTTP: &http.Client{Timeout: 10 * time.Second, Transport: forwardedFor(fmt.Sprintf("198.18.%d.%d", g, i%60+1))}}
				r, err := c.Do(ctx, "GET", "/v1/accounts/acc-flood", "", nil)
				if err != nil {
					continue
				}
				mu.Lock()
				codes[r.Status]++
				mu.Unlock()
			}
		}()
	}
	for i := range 20 {
		if _, _, err := good.Deposit(ctx, fmt.Sprint("dep-", i), "acc-flood", 1); err != nil {
			t.Errorf("the tenant's deposit %d during the flood: %v", i, err)
		}
	}
	close(stop)
	wg.Wait()
	if codes[http.StatusOK] > 0 {
		t.Errorf("made-up keys were served: %v", codes)
	}
	t.Logf("the flood was answered %v", codes)

	dir := t.TempDir()
	cfg := filepath.Join(dir, "providers.json")
	unsigned := strings.Replace(inboundProviders, `"aggregate_id": "/data/account_id"`, `"aggregate_id": "header:X-Account"`, 1)
	if err := os.WriteFile(cfg, []byte(unsigned), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err = d.StartComponent(ctx, "ingest", "ingest-unsigned", map[string]string{"ONCEFLOW_INBOUND_CONFIG": cfg, "PAYMENTS_SECRETS": inboundSecret})
	want := `aggregate_id "header:X-Account": the standard-webhooks signature does not cover that header`
	if err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("ingest with a provider reading the aggregate from an unsigned header: %v; want it to refuse to start, saying %s", err, want)
	}
}
