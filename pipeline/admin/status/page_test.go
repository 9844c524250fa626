package status_test

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/onceflow/onceflow/pipeline/admin"
	"github.com/onceflow/onceflow/pipeline/admin/status"
	"github.com/onceflow/onceflow/pipeline/admin/status/statustest"
	"github.com/onceflow/onceflow/pipeline/pipelinetest"
)

// server is an admin server with the page, over a real database, with
// the operator token given ("" disables the actions).
func server(t *testing.T, token string) (*httptest.Server, *status.Page, *prometheus.Registry, context.Context) {
	t.Helper()
	pool, _ := pipelinetest.Pool(t)
	reg := admin.NewRegistry()
	adm := admin.New("", reg, slog.New(slog.DiscardHandler))
	adm.SetToken(token)
	page, err := status.New(status.Config{Gatherer: reg, Pool: pool, Components: []string{"projector"}, Interval: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	page.Register(adm)
	srv := httptest.NewServer(adm.Handler())
	t.Cleanup(srv.Close)
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `INSERT INTO projector_parked (consumer, topic, partition, next_offset, reason, detail)
		VALUES ('proj', 'ledger.events', 3, 42, 'version-gap', 'SECRET-DETAIL acme/acc-1')`); err != nil {
		t.Fatal(err)
	}
	return srv, page, reg, ctx
}

func post(t *testing.T, url, auth, body string) (int, string) {
	t.Helper()
	r := postResp(t, url, auth, body)
	return r.code, r.body
}

type answer struct {
	code              int
	contentType, body string
}

func postResp(t *testing.T, url, auth, body string) answer {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	if auth != "" {
		req.Header.Set("Authorization", auth)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return answer{resp.StatusCode, resp.Header.Get("Content-Type"), string(b)}
}

// Without ONCEFLOW_ADMIN_TOKEN the page says its actions are disabled and
// offers none (the unpark button is there, disabled), and the action
// itself answers 403. It loads nothing but what the admin server serves,
// and shows a parked partition without its detail.
func TestPageSaysActionsAreDisabled(t *testing.T) {
	t.Parallel()
	tab := statustest.Browser(t)
	srv, _, _, _ := server(t, "")

	statustest.Open(t, tab, srv.URL+"/status")
	got, err := statustest.Texts(tab, map[string]string{
		"note":   "#actions-note",
		"reason": `#parked-table tr[data-consumer="proj"][data-partition="3"] .reason`,
		"page":   "body",
	})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(got["note"], "Actions are disabled: this process has no ONCEFLOW_ADMIN_TOKEN") {
		t.Errorf("the page's note: %q, want it to say the actions are disabled", got["note"])
	}
	if got["reason"] != "version-gap" {
		t.Errorf("the parked partition's reason on the page: %q, want version-gap", got["reason"])
	}
	if strings.Contains(got["page"], "SECRET-DETAIL") {
		t.Error("the page shows a parked partition's detail")
	}
	disabled, err := chromedp.Run(tab, chromedp.Evaluate[bool](`document.querySelector('#parked-table button.unpark').disabled`))
	if err != nil || !disabled {
		t.Errorf("the unpark button is enabled without a token (%v)", err)
	}
	// A click on a disabled button opens no confirmation.
	if err := statustest.Do(tab, chromedp.Click(chromedp.CSS("#parked-table button.unpark"))); err != nil {
		t.Fatal(err)
	}
	if open, _ := chromedp.Run(tab, chromedp.Evaluate[bool](`document.querySelector('#confirm').open`)); open {
		t.Error("a disabled action opened its confirmation")
	}
	others, err := chromedp.Run(tab, chromedp.Evaluate[[]string](
		`performance.getEntriesByType('resource').map((e) => e.name).filter((n) => !n.startsWith(location.origin + '/'))`))
	if err != nil || len(others) > 0 {
		t.Errorf("the page loaded from elsewhere than the admin server: %q (%v)", others, err)
	}

	code, body := post(t, srv.URL+"/status/unpark", "Bearer anything", `{"consumer":"proj","topic":"ledger.events","partition":3}`)
	if code != http.StatusForbidden || !strings.Contains(body, "ONCEFLOW_ADMIN_TOKEN") {
		t.Errorf("unpark without a token configured: %d %q, want 403 naming ONCEFLOW_ADMIN_TOKEN", code, body)
	}
}

// The actions check what they are asked before acting: a partition that
// is not parked, a body that is not theirs, a topic that is not a DLQ of
// the deployment, a skip where no processor runs, a request without the
// token; each refusal is a problem (RFC 9457, application/problem+json)
// of its own type, as the tenants' API answers. With the token, an
// unpark removes the row.
func TestActionsCheckTheirRequest(t *testing.T) {
	t.Parallel()
	srv, page, _, ctx := server(t, "op-token")
	const auth = "Bearer op-token"
	const skip = `{"topic":"ledger.commands","partition":0,"offset":7,"note":"zeros","operator":"alice"}`
	for _, tc := range []struct {
		path, auth, body string
		want             int
		problem          string // the problem's type after https://onceflow.dev/problems/
	}{
		{"/status/unpark", auth, `{"consumer":"proj","topic":"ledger.events","partition":4}`, http.StatusNotFound, "not-parked"},
		{"/status/unpark", auth, `{"consumer":"proj","topic":"ledger.events"}`, http.StatusBadRequest, "invalid-action"},
		{"/status/unpark", auth, `{"consumer":"proj","topic":"ledger.events","partition":3,"all":true}`, http.StatusBadRequest, "invalid-action"},
		{"/status/unpark", auth, `not json`, http.StatusBadRequest, "invalid-action"},
		{"/status/redrive", auth, `{"topic":"ledger.commands","reason":"undecodable"}`, http.StatusBadRequest, "invalid-action"},
		{"/status/skip-batch", auth, `{"topic":"ledger.commands","partition":0,"offset":7}`, http.StatusBadRequest, "invalid-action"},
		{"/status/skip-batch", auth, skip, http.StatusConflict, "no-processor"},
		{"/status/skip-batch", "Bearer wrong", skip, http.StatusUnauthorized, "admin-unauthorized"},
		{"/status/skip-batch", "", skip, http.StatusUnauthorized, "admin-unauthorized"},
		{"/status/unpark", auth, `{"consumer":"proj","topic":"ledger.events","partition":3}`, http.StatusOK, ""},
		{"/status/unpark", auth, `{"consumer":"proj","topic":"ledger.events","partition":3}`, http.StatusNotFound, "not-parked"}, // done already
	} {
		resp := postResp(t, srv.URL+tc.path, tc.auth, tc.body)
		if resp.code != tc.want {
			t.Errorf("POST %s %s: %d %s, want %d", tc.path, tc.body, resp.code, resp.body, tc.want)
			continue
		}
		if tc.problem == "" {
			continue
		}
		var p struct {
			Type, Title, Detail string
			Status              int
		}
		if err := json.Unmarshal([]byte(resp.body), &p); err != nil || resp.contentType != "application/problem+json" ||
			p.Type != "https://onceflow.dev/problems/"+tc.problem || p.Status != tc.want || p.Title != http.StatusText(tc.want) || p.Detail == "" {
			t.Errorf("POST %s %s: %s %s (%v), want a problem+json of type %s", tc.path, tc.body, resp.contentType, resp.body, err, tc.problem)
		}
	}
	st := page.Build(ctx)
	if len(st.Parked.Partitions) != 0 {
		t.Errorf("after the unpark the page lists %+v parked", st.Parked.Partitions)
	}
	b, _ := json.Marshal(st)
	if strings.Contains(string(b), "op-token") {
		t.Error("/status.json carries the token")
	}
}

// A source that cannot be read is named in the answer and logged once
// while it fails, not at every poll; its error's text is not in the
// answer.
func TestUnreadableSourceIsLoggedOnce(t *testing.T) {
	t.Parallel()
	pool, _ := pipelinetest.Pool(t)
	pool.Close()
	var logs strings.Builder
	page, err := status.New(status.Config{Gatherer: prometheus.NewRegistry(), Pool: pool,
		Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	var st status.Status
	for range 3 {
		st = page.Build(context.Background())
	}
	if got := strings.Join(st.Unavailable, ", "); got != "parked partitions, retrying partitions" {
		t.Errorf("unavailable: %q, want the parked and retrying partitions", got)
	}
	if n := strings.Count(logs.String(), "status page: cannot read"); n != 2 {
		t.Errorf("3 builds logged %d failures, want 2 (one per source):\n%s", n, logs.String())
	}
	b, _ := json.Marshal(st)
	if strings.Contains(string(b), "closed") {
		t.Errorf("the answer carries an error's text: %s", b)
	}
}

// A stage is there when the process exports any of its metrics; then a
// vector of it with no series yet (no record sent to the DLQ) is zero.
// The stages of components the process does not run are not there.
func TestStageOfTheProcess(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	batch := prometheus.NewHistogram(prometheus.HistogramOpts{Name: "onceflow_processor_batch_duration_seconds"})
	dlq := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "onceflow_dlq_records_total"}, []string{"reason"})
	reg.MustRegister(batch, dlq)
	batch.Observe(0.01)
	page, err := status.New(status.Config{Gatherer: reg})
	if err != nil {
		t.Fatal(err)
	}
	page.Sample()
	st := page.Build(context.Background())
	present := map[string]bool{}
	for _, s := range st.Flow {
		present[s.Name] = s.Present
		if s.Name != "processor" {
			continue
		}
		for _, r := range s.Rates {
			if r.Metric == "onceflow_dlq_records_total" && (r.Total != 0 || r.PerSecond == nil || *r.PerSecond != 0) {
				t.Errorf("the DLQ's rate with no record yet: %+v, want 0 and 0/s", r)
			}
		}
		if len(s.Rates) != 3 || len(s.Latencies) != 3 {
			t.Errorf("processor stage: %d rates and %d latencies, want every one of the table's (3, 3)", len(s.Rates), len(s.Latencies))
		}
	}
	if !present["processor"] || present["ingest"] || present["relay"] || present["projector"] {
		t.Errorf("stages present: %v, want the processor only", present)
	}
	if _, drawn := present["natsink"]; drawn {
		t.Errorf("the NATS sink's stage is drawn in a process without it: %v; an optional stage is left out", present)
	}
	if st.DLQ.Sent == nil || len(st.DLQ.Sent) != 0 {
		t.Errorf("DLQ sent by a processor with none yet: %#v, want an empty list", st.DLQ.Sent)
	}
	if st.Outbox != nil || st.Lag.Exported || st.Parked.Read {
		t.Errorf("a process without relay, lag or database shows %+v, %+v, %+v", st.Outbox, st.Lag, st.Parked)
	}
}

// A worker alone (cmd/worker) has its own stage: webhook deliveries and
// job attempts broken down by outcome, dead jobs by reason; no other
// stage is drawn as in the process.
func TestWorkerStage(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	deliveries := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "onceflow_webhooks_deliveries_total"}, []string{"outcome"})
	latency := prometheus.NewHistogram(prometheus.HistogramOpts{Name: "onceflow_webhooks_delivery_latency_seconds"})
	reg.MustRegister(deliveries, latency)
	deliveries.WithLabelValues("delivered").Add(3)
	deliveries.WithLabelValues("failed").Inc()
	latency.Observe(0.02)
	page, err := status.New(status.Config{Gatherer: reg})
	if err != nil {
		t.Fatal(err)
	}
	page.Sample()
	st := page.Build(context.Background())
	var worker *status.StageStatus
	for i, s := range st.Flow {
		if s.Name == "worker" {
			worker = &st.Flow[i]
		} else if s.Present {
			t.Errorf("stage %s present in a worker alone", s.Name)
		}
	}
	if worker == nil || !worker.Present {
		t.Fatalf("no worker stage: %+v", st.Flow)
	}
	by := map[string]float64{}
	for _, r := range worker.Rates {
		if r.Metric != "onceflow_webhooks_deliveries_total" {
			continue
		}
		if r.Total != 4 {
			t.Errorf("deliveries: %v, want 4", r.Total)
		}
		for _, b := range r.By {
			by[b.Value] = b.Total
		}
	}
	if by["delivered"] != 3 || by["failed"] != 1 {
		t.Errorf("deliveries by outcome: %v, want delivered 3, failed 1", by)
	}
	if l := worker.Latencies[0]; l.Metric != "onceflow_webhooks_delivery_latency_seconds" || l.Total != 1 {
		t.Errorf("the worker's first latency: %+v, want the delivery latency with one observation", l)
	}
}

