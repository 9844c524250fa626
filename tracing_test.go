package onceflow_test

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/onceflow/onceflow"
	"github.com/onceflow/onceflow/onceflowtest"
	"github.com/onceflow/onceflow/pipeline/kafka"
	"github.com/onceflow/onceflow/pipeline/pipelinetest"
	"github.com/onceflow/onceflow/pipeline/webhooks"
)

// One command sent with a client's traceparent, through onceflow dev
// (embedded broker, real Postgres) with an in-memory exporter, makes one
// trace from the client's span to the webhook delivery
// (docs/observability.md): each stage's span the child of the one before,
// each batch's span (a transaction of many commands) in a trace of its own
// linked to the command's span, and the delivery's request carrying the
// traceparent of its own span, the last of the trace.
func TestOneCommandOneTrace(t *testing.T) {
	spans := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
	defer tp.Shutdown(context.Background())

	var mu sync.Mutex
	var delivered []string // the traceparent of each delivery
	receiver := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		delivered = append(delivered, r.Header.Get("traceparent"))
		mu.Unlock()
	}))
	defer receiver.Close()

	api, key, _ := tracedDev(t, tp)
	post := func(path, idemKey, body string, header http.Header) {
		t.Helper()
		req, err := http.NewRequest(http.MethodPost, api+path, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		for k, v := range header {
			req.Header[k] = v
		}
		req.Header.Set("Authorization", "Bearer "+key)
		req.Header.Set("Idempotency-Key", idemKey)
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		var b bytes.Buffer
		b.ReadFrom(resp.Body)
		resp.Body.Close()
		if resp.StatusCode/100 != 2 {
			t.Fatalf("POST %s: %d %s", path, resp.StatusCode, b.String())
		}
	}
	post("/v1/webhooks", "sub-1", fmt.Sprintf(`{"url":%q,"event_types":["AccountOpened"]}`, receiver.URL), nil)

	// The client's span: the trace onceflow continues.
	client := trace.NewSpanContext(trace.SpanContextConfig{
		TraceID: trace.TraceID{0x4b, 0xf9, 0x2f, 0x35, 0x77, 0xb3, 0x4d, 0xa6, 0xa3, 0xce, 0x92, 0x9d, 0x0e, 0x0e, 0x47, 0x36},
		SpanID:  trace.SpanID{0x00, 0xf0, 0x67, 0xaa, 0x0b, 0xa9, 0x02, 0xb7}, TraceFlags: trace.FlagsSampled,
	})
	post("/v1/accounts", "open-1", `{"account_id":"acc-1","currency":"EUR"}`,
		http.Header{"Traceparent": {"00-" + client.TraceID().String() + "-" + client.SpanID().String() + "-01"}})

	// The delivery's spans end after its answer (the attempt's once its
	// outcome is written): wait for them too.
	var got string
	pipelinetest.Eventually(t, 60*time.Second, func() error {
		mu.Lock()
		defer mu.Unlock()
		if len(delivered) == 0 {
			return fmt.Errorf("no delivery yet")
		}
		got = delivered[0]
		for _, s := range spans.Ended() {
			if s.Name() == "river.work/"+webhooks.Kind && s.SpanContext().TraceID() == client.TraceID() {
				return nil
			}
		}
		return fmt.Errorf("the delivery's attempt has not ended")
	})

	var inTrace []sdktrace.ReadOnlySpan
	for _, s := range spans.Ended() {
		if s.SpanContext().TraceID() == client.TraceID() {
			inTrace = append(inTrace, s)
		}
	}
	// childOf returns parent's one child whose name matches.
	childOf := func(parent trace.SpanID, what string, match func(string) bool) sdktrace.ReadOnlySpan {
		t.Helper()
		var found []sdktrace.ReadOnlySpan
		var names []string
		for _, s := range inTrace {
			if s.Parent().SpanID() == parent {
				names = append(names, s.Name())
				if match(s.Name()) {
					found = append(found, s)
				}
			}
		}
		if len(found) != 1 {
			t.Fatalf("%s: %d spans, want 1 (the parent's children: %v; the trace: %s)", what, len(found), names, spanNames(inTrace))
		}
		return found[0]
	}
	is := func(name string) func(string) bool { return func(s string) bool { return s == name } }
	chain := []struct {
		what  string
		match func(string) bool
	}{
		{"otelhttp's server span", is("POST /v1/accounts")},
		{"the outbox insert", is("onceflow.ingest.outbox_insert")},
		{"the relay's produce (kotel)", is("ledger.commands publish")},
		{"the processor's fetch (kotel)", is("ledger.commands receive")},
		{"the decision", is("onceflow.processor.decide")},
		{"the event's produce (kotel)", is("ledger.events publish")},
		{"the projector's fetch (kotel)", is("ledger.events receive")},
		{"the projector's apply", is("onceflow.projector.apply")},
		{"the delivery job's attempt (otelriver)", is("river.work/" + webhooks.Kind)},
		{"the delivery's request (otelhttp)", is("HTTP POST")},
	}
	parent := client.SpanID()
	byName := map[string]sdktrace.ReadOnlySpan{}
	for _, c := range chain {
		s := childOf(parent, c.what, c.match)
		byName[s.Name()] = s
		parent = s.SpanContext().SpanID()
	}
	delivery := byName["HTTP POST"]
	if want := "00-" + client.TraceID().String() + "-" + delivery.SpanContext().SpanID().String() + "-01"; got != want {
		t.Errorf("the delivery's request carried traceparent %q, want %q (its own span's)", got, want)
	}

	// Each batch's span: its own trace, linked to the command's span.
	for batch, linked := range map[string]string{
		"onceflow.ingest.commit":         "onceflow.ingest.outbox_insert",
		"onceflow.relay.transaction":     "onceflow.ingest.outbox_insert",
		"onceflow.processor.transaction": "ledger.commands receive",
		"onceflow.projector.transaction": "ledger.events receive",
	} {
		want := byName[linked].SpanContext()
		n := 0
		for _, s := range spans.Ended() {
			if s.Name() != batch {
				continue
			}
			for _, l := range s.Links() {
				if l.SpanContext.SpanID() == want.SpanID() && l.SpanContext.TraceID() == want.TraceID() {
					n++
					if s.SpanContext().TraceID() == client.TraceID() || s.Parent().IsValid() {
						t.Errorf("%s is in the command's trace or has a parent; want the root of its own, linked", batch)
					}
				}
			}
		}
		if n != 1 {
			t.Errorf("%s: %d spans link to the command's %s, want 1", batch, n, linked)
		}
	}
}

