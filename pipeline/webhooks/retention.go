package webhooks

import (
	"context"
	"fmt"

	"github.com/riverqueue/river"
)

// RetentionKind is the job kind of the delivery log's retention.
const RetentionKind = "webhook_retention"

// RetentionArgs are the retention job's (none: River's leader inserts it
// every RetentionInterval).
type RetentionArgs struct{}

// Kind implements river.JobArgs.
func (RetentionArgs) Kind() string { return RetentionKind }

// retention is the River worker that deletes, older than Config.Retention,
// the finished deliveries (delivered, dead) and the fanned-out events with
// no delivery in flight, in batches.
type retention struct {
	river.WorkerDefaults[RetentionArgs]
	d *Deliverer
}

const (
	retentionBatch         = 10_000
	deleteOldDeliveriesSQL = `DELETE FROM webhook_deliveries WHERE ctid IN (
		SELECT ctid FROM webhook_deliveries
		WHERE status IN ('delivered', 'dead') AND updated_at < now() - $1::interval
		LIMIT $2)`
	deleteOldEventsSQL = `DELETE FROM webhook_events e WHERE ctid IN (
		SELECT ctid FROM webhook_events e
		WHERE expanded_at IS NOT NULL AND created_at < now() - $1::interval
		  AND NOT EXISTS (SELECT 1 FROM webhook_deliveries d
		                  WHERE d.tenant = e.tenant AND d.event_id = e.event_id AND d.status IN ('pending', 'failed'))
		LIMIT $2)`
)

// Work implements river.Worker.
func (r *retention) Work(ctx context.Context, _ *river.Job[RetentionArgs]) error {
	d := r.d
	for _, t := range []struct{ table, sql string }{{"webhook_deliveries", deleteOldDeliveriesSQL}, {"webhook_events", deleteOldEventsSQL}} {
		total := int64(0)
		for {
			tag, err := d.pool.Exec(ctx, t.sql, d.cfg.Retention.String(), retentionBatch)
			if err != nil {
				return fmt.Errorf("retention of %s: %w", t.table, err)
			}
			n := tag.RowsAffected()
			total += n
			d.metrics.retained.WithLabelValues(t.table).Add(float64(n))
			if n < retentionBatch {
				break
			}
		}
		if total > 0 {
			d.logger.Info("webhook retention: deleted rows older than the retention", "table", t.table, "rows", total, "retention", d.cfg.Retention)
		}
	}
	return nil
}
