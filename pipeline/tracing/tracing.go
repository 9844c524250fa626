// Package tracing holds what onceflow's components share to make
// OpenTelemetry spans (docs/observability.md): the process's tracer
// provider, exported by OTLP or none at all, the W3C traceparent a
// command's records carry, and the two shapes of span the pipeline makes.
//
// A span of one command is a child of the command's trace (Tracer.Child):
// a decision, a projection's apply. A span of a batch of many commands (a
// Kafka or a Postgres transaction) starts a trace of its own and links to
// each command's span (Tracer.Batch): a span has one parent, and a batch
// has many. Neither is made when there is nothing to attach it to, so a
// process without a tracer provider, or a record without a trace, pays no
// span.
//
// The libraries' own instrumentation (kotel for franz-go, otelpgx for pgx,
// otelriver for River) makes spans for every client call, most of them
// outside any command (polls, heartbeats, leases); ChildOnly keeps only
// those inside one.
package tracing

import (
	"context"

	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/embedded"
	"go.opentelemetry.io/otel/trace/noop"
)

// Scope is the instrumentation scope of onceflow's own spans.
const Scope = "github.com/onceflow/onceflow"

// Propagator is how a trace goes from one process to the next: the W3C
// traceparent (and tracestate) header, on HTTP requests, Kafka records and
// River jobs' metadata.
var Propagator propagation.TextMapPropagator = propagation.TraceContext{}

// Tracer makes a component's spans; its zero value makes none.
type Tracer struct {
	t trace.Tracer
}

// New returns the tracer of tp (nil: no spans).
func New(tp trace.TracerProvider) Tracer {
	if tp == nil {
		return Tracer{}
	}
	return Tracer{t: tp.Tracer(Scope)}
}

// On reports whether t makes spans.
func (t Tracer) On() bool { return t.t != nil }

var noSpan = noop.Span{}

// Child starts a span named name as a child of the span ctx carries; when
// ctx carries none (or t makes no spans) it returns ctx and a span that
// records nothing.
func (t Tracer) Child(ctx context.Context, name string, opts ...trace.SpanStartOption) (context.Context, trace.Span) {
	if t.t == nil || ctx == nil || !trace.SpanContextFromContext(ctx).IsValid() {
		return ctx, noSpan
	}
	return t.t.Start(ctx, name, opts...)
}

// Batch starts a span named name for a batch of many commands: the root
// of a trace of its own, linked to each of links (the commands' spans).
// With no link (or when t makes no spans) it returns ctx and a span that
// records nothing.
func (t Tracer) Batch(ctx context.Context, name string, links []trace.Link, opts ...trace.SpanStartOption) (context.Context, trace.Span) {
	if t.t == nil || len(links) == 0 {
		return ctx, noSpan
	}
	return t.t.Start(ctx, name, append(opts, trace.WithNewRoot(), trace.WithLinks(links...))...)
}

// Link appends to links the span ctx carries, if it carries one.
func Link(links []trace.Link, ctx context.Context) []trace.Link {
	if ctx == nil {
		return links
	}
	if sc := trace.SpanContextFromContext(ctx); sc.IsValid() {
		return append(links, trace.Link{SpanContext: sc})
	}
	return links
}

// Links is the spans the contexts of a batch's members carry (ctx of
// each), for Batch; none when t makes no spans.
func Links[T any](t Tracer, members []T, ctx func(T) context.Context) []trace.Link {
	if !t.On() {
		return nil
	}
	var links []trace.Link
	for _, m := range members {
		links = Link(links, ctx(m))
	}
	return links
}

// Traceparent is the W3C traceparent of the span ctx carries, or "".
func Traceparent(ctx context.Context) string {
	c := propagation.MapCarrier{}
	propagation.TraceContext{}.Inject(ctx, c)
	return c["traceparent"]
}

// WithTraceparent returns ctx carrying the remote span tp names (a W3C
// traceparent; ctx as it is when tp is not one).
func WithTraceparent(ctx context.Context, tp string) context.Context {
	if tp == "" {
		return ctx
	}
	return propagation.TraceContext{}.Extract(ctx, propagation.MapCarrier{"traceparent": tp})
}

// ChildOnly wraps tp for a library's instrumentation: its tracers start a
// span only as a child of one, never a trace of their own (a poll, a
// lease's renewal, a snapshot record produced outside any command).
func ChildOnly(tp trace.TracerProvider) trace.TracerProvider {
	return childOnly{tp: tp}
}

type childOnly struct {
	embedded.TracerProvider
	tp trace.TracerProvider
}

func (c childOnly) Tracer(name string, opts ...trace.TracerOption) trace.Tracer {
	return childOnlyTracer{t: c.tp.Tracer(name, opts...)}
}

type childOnlyTracer struct {
	embedded.Tracer
	t trace.Tracer
}

func (c childOnlyTracer) Start(ctx context.Context, name string, opts ...trace.SpanStartOption) (context.Context, trace.Span) {
	if ctx == nil {
		ctx = context.Background()
	}
	if !trace.SpanContextFromContext(ctx).IsValid() {
		return ctx, noSpan
	}
	return c.t.Start(ctx, name, opts...)
}

// End ends span, marked failed with err if err is not nil.
func End(span trace.Span, err error) {
	if err != nil {
		span.SetStatus(codes.Error, err.Error())
	}
	span.End()
}