func spanNames(spans []sdktrace.ReadOnlySpan) string {
	var b strings.Builder
	for _, s := range spans {
		fmt.Fprintf(&b, "\n  %s %s <- %s", s.SpanContext().SpanID(), s.Name(), s.Parent().SpanID())
	}
	return b.String()
}

// tracedDev runs onceflow dev with tp (nil: no tracing) and webhooks
// allowed to loopback until the test ends, and returns its API's URL and
// key.
func tracedDev(t testing.TB, tp trace.TracerProvider) (api, key string, stop func()) {
	t.Helper()
	var out pipelinetest.Buffer
	logger := slog.New(slog.NewTextHandler(&out, nil))
	key = "of_trace-test-key-0123456789"
	addrs, stop := onceflowtest.Dev(t, onceflow.DevConfig{
		RunConfig: onceflow.RunConfig{
			Config: onceflow.Config{
				Domains:        ledgerDomains(),
				Kafka:          kafka.Config{Logger: logger},
				Topics:         kafka.Topics{Prefix: "ledger", Partitions: 1},
				DatabaseURL:    pipelinetest.DatabaseURL(t, ledgerMigrations),
				Logger:         logger,
				TracerProvider: tp,
			},
			Webhooks:        webhooks.Config{Allow: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}},
			ShutdownTimeout: 20 * time.Second,
		},
		APIKey: key, Out: &out,
	})
	return "http://" + addrs.HTTP, key, stop
}

// Without a tracer provider no span is made, and a command's traceparent
// still goes on as it came, to the webhook delivery's request
// (docs/observability.md#without-tracing).
func TestTraceparentWithoutTracing(t *testing.T) {
	got := make(chan string, 10)
	receiver := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got <- r.Header.Get("traceparent")
	}))
	defer receiver.Close()
	api, key, _ := tracedDev(t, nil)
	post := func(path, idemKey, body string, header http.Header) {
		t.Helper()
		req, err := http.NewRequest(http.MethodPost, api+path, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		for k, v := range header {
			req.Header[k] = v
		}
		req.Header.Set("Authorization", "Bearer "+key)
		req.Header.Set("Idempotency-Key", idemKey)
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode/100 != 2 {
			t.Fatalf("POST %s: %d", path, resp.StatusCode)
		}
	}
	post("/v1/webhooks", "sub-1", fmt.Sprintf(`{"url":%q,"event_types":["AccountOpened"]}`, receiver.URL), nil)
	const tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	post("/v1/accounts", "open-1", `{"account_id":"acc-1","currency":"EUR"}`, http.Header{"Traceparent": {tp}})
	select {
	case h := <-got:
		if h != tp {
			t.Errorf("the delivery carried traceparent %q, want the client's %q", h, tp)
		}
	case <-time.After(60 * time.Second):
		t.Fatal("no delivery within 60s")
	}
}