// A NATS sink (cmd/natsink) has its stage: events JetStream stored, the
// duplicates it dropped, failed publishes by class, and the age of an
// event when JetStream acknowledged it.
func TestNATSinkStage(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	published := prometheus.NewCounter(prometheus.CounterOpts{Name: "onceflow_natsink_events_published_total"})
	duplicates := prometheus.NewCounter(prometheus.CounterOpts{Name: "onceflow_natsink_duplicates_total"})
	errs := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "onceflow_natsink_publish_errors_total"}, []string{"class"})
	age := prometheus.NewHistogram(prometheus.HistogramOpts{Name: "onceflow_natsink_event_age_seconds"})
	info := prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "onceflow_natsink_stream_info"}, []string{"stream", "storage", "replicas"})
	reg.MustRegister(published, duplicates, errs, age, info)
	info.WithLabelValues("ledger_events", "file", "3").Set(1)
	published.Add(40)
	duplicates.Add(3)
	errs.WithLabelValues("unavailable").Add(2)
	age.Observe(0.05)
	page, err := status.New(status.Config{Gatherer: reg})
	if err != nil {
		t.Fatal(err)
	}
	page.Sample()
	st := page.Build(context.Background())
	var sink *status.StageStatus
	for i, s := range st.Flow {
		if s.Name == "natsink" {
			sink = &st.Flow[i]
		} else if s.Present {
			t.Errorf("stage %s present in a NATS sink alone", s.Name)
		}
	}
	if sink == nil || !sink.Present {
		t.Fatalf("no natsink stage: %+v", st.Flow)
	}
	totals := map[string]float64{}
	var byClass []status.LabelRate
	for _, r := range sink.Rates {
		totals[r.Metric] = r.Total
		if r.Metric == "onceflow_natsink_publish_errors_total" {
			byClass = r.By
		}
	}
	if totals["onceflow_natsink_events_published_total"] != 40 || totals["onceflow_natsink_duplicates_total"] != 3 ||
		totals["onceflow_natsink_publish_errors_total"] != 2 || totals["onceflow_natsink_out_of_order_total"] != 0 {
		t.Errorf("natsink totals %v, want 40 published, 3 duplicates, 2 errors, 0 out of order", totals)
	}
	if len(byClass) != 1 || byClass[0].Value != "unavailable" || byClass[0].Total != 2 {
		t.Errorf("publish errors by class: %+v, want unavailable 2", byClass)
	}
	if l := sink.Latencies[0]; l.Metric != "onceflow_natsink_event_age_seconds" || l.Total != 1 {
		t.Errorf("the sink's first latency: %+v, want the event age with one observation", l)
	}
	// The stream it writes to, which must keep what it acknowledged.
	if len(sink.Facts) != 1 || sink.Facts[0].Value != "ledger_events, file storage, replicas 3" {
		t.Errorf("the sink's facts: %+v, want its stream with its storage and replicas", sink.Facts)
	}
}

