package projector

import (
	"context"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/onceflow/onceflow/pipeline"
)

// DecodeForBench decodes a record as the projector does (the benchmark's
// baseline decodes the same way).
func DecodeForBench(ctx context.Context, dec Decoder, r *kgo.Record) (pipeline.Event, error) {
	e, err := decode(ctx, dec, r)
	return e.Event, err
}
