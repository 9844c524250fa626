package jobs

import (
	"context"
	"encoding/json"

	"github.com/riverqueue/river"
	"github.com/riverqueue/river/rivertype"
	"github.com/riverqueue/rivercontrib/otelriver"
	"go.opentelemetry.io/otel/trace"

	"github.com/onceflow/onceflow/pipeline/tracing"
)

// A job carries the trace and the tenant of the event that made it in its
// metadata, as {"traceparent": ..., "tenant": ...} (docs/observability.md,
// docs/jobs.md): Projection puts the event's there, traceContext puts the
// trace in the context of each attempt, and Call sends it with the
// attempt's request, whether or not this process makes spans; Tenant
// reads the tenant, which a domain job's completion is scoped to.

// jobMetadata is the metadata of a job of an event with a trace or a
// tenant.
func jobMetadata(traceparent, tenant string) []byte {
	if traceparent == "" && tenant == "" {
		return nil
	}
	b, _ := json.Marshal(metadata{Traceparent: traceparent, Tenant: tenant})
	return b
}

// metadata is what onceflow keeps in a job's River metadata: its event's
// trace and tenant.
type metadata struct {
	Traceparent string `json:"traceparent,omitempty"`
	Tenant      string `json:"tenant,omitempty"`
}

// Tenant is the tenant of the event that caused job, kept in its
// metadata when it was enqueued; "" for a job enqueued otherwise.
func Tenant(job *rivertype.JobRow) string {
	var m metadata
	if len(job.Metadata) > 0 && json.Unmarshal(job.Metadata, &m) == nil {
		return m.Tenant
	}
	return ""
}

// traceContext is the worker middleware that puts a job's trace in the
// context of its attempt: otelriver's work span (with tracing on) is its
// child, and Call's request carries it.
type traceContext struct {
	river.MiddlewareDefaults
}

func (*traceContext) Work(ctx context.Context, job *rivertype.JobRow, doInner func(context.Context) error) error {
	var m metadata
	if len(job.Metadata) > 0 && json.Unmarshal(job.Metadata, &m) == nil && m.Traceparent != "" {
		ctx = tracing.WithTraceparent(ctx, m.Traceparent)
	}
	return doInner(ctx)
}

// riverTracing is River's OpenTelemetry middleware on tp (nil: none): a
// river.insert_many span for each insert in a trace, a river.work span for
// each attempt of a job with one. The traces go through the metadata
// above, each job its event's, so otelriver's own propagation (one context
// for a whole insert) stays off.
func riverTracing(tp trace.TracerProvider) []rivertype.Middleware {
	if tp == nil {
		return nil
	}
	return []rivertype.Middleware{otelriver.NewMiddleware(&otelriver.MiddlewareConfig{
		TracerProvider: tracing.ChildOnly(tp), EnableWorkSpanJobKindSuffix: true,
	})}
}
