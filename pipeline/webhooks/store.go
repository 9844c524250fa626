package webhooks

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/onceflow/onceflow/pipeline"
)

// DB is what the subscription functions run on: a transaction scoped to
// the tenant (ingest's), a pool, a connection.
type DB interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Subscription is a tenant's endpoint, as the API shows it (never its
// secrets: only Create and Rotate return the new one).
type Subscription struct {
	ID         pipeline.ID `json:"id"`
	URL        string      `json:"url"`
	EventTypes []string    `json:"event_types"`
	// Status is enabled or disabled; DisabledReason says why (410 Gone).
	Status         string  `json:"status"`
	DisabledReason *string `json:"disabled_reason,omitempty"`
	// Rotating is true while two secrets sign (after a rotation, until the
	// previous one is dropped).
	Rotating  bool      `json:"rotating"`
	CreatedAt time.Time `json:"created_at"`
	// Secret is the newest signing secret, in the answers of Create and
	// Rotate only.
	Secret string `json:"secret,omitempty"`
}

// Limits of a subscription.
const (
	MaxURLLen        = 2048
	MaxEventTypes    = 64
	MaxEventTypeLen  = 128
	MaxSubscriptions = 100 // per tenant
)

// ErrNotFound is a subscription the tenant does not have.
var ErrNotFound = errors.New("webhooks: no such subscription")

// ErrConflict is Create's error for a key reused with another request.
var ErrConflict = errors.New("webhooks: the Idempotency-Key made another subscription")

// ErrTooMany is Create's error for a tenant at MaxSubscriptions.
var ErrTooMany = fmt.Errorf("webhooks: at most %d subscriptions per tenant", MaxSubscriptions)

// FieldError is an invalid field of a request.
type FieldError struct{ Field, Message string }

func (e *FieldError) Error() string { return e.Field + ": " + e.Message }

// Check validates a subscription's URL and event types (nil when valid).
// Where the URL's host resolves is checked when a delivery dials it
// (Guard), not here: a name can resolve elsewhere later.
func Check(rawURL string, types []string) []*FieldError {
	var errs []*FieldError
	u, err := url.Parse(rawURL)
	switch {
	case len(rawURL) > MaxURLLen:
		errs = append(errs, &FieldError{"url", fmt.Sprintf("at most %d bytes", MaxURLLen)})
	case err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" || u.User != nil || u.Fragment != "":
		errs = append(errs, &FieldError{"url", "an absolute http or https URL without user info or fragment"})
	}
	if len(types) > MaxEventTypes {
		errs = append(errs, &FieldError{"event_types", fmt.Sprintf("at most %d", MaxEventTypes)})
	}
	for _, t := range types {
		if t == "" || len(t) > MaxEventTypeLen || strings.ContainsFunc(t, func(r rune) bool {
			return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '_' || r == '.' || r == '-')
		}) {
			errs = append(errs, &FieldError{"event_types", "event type names: letters, digits, '_', '.', '-', 1 to 128 of them (as the events' event-type header)"})
			break
		}
	}
	return errs
}

// subscriptionNamespace names subscription ids made from Idempotency-Keys.
var subscriptionNamespace = pipeline.MustParseID("6f6e6365-666c-4f77-8077-65626b6f6f6b")

// SubscriptionID is the id of the subscription tenant creates with key:
// the same key makes the same subscription, once.
func SubscriptionID(tenant, key string) pipeline.ID {
	return pipeline.NameID(subscriptionNamespace, []byte(tenant+"\x00"+key))
}

const subscriptionColumns = `id, url, event_types, status, disabled_reason, cardinality(secrets) > 1, created_at, secrets[1]`

// lockTenantSQL serializes a tenant's creates for the rest of the
// transaction, so that the count createSQL checks against the cap is the
// one its insert adds to: two creates at once both counted 99 and both
// inserted. The lock comes in a statement of its own, since a statement
// reads the snapshot it started with even after a lock it waited for.
const lockTenantSQL = `SELECT pg_advisory_xact_lock(hashtextextended('onceflow_webhook_subscriptions/' || $1, 0))`

const createSQL = `INSERT INTO webhook_subscriptions (tenant, id, url, event_types, secrets)
	SELECT $1, $2, $3, $4, ARRAY[$5]
	WHERE (SELECT count(*) FROM webhook_subscriptions WHERE tenant = $1) < $6
	ON CONFLICT (tenant, id) DO NOTHING
	RETURNING ` + subscriptionColumns

const getSQL = `SELECT ` + subscriptionColumns + ` FROM webhook_subscriptions WHERE tenant = $1 AND id = $2`

func scan(row pgx.Row) (Subscription, error) {
	var s Subscription
	var id [16]byte
	err := row.Scan(&id, &s.URL, &s.EventTypes, &s.Status, &s.DisabledReason, &s.Rotating, &s.CreatedAt, &s.Secret)
	s.ID = id
	if s.EventTypes == nil {
		s.EventTypes = []string{}
	}
	return s, err
}

