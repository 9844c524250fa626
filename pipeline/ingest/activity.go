package ingest

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// KeyActivity is what one Idempotency-Key of a tenant saw: the request
// that created its command, and how often it came back, as a retry of the
// same request (replays) or reused for a different one (conflicts).
type KeyActivity struct {
	Key       string
	Route     string
	CommandID string
	Status    string // the command's status now; "" when its row is gone
	CreatedAt time.Time
	Replays   int
	Conflicts int
	LastSeen  time.Time // the last replay or conflict; zero if none
}

// KeyReport summarizes a tenant's keys created in a time window (what
// `onceflow idempotency-check` prints).
type KeyReport struct {
	Tenant    string
	Window    time.Duration
	Keys      int // keys created in the window
	Replays   int
	Conflicts int
	Top       []KeyActivity // the most active keys first
}

const (
	keyTotalsSQL = `SELECT count(*), coalesce(sum(replays), 0), coalesce(sum(conflicts), 0)
		FROM idempotency_keys
		WHERE tenant = $1 AND created_at > now() - make_interval(secs => $2)`
	// A key's command is the row ingest wrote, which getCommandSQL's order
	// puts first among the tenant's rows of that id.
	keyTopSQL = `SELECT k.key, k.route, k.command_id::text, coalesce(c.status, ''), k.created_at,
			k.replays, k.conflicts, k.last_seen_at
		FROM idempotency_keys AS k
		LEFT JOIN LATERAL (SELECT c.status FROM command_status AS c
			WHERE c.command_id = k.command_id AND c.tenant = k.tenant
			ORDER BY c.ingested DESC, c.created_at, c.aggregate_id LIMIT 1) AS c ON true
		WHERE k.tenant = $1 AND k.created_at > now() - make_interval(secs => $2)
		ORDER BY k.replays + k.conflicts DESC, k.conflicts DESC, k.last_seen_at DESC NULLS LAST, k.created_at DESC
		LIMIT $3`
)

// CheckKeys reports the keys tenant created in the last window, with the
// limit most active ones (conflicts weigh first among equals: a reused
// key is a client bug, a retry is normal).
func CheckKeys(ctx context.Context, pool *pgxpool.Pool, tenant string, window time.Duration, limit int) (KeyReport, error) {
	if err := validateTenant(tenant); err != nil {
		return KeyReport{}, err
	}
	if window <= 0 || limit < 0 {
		return KeyReport{}, errors.New("the window must be positive and the limit not negative")
	}
	r := KeyReport{Tenant: tenant, Window: window}
	if err := pool.QueryRow(ctx, keyTotalsSQL, tenant, window.Seconds()).Scan(&r.Keys, &r.Replays, &r.Conflicts); err != nil {
		return r, fmt.Errorf("count idempotency keys: %w", err)
	}
	var err error
	r.Top, err = collect(ctx, pool, "list idempotency keys", func(row pgx.CollectableRow) (KeyActivity, error) {
		var a KeyActivity
		var last *time.Time
		err := row.Scan(&a.Key, &a.Route, &a.CommandID, &a.Status, &a.CreatedAt, &a.Replays, &a.Conflicts, &last)
		if last != nil {
			a.LastSeen = *last
		}
		return a, err
	}, keyTopSQL, tenant, window.Seconds(), limit)
	return r, err
}
