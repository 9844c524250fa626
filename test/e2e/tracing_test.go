package e2e

import (
	"bytes"
	"compress/gzip"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	collectortrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"google.golang.org/protobuf/proto"

	"github.com/onceflow/onceflow/examples/ledger/ledgerapp"
	"github.com/onceflow/onceflow/pipeline/apiclient"
	"github.com/onceflow/onceflow/pipeline/ingest"
	"github.com/onceflow/onceflow/pipeline/pipelinetest"
)

// otlpReceiver is an OTLP/HTTP collector on loopback: it records every
// request and decodes the spans of each export (a POST to /v1/traces, or
// to another path ending in /traces).
type otlpReceiver struct {
	*httptest.Server
	mu       sync.Mutex
	requests []string // "POST /v1/traces", one per request
	spans    []receivedSpan
	errs     []error
}

// receivedSpan is one exported span with the service that sent it and
// the path it was posted to.
type receivedSpan struct {
	service, name, path string
	traceID             string
	attrs               map[string]string
}

func newOTLPReceiver(t *testing.T) *otlpReceiver {
	t.Helper()
	r := &otlpReceiver{}
	r.Server = httptest.NewServer(http.HandlerFunc(r.serve)) // 127.0.0.1
	t.Cleanup(r.Close)
	return r
}

func (r *otlpReceiver) serve(w http.ResponseWriter, req *http.Request) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.requests = append(r.requests, req.Method+" "+req.URL.Path)
	var body io.Reader = req.Body
	if req.Header.Get("Content-Encoding") == "gzip" {
		zr, err := gzip.NewReader(req.Body)
		if err != nil {
			r.errs = append(r.errs, err)
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		body = zr
	}
	b, err := io.ReadAll(body)
	var export collectortrace.ExportTraceServiceRequest
	if err == nil {
		err = proto.Unmarshal(b, &export)
	}
	if err != nil || req.Method != http.MethodPost || !strings.HasSuffix(req.URL.Path, "/traces") || req.Header.Get("Content-Type") != "application/x-protobuf" {
		r.errs = append(r.errs, fmt.Errorf("%s %s (%s): %v", req.Method, req.URL.Path, req.Header.Get("Content-Type"), err))
		http.Error(w, "not an OTLP/HTTP protobuf export", http.StatusBadRequest)
		return
	}
	for _, rs := range export.GetResourceSpans() {
		service := ""
		for _, kv := range rs.GetResource().GetAttributes() {
			if kv.GetKey() == "service.name" {
				service = kv.GetValue().GetStringValue()
			}
		}
		for _, ss := range rs.GetScopeSpans() {
			for _, s := range ss.GetSpans() {
				attrs := map[string]string{}
				for _, kv := range s.GetAttributes() {
					attrs[kv.GetKey()] = kv.GetValue().GetStringValue()
				}
				r.spans = append(r.spans, receivedSpan{service: service, name: s.GetName(), path: req.URL.Path, traceID: fmt.Sprintf("%x", s.GetTraceId()), attrs: attrs})
			}
		}
	}
	w.Header().Set("Content-Type", "application/x-protobuf")
	out, _ := proto.Marshal(&collectortrace.ExportTraceServiceResponse{})
	w.Write(out)
}

// received returns the requests and spans so far, and the requests that
// were not OTLP exports.
func (r *otlpReceiver) received() (requests []string, spans []receivedSpan, errs []error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.requests), slices.Clone(r.spans), slices.Clone(r.errs)
}

// openAccounts sends n commands through ingest's API and waits until
// each has its outcome (the projector has applied its event); it returns
// their command ids.
func openAccounts(t *testing.T, ctx context.Context, c *ledgerapp.Client, n int) []string {
	t.Helper()
	var ids []string
	for i := range n {
		acc, _, err := c.OpenAccount(ctx, fmt.Sprintf("open-%d", i), fmt.Sprintf("acc-%d", i), "EUR")
		if err != nil {
			t.Fatalf("open acc-%d: %v", i, err)
		}
		ids = append(ids, acc.CommandID)
	}
	for _, id := range ids {
		cmd, err := c.WaitCommand(ctx, id)
		if err != nil || cmd.Status != "accepted" {
			t.Fatalf("command %s: %+v, %v", id, cmd, err)
		}
	}
	return ids
}

