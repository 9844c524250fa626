package otlp

import (
	"context"
	"net/url"
	"strconv"
	"strings"

	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
)

// What a caller must not decide or read through onceflow's spans
// (docs/observability.md, docs/security.md):
//
//   - whether its requests are sampled. A server span's parent comes from
//     the caller's traceparent, and the SDK's parent-based sampler follows
//     the parent's sampled flag: a client could have every request
//     recorded whatever ratio the operator set (the collector's bill), or
//     none of its own. A server span is sampled as a trace of its own
//     would be, by the configured sampler on its trace id; its parent
//     stays its parent. Spans whose parent is onceflow's own (a record's
//     traceparent, set by ingest) follow it, so a command's trace is whole.
//   - the secrets in a URL. A webhook subscriber's URL is often a
//     capability (https://hooks.example/services/T0/B0/XXXX), and
//     otelhttp records the whole of it on a delivery's span: a client
//     span's url.full keeps its scheme and host only.

// sampler is the configured sampler (OTEL_TRACES_SAMPLER, as the SDK reads
// it), with server spans sampled on their own.
type sampler struct{ inner sdktrace.Sampler }

func (s sampler) ShouldSample(p sdktrace.SamplingParameters) sdktrace.SamplingResult {
	if p.Kind == trace.SpanKindServer && trace.SpanContextFromContext(p.ParentContext).IsRemote() {
		p.ParentContext = trace.ContextWithSpanContext(p.ParentContext, trace.SpanContext{})
	}
	return s.inner.ShouldSample(p)
}

func (s sampler) Description() string {
	return "onceflow server spans on their own, else " + s.inner.Description()
}

// configuredSampler reads OTEL_TRACES_SAMPLER and OTEL_TRACES_SAMPLER_ARG
// as the SDK does (its own reading is not exported); default
// parentbased_always_on.
func configuredSampler(getenv func(string) string) sdktrace.Sampler {
	ratio := func() float64 {
		r, err := strconv.ParseFloat(getenv("OTEL_TRACES_SAMPLER_ARG"), 64)
		if err != nil || r < 0 || r > 1 {
			return 1
		}
		return r
	}
	switch strings.TrimSpace(getenv("OTEL_TRACES_SAMPLER")) {
	case "always_on":
		return sdktrace.AlwaysSample()
	case "always_off":
		return sdktrace.NeverSample()
	case "traceidratio":
		return sdktrace.TraceIDRatioBased(ratio())
	case "parentbased_always_off":
		return sdktrace.ParentBased(sdktrace.NeverSample())
	case "parentbased_traceidratio":
		return sdktrace.ParentBased(sdktrace.TraceIDRatioBased(ratio()))
	}
	return sdktrace.ParentBased(sdktrace.AlwaysSample())
}

// urlRedactor keeps only the scheme and host of a client span's url.full.
type urlRedactor struct{}

func (urlRedactor) OnStart(_ context.Context, s sdktrace.ReadWriteSpan) {
	if s.SpanKind() != trace.SpanKindClient {
		return
	}
	for _, kv := range s.Attributes() {
		if kv.Key == "url.full" || kv.Key == "http.url" {
			s.SetAttributes(attribute.String(string(kv.Key), schemeAndHost(kv.Value.AsString())))
		}
	}
}

func (urlRedactor) OnEnd(sdktrace.ReadOnlySpan)      {}
func (urlRedactor) Shutdown(context.Context) error   { return nil }
func (urlRedactor) ForceFlush(context.Context) error { return nil }

func schemeAndHost(raw string) string {
	u, err := url.Parse(raw)
	if err != nil || u.Host == "" {
		return "redacted"
	}
	return u.Scheme + "://" + u.Host
}

// guarded are the provider options that keep a caller from deciding the
// sampling of its requests or reading secrets in URLs off the spans, with
// the sampler getenv configures.
func guarded(getenv func(string) string) []sdktrace.TracerProviderOption {
	return []sdktrace.TracerProviderOption{
		sdktrace.WithSampler(sampler{configuredSampler(getenv)}),
		sdktrace.WithSpanProcessor(urlRedactor{}),
	}
}
