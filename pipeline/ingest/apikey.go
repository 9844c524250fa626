package ingest

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/onceflow/onceflow/pipeline/postgres"
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

// validateTenant keeps tenant names usable inside aggregate ids and keys,
// and none of them the scope of work across tenants (postgres.AllTenants:
// a tenant "*" would read every tenant's rows, docs/security.md#row-level-security).
func validateTenant(t string) error {
	if t == "" || len(t) > 64 || strings.ContainsAny(t, "/ \t\r\n\x00") {
		return fmt.Errorf("tenant %q: want 1 to 64 characters without '/' or spaces", t)
	}
	if t == postgres.AllTenants {
		return fmt.Errorf("tenant %q: the scope of work across tenants is no tenant's name", t)
	}
	return nil
}

const tenantByKeySQL = `SELECT tenant FROM api_keys WHERE key_hash = $1 AND revoked_at IS NULL`

// caller is who sent a request: the tenant its API key maps to, and the
// key's hash.
type caller struct {
	tenant  string
	keyHash []byte
}

// authenticate returns the caller of r's bearer key, or the problem to
// answer: 401 for a missing, unknown or revoked key, 429 for a client
// address whose failures used its budget up, 503 when too many unknown
// keys are being looked up at once or the database is away.
//
// A key this process has seen valid is taken from the key cache on every
// route, and checked again in the transaction that serves the request: a
// command's accept transaction and a read's scoped transaction (scope.go)
// both refuse a revoked key with 401 before anything is written or read,
// so revocation applies to the next request without a round trip of its
// own. Anything else costs at most one lookup, and only within bounds
// that hold before anyone is authenticated (docs/security.md#starvation):
//
//   - a client address that failed AuthFailureBurst times (refilling at
//     AuthFailureRate) is refused 429 without a lookup, unless its key is
//     one this process knows valid;
//   - a key found unknown or revoked is refused from the negative cache,
//     without a lookup, for BadKeyTTL;
//   - at most MaxKeyLookups lookups run at once (requests with the same
//     key share one); beyond them 503 rather than a wait for a connection
//     that tenants' requests need.
func (s *Server) authenticate(r *http.Request) (caller, *Problem) {
	key, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	key = strings.TrimSpace(key)
	now := time.Now()
	var c caller
	if ok && key != "" {
		c.keyHash = hashKey(key)
		if t, ok := s.keys.get(c.keyHash); ok {
			c.tenant = t
			return c, nil
		}
	}
	addr := clientAddr(r, s.cfg.TrustedProxies)
	if blocked, retry := s.failures.blocked(addr, now); blocked {
		s.metrics.authFailures.WithLabelValues("throttled").Inc()
		return caller{}, errAuthThrottled(retry)
	}
	if c.keyHash == nil {
		return caller{}, s.authFailed(addr, "missing")
	}
	if s.badKeys.has(c.keyHash, now) {
		return caller{}, s.authFailed(addr, "unknown")
	}
	// A lookup takes its token before it runs, and gives it back if the
	// key was valid: taken after, every request that found a token left
	// would look up at once, and the budget would bound nothing.
	if ok, retry := s.failures.allow(addr, now); !ok {
		s.metrics.authFailures.WithLabelValues("throttled").Inc()
		return caller{}, errAuthThrottled(retry)
	}
	tenant, err := s.lookupKey(r.Context(), c.keyHash)
	switch {
	case errors.Is(err, errLookupsBusy):
		s.failures.refund(addr)
		s.metrics.authFailures.WithLabelValues("busy").Inc()
		return caller{}, errUnavailable("too many requests with unknown API keys at once; retry")
	case err != nil:
		s.failures.refund(addr)
		return caller{}, s.internal(r, err)
	case tenant == "":
		s.badKeys.put(c.keyHash, now)
		s.metrics.authFailures.WithLabelValues("unknown").Inc()
		return caller{}, errUnauthorized
	}
	s.failures.refund(addr)
	c.tenant = tenant
	return c, nil
}

// authFailed counts a failed authentication against addr and returns the
// 401 to answer.
func (s *Server) authFailed(addr, reason string) *Problem {
	s.failures.spend(addr, time.Now())
	s.metrics.authFailures.WithLabelValues(reason).Inc()
	return errUnauthorized
}

// revoked forgets a key the database refused in the transaction that
// served its request, and counts the failure: a revoked key never works
// again.
func (s *Server) revoked(r *http.Request, c caller) *Problem {
	s.keys.drop(c.keyHash)
	s.badKeys.put(c.keyHash, time.Now())
	return s.authFailed(clientAddr(r, s.cfg.TrustedProxies), "revoked")
}