// checkCommandTraces checks that each command's spans reached the
// receiver in one trace, from each stage of its way, each sent under the
// service the stage's process names (service(span's stage)), to the path
// path(stage).
func checkCommandTraces(t *testing.T, r *otlpReceiver, prefix string, commandIDs []string, service, path func(stage string) string) {
	t.Helper()
	requests, spans, errs := r.received()
	for _, err := range errs {
		t.Errorf("the receiver got a request that is not an OTLP export: %v", err)
	}
	if len(requests) == 0 {
		t.Fatal("the receiver got no request")
	}
	t.Logf("%d spans in %d requests: %s", len(spans), len(requests), summary(spans))
	stages := []struct{ stage, span string }{
		{"ingest", "POST /v1/accounts"},
		{"ingest", "onceflow.ingest.outbox_insert"},
		{"relay", prefix + ".commands publish"},
		{"processor", prefix + ".commands receive"},
		{"processor", "onceflow.processor.decide"},
		{"processor", prefix + ".events publish"},
		{"projector", prefix + ".events receive"},
		{"projector", "onceflow.projector.apply"},
	}
	for _, id := range commandIDs {
		traceID := ""
		for _, s := range spans {
			if s.name == "onceflow.ingest.outbox_insert" && s.attrs["onceflow.command_id"] == id {
				traceID = s.traceID
			}
		}
		if traceID == "" {
			t.Errorf("command %s: no onceflow.ingest.outbox_insert span names it; %d spans received in %d requests: %s", id, len(spans), len(requests), summary(spans))
			continue
		}
		have := map[[3]string]bool{}
		for _, s := range spans {
			if s.traceID == traceID {
				have[[3]string{s.service, s.name, s.path}] = true
			}
		}
		for _, st := range stages {
			if !have[[3]string{service(st.stage), st.span, path(st.stage)}] {
				t.Errorf("command %s: trace %s has no span %q from service %q posted to %s; it has %v", id, traceID, st.span, service(st.stage), path(st.stage), have)
			}
		}
	}
}

// summary counts spans by service and name.
func summary(spans []receivedSpan) string {
	n := map[string]int{}
	for _, s := range spans {
		n[s.service+" "+s.name]++
	}
	var lines []string
	for k, v := range n {
		lines = append(lines, fmt.Sprintf("%s: %d", k, v))
	}
	sort.Strings(lines)
	return strings.Join(lines, ", ")
}

// The component binaries export their spans to the collector
// OTEL_EXPORTER_OTLP_ENDPOINT names, each under the service
// OTEL_SERVICE_NAME names, as docs/observability.md says a user sets them:
// a command's spans from ingest, the relay, the processor and the
// projector arrive in one trace. The projector is given
// OTEL_EXPORTER_OTLP_TRACES_ENDPOINT alone, a URL its spans go to as it
// is. The batch span processor is told to wait
// ten minutes (OTEL_BSP_SCHEDULE_DELAY), so nothing is exported while the
// processes run; every span arrives at SIGTERM, with the shutdown.
// Before the tracing section was in sectionOrder, no binary read the
// variable and the receiver got nothing.
func TestComponentsExportSpansToOTLPEndpoint(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-process end-to-end test; skipped with -short")
	}
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	receiver := newOTLPReceiver(t)
	pool, url := pipelinetest.Pool(t)
	pl := newPipeline(t, url)
	pl.Env = map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.URL, "OTEL_BSP_SCHEDULE_DELAY": "600000"}
	if _, err := pl.StartBroker(ctx); err != nil {
		t.Fatal(err)
	}
	comps := map[string]*Component{}
	for _, kind := range []string{"ingest", "relay", "processor", "projector"} {
		env := map[string]string{"OTEL_SERVICE_NAME": "onceflow-" + kind}
		if kind == "projector" {
			env["OTEL_EXPORTER_OTLP_ENDPOINT"], env["OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"] = "", receiver.URL+"/projector/traces"
		}
		c, err := pl.StartComponent(ctx, kind, kind, env)
		if err != nil {
			t.Fatal(err)
		}
		comps[kind] = c
	}
	key := ingest.NewAPIKey()
	if err := ingest.CreateAPIKey(ctx, pool, "acme", "e2e", key); err != nil {
		t.Fatal(err)
	}
	client := &ledgerapp.Client{Client: &apiclient.Client{BaseURL: comps["ingest"].HTTP, APIKey: key}}
	ids := openAccounts(t, ctx, client, 5)

	if requests, _, _ := receiver.received(); len(requests) != 0 {
		t.Errorf("the receiver got %d requests before SIGTERM, with OTEL_BSP_SCHEDULE_DELAY at ten minutes: %v", len(requests), requests)
	}
	for kind, c := range comps {
		if err := c.Stop(30 * time.Second); err != nil {
			t.Errorf("%s after SIGTERM: %v\n%s", kind, err, c.Tail(20))
		}
	}
	checkCommandTraces(t, receiver, pl.Prefix, ids, func(stage string) string { return "onceflow-" + stage }, func(stage string) string {
		if stage == "projector" {
			return "/projector/traces"
		}
		return "/v1/traces"
	})
}

