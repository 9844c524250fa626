package postgres

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// EnsureDailyPartitions creates the daily partitions of parent from the day
// before now up to ahead days after it, and returns how many it created.
func EnsureDailyPartitions(ctx context.Context, pool *pgxpool.Pool, parent string, ahead int) (int, error) {
	var created int
	err := pool.QueryRow(ctx,
		`SELECT onceflow_ensure_daily_partitions($1, (now() AT TIME ZONE 'UTC')::date - 1, $2)`,
		parent, ahead+2).Scan(&created)
	if err != nil {
		return 0, fmt.Errorf("ensure partitions of %s: %w", parent, err)
	}
	return created, nil
}

// DropDailyPartitions drops the daily partitions of parent whose whole day
// is older than retention (by the database clock) and returns their names.
func DropDailyPartitions(ctx context.Context, pool *pgxpool.Pool, parent string, retention time.Duration) ([]string, error) {
	rows, err := pool.Query(ctx,
		`SELECT onceflow_drop_daily_partitions($1, now() - make_interval(secs => $2))`,
		parent, retention.Seconds())
	if err != nil {
		return nil, fmt.Errorf("drop partitions of %s: %w", parent, err)
	}
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("drop partitions of %s: %w", parent, err)
	}
	return names, nil
}
