package command

import (
	"context"
	"time"

	"github.com/onceflow/onceflow"
	"github.com/onceflow/onceflow/pipeline/tracing/otlp"
)

// newExporter builds the OTLP exporter's provider: a test of the settings
// replaces it to see where the spans would go.
var newExporter = otlp.New

// exportSpans gives cfg an OTLP exporter's tracer provider when the
// tracing settings name a collector and cfg has no provider yet
// (docs/observability.md); stop exports what is left, within a bound, so
// that a collector that is gone does not hold the exit. The exporter is
// built here, in the command line, and not by onceflow.RunComponents, so
// that the library links no exporter (pipeline/tracing/otlp).
func (c *config) exportSpans(ctx context.Context, cfg *onceflow.Config) (stop func(), err error) {
	url := otlp.TracesURL(c.otlpEndpoint, c.otlpTracesEndpoint)
	if url == "" || cfg.TracerProvider != nil {
		return func() {}, nil
	}
	tp, err := newExporter(ctx, url, "onceflow")
	if err != nil {
		return nil, err
	}
	cfg.TracerProvider = tp
	return func() {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		if err := tp.Shutdown(sctx); err != nil {
			cfg.Logger.Warn("tracing: spans not exported at exit", "err", err)
		}
	}, nil
}
