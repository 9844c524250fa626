package jobs

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
)

// ErrNotDead is Retry's error for a job that is not dead: it still runs
// or will, or it succeeded.
var ErrNotDead = errors.New("not dead (discarded or cancelled)")

// ErrNoJob is Retry's error for a job id River does not have (any more:
// it keeps dead jobs 7 days).
var ErrNoJob = errors.New("no such job")

const deadJobSQL = `SELECT kind, state::text FROM river_job WHERE id = $1 FOR UPDATE`

// Retry makes a dead job (discarded: out of attempts; cancelled: a
// permanent error) run again at once, an operator's act (`onceflow jobs
// retry`): River's JobRetry, which gives it one more attempt. It runs with
// the same key, so its call carries the same Idempotency-Key. A webhook's
// delivery is sent again by `onceflow webhooks redeliver`, which resets
// its delivery row too: Retry refuses the webhooks' kinds.
func Retry(ctx context.Context, pool *pgxpool.Pool, id int64) error {
	client, err := river.NewClient(riverpgxv5.New(pool), &river.Config{})
	if err != nil {
		return fmt.Errorf("jobs: river client: %w", err)
	}
	return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		var kind, state string
		if err := tx.QueryRow(ctx, deadJobSQL, id).Scan(&kind, &state); err != nil {
			if errors.Is(err, pgx.ErrNoRows) {
				return fmt.Errorf("job %d: %w", id, ErrNoJob)
			}
			return fmt.Errorf("job %d: %w", id, err)
		}
		if strings.HasPrefix(kind, "webhook_") {
			return fmt.Errorf("job %d is a %s: send it again with onceflow webhooks redeliver", id, kind)
		}
		if state != "discarded" && state != "cancelled" {
			return fmt.Errorf("job %d is %s: %w", id, state, ErrNotDead)
		}
		if _, err := client.JobRetryTx(ctx, tx, id); err != nil {
			return fmt.Errorf("retry job %d: %w", id, err)
		}
		return nil
	})
}