// `onceflow dev -otlp-endpoint URL` (the flag, and no other tracing
// setting) exports the spans of every component it runs under the
// service onceflow, and a command's spans make one trace; the last go out
// when SIGTERM stops it. This is the finding's own run
// (findings/otlp-endpoint-ignored.md), where the flag was refused as not
// defined.
func TestDevExportsSpansToOTLPEndpointFlag(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-process end-to-end test; skipped with -short")
	}
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	receiver := newOTLPReceiver(t)
	dir, _ := keptDir(t)
	httpAddr := fmt.Sprintf("127.0.0.1:%d", FreePort())
	admin := fmt.Sprintf("127.0.0.1:%d", FreePort())
	key := ingest.NewAPIKey()
	dev, err := Start(filepath.Join(binDir, "onceflow"), "dev", []string{"dev", "-otlp-endpoint", receiver.URL,
		"-data-dir", filepath.Join(dir, "data"), "-broker-addr", fmt.Sprintf("127.0.0.1:%d", FreePort()), "-registry-addr", fmt.Sprintf("127.0.0.1:%d", FreePort())},
		map[string]string{"DATABASE_URL": pipelinetest.DatabaseURL(t), "HTTP_ADDR": httpAddr, "ADMIN_ADDR": admin, "ONCEFLOW_DEV_API_KEY": key},
		filepath.Join(dir, "dev.log"), "http://"+admin)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("onceflow dev's log:\n%s", dev.Tail(80))
		}
		dev.Kill()
	})
	if err := dev.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	client := &ledgerapp.Client{Client: &apiclient.Client{BaseURL: "http://" + httpAddr, APIKey: key}}
	ids := openAccounts(t, ctx, client, 5)
	if err := dev.Stop(30 * time.Second); err != nil {
		t.Errorf("onceflow dev after SIGTERM: %v", err)
	}
	checkCommandTraces(t, receiver, "ledger", ids, func(string) string { return "onceflow" }, func(string) string { return "/v1/traces" })
}

// Every binary that runs components lists the tracing settings in its -h
// under their heading: each component's binary, and each component and
// dev as commands of the cli.Main binaries (the ledger's onceflow and the
// inventory's).
func TestBinariesListTracing(t *testing.T) {
	t.Parallel()
	runs := [][]string{}
	for _, bin := range []string{"ingest", "relay", "processor", "projector", "worker", "natsink"} {
		runs = append(runs, []string{bin})
	}
	for _, bin := range []string{"onceflow", "inventory"} {
		for _, cmd := range []string{"dev", "ingest", "relay", "processor", "projector", "worker", "natsink"} {
			runs = append(runs, []string{bin, cmd})
		}
	}
	for _, run := range runs {
		args := append(slices.Clone(run[1:]), "-otlp-endpoint", "http://127.0.0.1:4318", "-h")
		cmd := exec.Command(filepath.Join(binDir, run[0]), args...)
		cmd.Env = []string{"PATH=/usr/bin:/bin"}
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := cmd.Run(); err != nil {
			t.Errorf("%v %v: %v\n%s", run[0], args, err, out.String())
			continue
		}
		if !strings.Contains(out.String(), "\nTracing (OpenTelemetry):\n  -otlp-endpoint url\n") {
			t.Errorf("%v -h has no Tracing (OpenTelemetry) section with -otlp-endpoint:\n%s", run, out.String())
		}
	}
}