// Create makes tenant's subscription named by key (an Idempotency-Key)
// for url and types (empty: every event type), with a new secret, and
// returns it with its secret. The same key again returns the same
// subscription without its secret (created false): a secret is shown once,
// and a replay after a rotation must not hand out the new one to whoever
// holds the creating request. It returns ErrConflict if the key made a
// subscription for another url or types. db must be a transaction for
// MaxSubscriptions to hold against concurrent creates (ingest's is).
func Create(ctx context.Context, db DB, tenant, key, rawURL string, types []string) (s Subscription, created bool, err error) {
	id := SubscriptionID(tenant, key)
	types = normalize(types)
	if _, err := db.Exec(ctx, lockTenantSQL, tenant); err != nil {
		return Subscription{}, false, fmt.Errorf("lock the tenant's subscriptions: %w", err)
	}
	s, err = scan(db.QueryRow(ctx, createSQL, tenant, [16]byte(id), rawURL, types, NewSecret(), MaxSubscriptions))
	if err == nil {
		return s, true, nil
	}
	if !errors.Is(err, pgx.ErrNoRows) {
		return Subscription{}, false, fmt.Errorf("create subscription: %w", err)
	}
	s, err = scan(db.QueryRow(ctx, getSQL, tenant, [16]byte(id)))
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return Subscription{}, false, ErrTooMany
	case err != nil:
		return Subscription{}, false, fmt.Errorf("read subscription: %w", err)
	case s.URL != rawURL || !slices.Equal(s.EventTypes, types):
		return Subscription{}, false, ErrConflict
	}
	s.Secret = ""
	return s, false, nil
}

func normalize(types []string) []string {
	out := slices.Clone(types)
	slices.Sort(out)
	out = slices.Compact(out)
	if out == nil {
		out = []string{}
	}
	return out
}

// one runs query, which reads or changes tenant's subscription id and
// returns it, and answers it without its secret, or ErrNotFound.
func one(ctx context.Context, db DB, query, tenant string, id pipeline.ID) (Subscription, error) {
	s, err := scan(db.QueryRow(ctx, query, tenant, [16]byte(id)))
	if errors.Is(err, pgx.ErrNoRows) {
		return Subscription{}, ErrNotFound
	}
	s.Secret = ""
	return s, err
}

// Get returns one of tenant's subscriptions, without its secret.
func Get(ctx context.Context, db DB, tenant string, id pipeline.ID) (Subscription, error) {
	return one(ctx, db, getSQL, tenant, id)
}

const listSQL = `SELECT ` + subscriptionColumns + ` FROM webhook_subscriptions WHERE tenant = $1 ORDER BY created_at, id`

// List returns tenant's subscriptions, oldest first, without secrets.
func List(ctx context.Context, db DB, tenant string) ([]Subscription, error) {
	rows, err := db.Query(ctx, listSQL, tenant)
	if err != nil {
		return nil, fmt.Errorf("list subscriptions: %w", err)
	}
	defer rows.Close()
	out := []Subscription{}
	for rows.Next() {
		s, err := scan(rows)
		if err != nil {
			return nil, fmt.Errorf("list subscriptions: %w", err)
		}
		s.Secret = ""
		out = append(out, s)
	}
	return out, rows.Err()
}

const deleteSQL = `DELETE FROM webhook_subscriptions WHERE tenant = $1 AND id = $2`

// Delete removes one of tenant's subscriptions: its pending deliveries
// end dead (the worker finds it gone); its delivery log stays.
func Delete(ctx context.Context, db DB, tenant string, id pipeline.ID) error {
	tag, err := db.Exec(ctx, deleteSQL, tenant, [16]byte(id))
	if err != nil {
		return fmt.Errorf("delete subscription: %w", err)
	}
	if tag.RowsAffected() == 0 {
		return ErrNotFound
	}
	return nil
}

const rotateSQL = `UPDATE webhook_subscriptions SET secrets = ARRAY[$3, secrets[1]], updated_at = now()
	WHERE tenant = $1 AND id = $2 RETURNING ` + subscriptionColumns

// Rotate gives a subscription a new secret and keeps its newest previous
// one: deliveries are signed with both until DropPrevious, so a receiver
// can switch at its own pace. It returns the subscription with the new
// secret.
func Rotate(ctx context.Context, db DB, tenant string, id pipeline.ID) (Subscription, error) {
	s, err := scan(db.QueryRow(ctx, rotateSQL, tenant, [16]byte(id), NewSecret()))
	if errors.Is(err, pgx.ErrNoRows) {
		return Subscription{}, ErrNotFound
	}
	return s, err
}

const dropPreviousSQL = `UPDATE webhook_subscriptions SET secrets = secrets[1:1], updated_at = now()
	WHERE tenant = $1 AND id = $2 RETURNING ` + subscriptionColumns

// DropPrevious ends a rotation: only the newest secret signs.
func DropPrevious(ctx context.Context, db DB, tenant string, id pipeline.ID) (Subscription, error) {
	return one(ctx, db, dropPreviousSQL, tenant, id)
}

const enableSQL = `UPDATE webhook_subscriptions SET status = 'enabled', disabled_reason = NULL, failures = 0, open_until = NULL, updated_at = now()
	WHERE tenant = $1 AND id = $2 RETURNING ` + subscriptionColumns

// Enable enables a disabled subscription again (after a 410 was fixed);
// deliveries that ended dead meanwhile stay so (redeliver them).
func Enable(ctx context.Context, db DB, tenant string, id pipeline.ID) (Subscription, error) {
	return one(ctx, db, enableSQL, tenant, id)
}
