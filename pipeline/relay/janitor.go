package relay

import (
	"context"

	"github.com/onceflow/onceflow/pipeline/postgres"
)

// partitionsAhead is how many days of partitions the janitor keeps ready.
const partitionsAhead = 7

// janitor creates daily partitions ahead of time and drops the ones past
// their retention, every JanitorInterval, until ctx ends.
func (r *Relay) janitor(ctx context.Context) error {
	for {
		r.tidy(ctx)
		if !sleep(ctx, jitter(r.cfg.JanitorInterval)) {
			return nil
		}
	}
}

func (r *Relay) tidy(ctx context.Context) {
	if n, err := postgres.EnsureDailyPartitions(ctx, r.pool, "idempotency_keys", partitionsAhead); err != nil {
		if ctx.Err() == nil {
			r.logger.Warn("create partitions", "table", "idempotency_keys", "err", err)
		}
	} else if n > 0 {
		r.logger.Info("created partitions", "table", "idempotency_keys", "count", n)
	}
	dropped, err := postgres.DropDailyPartitions(ctx, r.pool, "idempotency_keys", r.cfg.IdempotencyRetention)
	if err != nil {
		if ctx.Err() == nil {
			r.logger.Warn("drop partitions", "table", "idempotency_keys", "err", err)
		}
		return
	}
	for _, name := range dropped {
		r.logger.Info("dropped partition", "table", "idempotency_keys", "partition", name)
	}
}
