package onceflow_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
	"golang.org/x/sync/errgroup"

	"github.com/onceflow/onceflow/examples/ledger/ledgerapp"
	"github.com/onceflow/onceflow/pipeline/apiclient"
	"github.com/onceflow/onceflow/pipeline/tracing"
)

// BenchmarkTracing measures what tracing costs the pipeline in a closed
// loop (docs/benchmarks.md#tracing-what-spans-cost-a-closed-loop): 8
// clients, each sending a deposit to its own account and waiting for its
// outcome (?wait=) before the next,
// on onceflow dev (embedded broker, real Postgres, one partition) with a
// webhook subscription to every deposit (a delivery per command), in three
// stacks running side by side:
//
//   - off: no tracer provider, what runs without
//     OTEL_EXPORTER_OTLP_ENDPOINT: no instrumentation installed;
//   - noop: every instrumentation installed on OpenTelemetry's no-op
//     provider (a span started and dropped at each point);
//   - on: the SDK, every command sampled, spans batched to an exporter
//     that drops them (the cost of making them, not of sending them).
//
// The stacks take turns, a window of windowCommands each, rounds times,
// so a change of the machine's load falls on all three. off differs from
// no instrumentation at all by the checks the code makes when it has no
// provider; "off-path" measures them in this process, per command, as a
// share of off's time per command.
func BenchmarkTracing(b *testing.B) {
	const (
		clients        = 8
		windowCommands = 800
		rounds         = 3
	)
	var delivered sync.Map
	receiver := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		delivered.Store(r.Header.Get("webhook-id"), true)
	}))
	defer receiver.Close()

	on := sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.AlwaysSample()), sdktrace.WithBatcher(tracetest.NewNoopExporter()))
	defer on.Shutdown(context.Background())
	modes := []struct {
		name string
		tp   trace.TracerProvider
	}{{"off", nil}, {"noop", noop.NewTracerProvider()}, {"on", on}}

	ctx := context.Background()
	apis := make([]ledgerapp.Client, len(modes))
	for i, m := range modes {
		url, key, _ := tracedDev(b, m.tp)
		apis[i] = ledgerapp.Client{Client: &apiclient.Client{BaseURL: url, APIKey: key}}
		resp, err := apis[i].Do(ctx, http.MethodPost, "/v1/webhooks", "sub", []byte(fmt.Sprintf(`{"url":%q,"event_types":["Deposited"]}`, receiver.URL)))
		if err != nil || resp.Status != http.StatusCreated {
			b.Fatalf("%s: subscribe: %v %v", m.name, resp, err)
		}
		for c := range clients {
			a, _, err := apis[i].OpenAccount(ctx, fmt.Sprintf("open-%d", c), fmt.Sprintf("acc-%d", c), "EUR")
			if err != nil {
				b.Fatal(err)
			}
			if _, err := apis[i].WaitCommand(ctx, a.CommandID); err != nil {
				b.Fatal(err)
			}
		}
	}
	spent := make([]time.Duration, len(modes))
	sent := make([]int, len(modes))
	b.ResetTimer()
	for range b.N {
		for r := range rounds {
			for i := range modes {
				start := time.Now()
				g, gctx := errgroup.WithContext(ctx)
				for c := range clients {
					g.Go(func() error {
						for n := range windowCommands / clients {
							key := fmt.Sprintf("dep-%d-%d-%d-%d", sent[i], r, c, n)
							a, _, err := apis[i].Deposit(gctx, key, fmt.Sprintf("acc-%d", c), 1)
							if err != nil {
								return err
							}
							if cmd, err := apis[i].WaitCommand(gctx, a.CommandID); err != nil || cmd.Status != "accepted" {
								return fmt.Errorf("%s: %v %v", key, cmd.Status, err)
							}
						}
						return nil
					})
				}
				if err := g.Wait(); err != nil {
					b.Fatalf("%s: %v", modes[i].name, err)
				}
				spent[i] += time.Since(start)
				sent[i] += windowCommands / clients * clients
			}
		}
	}
	b.StopTimer()
	perCommand := make([]float64, len(modes)) // µs
	for i, m := range modes {
		rate := float64(sent[i]) / spent[i].Seconds()
		perCommand[i] = spent[i].Seconds() * 1e6 / float64(sent[i])
		b.ReportMetric(rate, m.name+"-commands/s")
	}
	for i := 1; i < len(modes); i++ {
		b.ReportMetric(100*(perCommand[i]/perCommand[0]-1), modes[i].name+"-overhead-%")
	}
	off := offPath()
	b.ReportMetric(off, "off-path-ns/command")
	b.ReportMetric(100*off/(perCommand[0]*1000), "off-path-%")
	b.ReportMetric(0, "ns/op") // the op is a round of windows; its time says nothing
	n := 0
	delivered.Range(func(any, any) bool { n++; return true })
	if want := sent[0] + sent[1] + sent[2]; n < want/2 {
		b.Errorf("%d deliveries for %d deposits: the worker did not keep up", n, want)
	}
}

// offPath is the time in ns the code spends per command on tracing when
// it has no provider: the checks at each stage (ingest, the relay, the
// processor, the projector), and a delivery's job metadata, its attempt's
// metadata read and its request's traceparent (none).
func offPath() float64 {
	var t tracing.Tracer
	ctx := context.Background()
	req, _ := http.NewRequest(http.MethodPost, "http://127.0.0.1/", strings.NewReader(""))
	const n = 200_000
	start := time.Now()
	for range n {
		for range 4 {
			_, span := t.Child(ctx, "x")
			span.End()
		}
		tracing.Propagator.Inject(ctx, propagation.HeaderCarrier(req.Header))
		_ = tracing.WithTraceparent(ctx, "")
	}
	return float64(time.Since(start).Nanoseconds()) / n
}
