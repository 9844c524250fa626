package tracing

import (
	"context"
	"fmt"
	"strings"

	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.26.0"
)

// OTLP returns a tracer provider that exports its spans in batches by
// OTLP over HTTP to endpoint, the collector's base URL as
// OTEL_EXPORTER_OTLP_ENDPOINT gives it (the spans go to its /v1/traces).
// The SDK reads the other standard variables itself: OTEL_SERVICE_NAME
// and OTEL_RESOURCE_ATTRIBUTES (default service name: service),
// OTEL_EXPORTER_OTLP_HEADERS, _TIMEOUT, _COMPRESSION, _CERTIFICATE,
// OTEL_TRACES_SAMPLER (default parentbased_always_on) and OTEL_BSP_*. Its
// Shutdown exports what is left.
func OTLP(ctx context.Context, endpoint, service string) (*sdktrace.TracerProvider, error) {
	exp, err := otlptracehttp.New(ctx, otlptracehttp.WithEndpointURL(strings.TrimSuffix(endpoint, "/")+"/v1/traces"))
	if err != nil {
		return nil, fmt.Errorf("tracing: OTLP exporter: %w", err)
	}
	res, err := resource.Merge(resource.NewSchemaless(semconv.ServiceName(service)), resource.Environment())
	if err != nil {
		return nil, fmt.Errorf("tracing: resource: %w", err)
	}
	return sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res)), nil
}
