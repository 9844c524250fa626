package relay

import (
	"context"
	"time"

	"github.com/onceflow/onceflow/pipeline/postgres"
)

// partitionsAhead is how many days of partitions the janitor keeps ready.
const partitionsAhead = 7

// retained is a table partitioned by day (parent_pYYYYMMDD, created by
// onceflow_ensure_daily_partitions) and how long its rows are kept.
type retained struct {
	table     string
	retention time.Duration
}

// retainedTables lists the tables the janitor looks after: the idempotency
// keys (ingest's replay window) and the projectors' inbox (their dedup
// window).
func (c *Config) retainedTables() []retained {
	return []retained{
		{"idempotency_keys", c.IdempotencyRetention},
		{"inbox", c.InboxRetention},
	}
}

// isPartitionedSQL is true for a partitioned table, false for a plain one,
// and NULL (scanned as false) for a table that does not exist.
const isPartitionedSQL = `SELECT COALESCE((SELECT relkind = 'p' FROM pg_class WHERE oid = to_regclass($1)), false)`

// janitor creates daily partitions ahead of time and drops the ones past
// their retention, every JanitorInterval, until ctx ends. Every relay runs
// it; the partition functions take an advisory lock per table, so relays
// doing it at once do not collide.
func (r *Relay) janitor(ctx context.Context) error {
	for {
		r.tidy(ctx)
		if !sleep(ctx, jitter(r.cfg.JanitorInterval)) {
			return nil
		}
	}
}

func (r *Relay) tidy(ctx context.Context) {
	for _, t := range r.cfg.retainedTables() {
		r.tidyTable(ctx, t)
	}
}

func (r *Relay) tidyTable(ctx context.Context, t retained) {
	var partitioned bool
	if err := r.pool.QueryRow(ctx, isPartitionedSQL, t.table).Scan(&partitioned); err != nil {
		if ctx.Err() == nil {
			r.logger.Warn("inspect table", "table", t.table, "err", err)
		}
		return
	}
	if !partitioned {
		// A plain table (the inbox before its partitioning migration) has
		// no partitions to create or drop.
		r.logger.Debug("table not partitioned, skipped", "table", t.table)
		return
	}
	if n, err := postgres.EnsureDailyPartitions(ctx, r.pool, t.table, partitionsAhead); err != nil {
		if ctx.Err() == nil {
			r.logger.Warn("create partitions", "table", t.table, "err", err)
		}
	} else if n > 0 {
		r.logger.Info("created partitions", "table", t.table, "count", n)
	}
	dropped, err := postgres.DropDailyPartitions(ctx, r.pool, t.table, t.retention)
	if err != nil {
		if ctx.Err() == nil {
			r.logger.Warn("drop partitions", "table", t.table, "err", err)
		}
		return
	}
	for _, name := range dropped {
		r.logger.Info("dropped partition", "table", t.table, "partition", name)
	}
}
