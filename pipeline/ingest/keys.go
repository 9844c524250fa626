package ingest

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// APIKey is an API key as an operator sees it: its id, never the key.
type APIKey struct {
	ID        int64
	Tenant    string
	Name      string
	CreatedAt time.Time
	RevokedAt time.Time // zero while the key is active
}

// ErrNoActiveKey is what revoking an id that names no active key returns.
var ErrNoActiveKey = errors.New("no active api key with that id")

// IssueAPIKey makes a new key for tenant, stores its hash, and returns the
// key's id and the key itself: the only time the key exists outside its
// holder. name labels it for operators.
func IssueAPIKey(ctx context.Context, pool *pgxpool.Pool, tenant, name string) (int64, string, error) {
	if err := validateTenant(tenant); err != nil {
		return 0, "", err
	}
	key := NewAPIKey()
	var id int64
	err := pool.QueryRow(ctx, `INSERT INTO api_keys (key_hash, tenant, name) VALUES ($1, $2, $3) RETURNING id`,
		hashKey(key), tenant, name).Scan(&id)
	if err != nil {
		return 0, "", fmt.Errorf("store api key: %w", err)
	}
	return id, key, nil
}

// ListAPIKeys returns the keys of tenant ("" for every tenant), revoked
// ones included, in the order they were made.
func ListAPIKeys(ctx context.Context, pool *pgxpool.Pool, tenant string) ([]APIKey, error) {
	return collect(ctx, pool, "list api keys", func(row pgx.CollectableRow) (APIKey, error) {
		var k APIKey
		var revoked *time.Time
		err := row.Scan(&k.ID, &k.Tenant, &k.Name, &k.CreatedAt, &revoked)
		if revoked != nil {
			k.RevokedAt = *revoked
		}
		return k, err
	}, `SELECT id, tenant, name, created_at, revoked_at FROM api_keys
		WHERE $1 = '' OR tenant = $1 ORDER BY id`, tenant)
}

// collect reads the rows of query through scan; what names the list in
// its errors.
func collect[T any](ctx context.Context, pool *pgxpool.Pool, what string, scan pgx.RowToFunc[T], query string, args ...any) ([]T, error) {
	rows, err := pool.Query(ctx, query, args...)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	out, err := pgx.CollectRows(rows, scan)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	return out, nil
}

// RevokeAPIKeyByID revokes the active key id and returns it. It stops
// working at once: every request checks its key in the database, a GET
// when it arrives, a command again in the transaction that accepts it (see
// authenticate).
func RevokeAPIKeyByID(ctx context.Context, pool *pgxpool.Pool, id int64) (APIKey, error) {
	k := APIKey{ID: id}
	err := pool.QueryRow(ctx, `UPDATE api_keys SET revoked_at = now() WHERE id = $1 AND revoked_at IS NULL
		RETURNING tenant, name, created_at, revoked_at`, id).Scan(&k.Tenant, &k.Name, &k.CreatedAt, &k.RevokedAt)
	if errors.Is(err, pgx.ErrNoRows) {
		return APIKey{}, fmt.Errorf("api key %d: %w", id, ErrNoActiveKey)
	}
	if err != nil {
		return APIKey{}, fmt.Errorf("revoke api key %d: %w", id, err)
	}
	return k, nil
}
