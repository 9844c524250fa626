package verify

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Result is a verification as verify_runs keeps it: what the status page
// exports (docs/operations.md#verify).
type Result struct {
	StartedAt  time.Time `json:"started_at"`
	FinishedAt time.Time `json:"finished_at"`
	From       time.Time `json:"from"`
	To         time.Time `json:"to"`
	Tenant     string    `json:"tenant,omitempty"`
	OK         bool      `json:"ok"`
	// Findings counts the findings by stage and kind.
	Findings   map[string]map[string]int `json:"findings"`
	NotChecked int                       `json:"not_checked"`
}

const (
	recordSQL = `WITH old AS (DELETE FROM verify_runs WHERE finished_at < now() - interval '90 days')
		INSERT INTO verify_runs (started_at, window_from, window_to, tenant, ok, findings, not_checked) VALUES ($1, $2, $3, $4, $5, $6, $7)`
	lastSQL = `SELECT started_at, finished_at, window_from, window_to, tenant, ok, findings, not_checked
		FROM verify_runs ORDER BY finished_at DESC, id DESC LIMIT 1`
)

// Counts returns the report's findings by stage and kind.
func (r *Report) Counts() map[string]map[string]int {
	out := map[string]map[string]int{}
	for _, f := range r.Findings {
		if out[f.Stage] == nil {
			out[f.Stage] = map[string]int{}
		}
		out[f.Stage][f.Kind]++
	}
	return out
}

// Record writes the report's result to verify_runs.
func Record(ctx context.Context, pool *pgxpool.Pool, r *Report) error {
	findings, err := json.Marshal(r.Counts())
	if err != nil {
		return err
	}
	if _, err := pool.Exec(ctx, recordSQL, r.StartedAt, r.From, r.To, r.Tenant, r.OK(), findings, len(r.NotChecked)); err != nil {
		return fmt.Errorf("record the verification: %w", err)
	}
	return nil
}

// Last returns the newest recorded verification, nil when there is none.
func Last(ctx context.Context, pool *pgxpool.Pool) (*Result, error) {
	var res Result
	err := pool.QueryRow(ctx, lastSQL).Scan(&res.StartedAt, &res.FinishedAt, &res.From, &res.To, &res.Tenant, &res.OK, &res.Findings, &res.NotChecked)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read the last verification: %w", err)
	}
	return &res, nil
}
