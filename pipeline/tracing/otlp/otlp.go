// Package otlp exports a process's spans by OTLP over HTTP
// (docs/observability.md), with what a caller must not decide or read
// through them guarded (guard.go). It is a package of its own because the
// exporter brings gRPC's packages (the OTLP protobuf types it encodes
// with; nothing dials gRPC): the library's packages trace through package
// tracing and the OpenTelemetry API only, and only the processes that
// export (the command line, cli) link the exporter (TestLeanBinaries).
package otlp

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"strings"

	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.26.0"
)

// TracesURL is where the spans go, as the OpenTelemetry specification
// reads its two variables: traces, the signal's own URL
// (OTEL_EXPORTER_OTLP_TRACES_ENDPOINT), as it is (with no path, the root:
// the exporter would put /v1/traces there); else base, a collector's base
// URL (OTEL_EXPORTER_OTLP_ENDPOINT), with /v1/traces after its path; ""
// when neither is set (no spans).
func TracesURL(base, traces string) string {
	switch {
	case traces != "":
		if u, err := url.Parse(traces); err == nil && u.Path == "" {
			u.Path = "/"
			return u.String()
		}
		return traces
	case base != "":
		return strings.TrimSuffix(base, "/") + "/v1/traces"
	}
	return ""
}

// New returns a tracer provider that exports its spans in batches by
// OTLP over HTTP to tracesURL (TracesURL). The SDK reads the other standard
// variables itself: OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES
// (default service name: service), OTEL_EXPORTER_OTLP_HEADERS, _TIMEOUT,
// _COMPRESSION, _CERTIFICATE and their _TRACES_ forms and OTEL_BSP_*;
// OTEL_TRACES_SAMPLER (default parentbased_always_on) is read here, for a
// server span is sampled on its own whatever its caller's traceparent
// says, and a client span's URL keeps its scheme and host only (guard.go).
// Its Shutdown exports what is left.
func New(ctx context.Context, tracesURL, service string) (*sdktrace.TracerProvider, error) {
	exp, err := otlptracehttp.New(ctx, otlptracehttp.WithEndpointURL(tracesURL))
	if err != nil {
		return nil, fmt.Errorf("tracing: OTLP exporter: %w", err)
	}
	res, err := resource.Merge(resource.NewSchemaless(semconv.ServiceName(service)), resource.Environment())
	if err != nil {
		return nil, fmt.Errorf("tracing: resource: %w", err)
	}
	opts := append(guarded(os.Getenv), sdktrace.WithBatcher(exp), sdktrace.WithResource(res))
	return sdktrace.NewTracerProvider(opts...), nil
}
