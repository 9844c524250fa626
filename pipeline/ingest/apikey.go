package ingest

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// apiKeyPrefix marks onceflow API keys so they are recognizable in logs
// and secret scanners.
const apiKeyPrefix = "of_"

// NewAPIKey returns a new random API key (256 bits).
func NewAPIKey() string {
	b := make([]byte, 32)
	rand.Read(b)
	return apiKeyPrefix + base64.RawURLEncoding.EncodeToString(b)
}

func hashKey(key string) []byte {
	h := sha256.Sum256([]byte(key))
	return h[:]
}

// CreateAPIKey stores key (only its hash) for tenant. name labels the key
// for operators.
func CreateAPIKey(ctx context.Context, pool *pgxpool.Pool, tenant, name, key string) error {
	if err := validateTenant(tenant); err != nil {
		return err
	}
	_, err := pool.Exec(ctx,
		`INSERT INTO api_keys (key_hash, tenant, name) VALUES ($1, $2, $3) ON CONFLICT (key_hash) DO NOTHING`,
		hashKey(key), tenant, name)
	if err != nil {
		return fmt.Errorf("store api key: %w", err)
	}
	return nil
}

// RevokeAPIKey revokes key; it stops working at once.
func RevokeAPIKey(ctx context.Context, pool *pgxpool.Pool, key string) error {
	tag, err := pool.Exec(ctx, `UPDATE api_keys SET revoked_at = now() WHERE key_hash = $1 AND revoked_at IS NULL`, hashKey(key))
	if err != nil {
		return fmt.Errorf("revoke api key: %w", err)
	}
	if tag.RowsAffected() == 0 {
		return errors.New("no such active api key")
	}
	return nil
}

// validateTenant keeps tenant names usable inside aggregate ids and keys.
func validateTenant(t string) error {
	if t == "" || len(t) > 64 || strings.ContainsAny(t, "/ \t\r\n\x00") {
		return fmt.Errorf("tenant %q: want 1 to 64 characters without '/' or spaces", t)
	}
	return nil
}

const tenantByKeySQL = `SELECT tenant FROM api_keys WHERE key_hash = $1 AND revoked_at IS NULL`

// authenticate returns the tenant of the bearer key, or "" when the key is
// missing, unknown or revoked. Keys are looked up on every request (a
// primary-key read) so a revocation takes effect at once.
func (s *Server) authenticate(ctx context.Context, header string) (string, error) {
	key, ok := strings.CutPrefix(header, "Bearer ")
	if !ok || key == "" {
		return "", nil
	}
	var tenant string
	err := s.pool.QueryRow(ctx, tenantByKeySQL, hashKey(strings.TrimSpace(key))).Scan(&tenant)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", nil
	}
	return tenant, err
}