var errLookupsBusy = errors.New("too many key lookups at once")

// newKeysSQL reads the active keys made after the key id $1, newest first,
// at most $2.
const newKeysSQL = `SELECT id, key_hash, tenant FROM api_keys WHERE id > $1 AND revoked_at IS NULL ORDER BY id DESC LIMIT $2`

// learnKeys puts the active keys made since it last ran (all of them, at
// start: the newest maxCachedKeys/2) among the keys known valid, so that
// their requests skip the failure limit and the lookups
// (docs/security.md#starvation). A key revoked later is refused by the
// transaction that serves its next request, as any cached key is. A key
// whose id commits after a newer one was read is learned at its first
// request instead.
func (s *Server) learnKeys(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.RequestTimeout)
	defer cancel()
	rows, err := s.pool.Query(ctx, newKeysSQL, s.learnedKey, maxCachedKeys/2)
	if err != nil {
		return fmt.Errorf("read api keys: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var id int64
		var h []byte
		var tenant string
		if err := rows.Scan(&id, &h, &tenant); err != nil {
			return fmt.Errorf("read api keys: %w", err)
		}
		s.keys.put(h, tenant)
		s.learnedKey = max(s.learnedKey, id)
	}
	return rows.Err()
}

// refreshKeys runs learnKeys every KeyRefresh until ctx ends.
func (s *Server) refreshKeys(ctx context.Context) {
	t := time.NewTicker(s.cfg.KeyRefresh)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if err := s.learnKeys(ctx); err != nil && ctx.Err() == nil {
			s.logger.Warn("read new API keys; retrying", "err", err)
		}
	}
}

// lookupKey returns the tenant of the active key with hash h, or "" when
// there is none. Concurrent lookups of one key share one query, and at
// most MaxKeyLookups queries run at once.
func (s *Server) lookupKey(ctx context.Context, h []byte) (string, error) {
	v, err, _ := s.lookups.Do(string(h), func() (any, error) {
		select {
		case s.lookupSlots <- struct{}{}:
		default:
			return "", errLookupsBusy
		}
		defer func() { <-s.lookupSlots }()
		// Not the request's context: the lookup is shared by every request
		// with this key, and the first one's client may leave.
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.cfg.RequestTimeout)
		defer cancel()
		var tenant string
		err := s.pool.QueryRow(ctx, tenantByKeySQL, h).Scan(&tenant)
		if errors.Is(err, pgx.ErrNoRows) {
			s.metrics.keyLookups.WithLabelValues("unknown").Inc()
			return "", nil
		}
		if err != nil {
			return "", err
		}
		s.metrics.keyLookups.WithLabelValues("found").Inc()
		s.keys.put(h, tenant)
		return tenant, nil
	})
	t, _ := v.(string)
	return t, err
}

// keyCache maps the hashes of API keys seen valid to their tenants. Only
// keys that were valid are cached, so its size is bounded by the real
// keys; it is emptied if it ever holds maxCachedKeys.
type keyCache struct {
	mu sync.Mutex
	m  map[string]string
}

const maxCachedKeys = 10000

func (c *keyCache) get(h []byte) (string, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	t, ok := c.m[string(h)]
	return t, ok
}

func (c *keyCache) put(h []byte, tenant string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.m == nil || len(c.m) >= maxCachedKeys {
		c.m = make(map[string]string)
	}
	c.m[string(h)] = tenant
}

func (c *keyCache) drop(h []byte) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.m, string(h))
}

// badKeyCache is the negative cache: hashes of keys found unknown or
// revoked, each until its expiry. Anyone can fill it with made-up keys,
// so it is bounded: when full, expired entries go, and if none has
// expired an arbitrary one makes room (a key pushed out early costs one
// more lookup, within the failure limit of whoever sent it).
type badKeyCache struct {
	size int
	ttl  time.Duration

	mu sync.Mutex
	m  map[string]time.Time // hash -> expiry
}

func (c *badKeyCache) has(h []byte, now time.Time) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	exp, ok := c.m[string(h)]
	if ok && !now.Before(exp) {
		delete(c.m, string(h))
		return false
	}
	return ok
}

func (c *badKeyCache) put(h []byte, now time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.m == nil {
		c.m = make(map[string]time.Time)
	}
	if _, ok := c.m[string(h)]; !ok && len(c.m) >= c.size {
		for k, exp := range c.m {
			if !now.Before(exp) {
				delete(c.m, k)
			}
		}
		for k := range c.m {
			if len(c.m) < c.size {
				break
			}
			delete(c.m, k)
		}
	}
	c.m[string(h)] = now.Add(c.ttl)
}
