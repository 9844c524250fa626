package otlp

import (
	"context"
	"testing"

	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
)

// A caller decides neither whether its requests are sampled nor what the
// spans say of a capability URL: a server span under a remote parent is
// sampled by the configured sampler on its own (a parent's sampled flag
// under a ratio of 0 does not record it; a parent's unsampled flag under
// always_on does), a consumer span follows its parent (a command's trace
// stays whole), and a client span's url.full keeps its scheme and host.
func TestCallersDecideNeitherSamplingNorWhatURLsSay(t *testing.T) {
	remote := func(sampled bool) context.Context {
		flags := trace.TraceFlags(0)
		if sampled {
			flags = trace.FlagsSampled
		}
		sc := trace.NewSpanContext(trace.SpanContextConfig{TraceID: trace.TraceID{1, 2, 3}, SpanID: trace.SpanID{4}, TraceFlags: flags, Remote: true})
		return trace.ContextWithRemoteSpanContext(context.Background(), sc)
	}
	provider := func(env map[string]string) (*sdktrace.TracerProvider, *tracetest.SpanRecorder) {
		rec := tracetest.NewSpanRecorder()
		tp := sdktrace.NewTracerProvider(append(guarded(func(k string) string { return env[k] }), sdktrace.WithSpanProcessor(rec))...)
		t.Cleanup(func() { tp.Shutdown(context.Background()) })
		return tp, rec
	}
	never := map[string]string{"OTEL_TRACES_SAMPLER": "parentbased_traceidratio", "OTEL_TRACES_SAMPLER_ARG": "0"}
	for _, c := range []struct {
		name    string
		env     map[string]string
		kind    trace.SpanKind
		sampled bool // the caller's flag
		want    bool
	}{
		{"server, caller says sampled, ratio 0", never, trace.SpanKindServer, true, false},
		{"server, caller says not sampled, always on", nil, trace.SpanKindServer, false, true},
		{"consumer, parent sampled, ratio 0", never, trace.SpanKindConsumer, true, true},
		{"consumer, parent not sampled, always on", nil, trace.SpanKindConsumer, false, false},
	} {
		tp, _ := provider(c.env)
		_, span := tp.Tracer("t").Start(remote(c.sampled), "s", trace.WithSpanKind(c.kind))
		if got := span.SpanContext().IsSampled(); got != c.want {
			t.Errorf("%s: sampled %v, want %v", c.name, got, c.want)
		}
		if span.SpanContext().TraceID() != (trace.TraceID{1, 2, 3}) {
			t.Errorf("%s: the span left its caller's trace", c.name)
		}
		span.End()
	}

	tp, rec := provider(nil)
	_, span := tp.Tracer("t").Start(context.Background(), "POST", trace.WithSpanKind(trace.SpanKindClient),
		trace.WithAttributes(attribute.String("url.full", "https://hooks.example.com/services/T0/B0/SECRET?token=x")))
	span.End()
	url := "(none)"
	for _, kv := range rec.Ended()[0].Attributes() {
		if kv.Key == "url.full" {
			url = kv.Value.AsString()
		}
	}
	if url != "https://hooks.example.com" {
		t.Errorf("a client span's url.full: %q, want its scheme and host", url)
	}
}