// /status is drawn on the server first: curl (or a browser without
// JavaScript, or a screenshot before the script ran) sees the figures —
// a stage's counter, the parked partition without its detail — and the
// page still loads nothing but what the admin server serves.
func TestFirstPaintFromTheServer(t *testing.T) {
	t.Parallel()
	srv, page, reg, _ := server(t, "")
	applied := prometheus.NewCounter(prometheus.CounterOpts{Name: "onceflow_projector_events_applied_total"})
	reg.MustRegister(applied)
	applied.Add(1234)
	page.Sample()
	resp, err := http.Get(srv.URL + "/status")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	html := string(b)
	for _, want := range []string{`data-stage="projector"`, ">1234<", "ledger.events", "version-gap", "components: projector", `src="/status/app.js"`} {
		if !strings.Contains(html, want) {
			t.Errorf("/status drawn on the server lacks %q:\n%s", want, html)
		}
	}
	for _, not := range []string{"{{", "SECRET-DETAIL", "loading /status.json"} {
		if strings.Contains(html, not) {
			t.Errorf("/status has %q", not)
		}
	}
	if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "text/html") || resp.Header.Get("Content-Security-Policy") == "" {
		t.Errorf("/status: Content-Type %q, CSP %q", ct, resp.Header.Get("Content-Security-Policy"))
	}
	if r, err := http.Get(srv.URL + "/status/index.html"); err != nil || r.StatusCode != http.StatusNotFound {
		t.Errorf("the template itself is served: %v %v", r.StatusCode, err)
	}
}
