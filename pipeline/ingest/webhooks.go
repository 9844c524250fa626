package ingest

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"

	"github.com/jackc/pgx/v5"

	"github.com/onceflow/onceflow/pipeline"
	"github.com/onceflow/onceflow/pipeline/webhooks"
)

// The routes of a tenant's outbound webhook subscriptions
// (docs/webhooks.md#the-api). They read and write in a transaction scoped
// to the caller's tenant, so the tables' row-level security holds them to
// it as well as their own tenant predicate.
const (
	webhooksPattern        = "POST /v1/webhooks"
	webhooksListPattern    = "GET /v1/webhooks"
	webhookPattern         = "GET /v1/webhooks/{id}"
	webhookDeletePattern   = "DELETE /v1/webhooks/{id}"
	webhookRotatePattern   = "POST /v1/webhooks/{id}/rotate"
	webhookPreviousPattern = "DELETE /v1/webhooks/{id}/previous-secret"
	webhookEnablePattern   = "POST /v1/webhooks/{id}/enable"
	webhookDeliveryPattern = "GET /v1/webhooks/{id}/deliveries"
)

func (s *Server) webhookRoutes() {
	s.route(webhooksPattern, s.createWebhook)
	s.route(webhooksListPattern, s.scoped(false, func(ctx context.Context, db DB, tenant string, _ *http.Request) (any, int, error) {
		subs, err := webhooks.List(ctx, db, tenant)
		if err != nil {
			return nil, 0, err
		}
		capped, err := webhooks.TenantCapped(ctx, db, tenant)
		return map[string]any{"subscriptions": subs, "capped": capped}, http.StatusOK, err
	}))
	s.route(webhookPattern, s.withID(false, func(ctx context.Context, db DB, tenant string, id pipeline.ID, _ *http.Request) (any, int, error) {
		sub, err := webhooks.Get(ctx, db, tenant, id)
		return sub, http.StatusOK, err
	}))
	s.route(webhookDeletePattern, s.withID(true, func(ctx context.Context, db DB, tenant string, id pipeline.ID, _ *http.Request) (any, int, error) {
		return nil, http.StatusNoContent, webhooks.Delete(ctx, db, tenant, id)
	}))
	s.route(webhookRotatePattern, s.rotateWebhook)
	s.route(webhookPreviousPattern, s.withID(true, func(ctx context.Context, db DB, tenant string, id pipeline.ID, _ *http.Request) (any, int, error) {
		sub, err := webhooks.DropPrevious(ctx, db, tenant, id)
		return sub, http.StatusOK, err
	}))
	s.route(webhookEnablePattern, s.withID(true, func(ctx context.Context, db DB, tenant string, id pipeline.ID, _ *http.Request) (any, int, error) {
		sub, err := webhooks.Enable(ctx, db, tenant, id)
		return sub, http.StatusOK, err
	}))
	s.route(webhookDeliveryPattern, s.withID(false, func(ctx context.Context, db DB, tenant string, id pipeline.ID, r *http.Request) (any, int, error) {
		if _, err := webhooks.Get(ctx, db, tenant, id); err != nil {
			return nil, 0, err
		}
		f := webhooks.Filter{Tenant: tenant, Subscription: &id, Status: r.URL.Query().Get("status")}
		if v := r.URL.Query().Get("limit"); v != "" {
			n, err := strconv.Atoi(v)
			if err != nil || n < 1 || n > 1000 {
				return nil, 0, invalid(FieldError{"limit", "a whole number from 1 to 1000"})
			}
			f.Limit = n
		}
		if st := f.Status; st != "" && st != "pending" && st != "delivered" && st != "failed" && st != "dead" {
			return nil, 0, invalid(FieldError{"status", "pending, delivered, failed or dead"})
		}
		ds, err := webhooks.Deliveries(ctx, db, f)
		if err != nil {
			return nil, 0, err
		}
		// A delivery that stays pending may be one of a tenant at its cap:
		// the answer says so (null when not).
		capped, err := webhooks.TenantCapped(ctx, db, tenant)
		return map[string]any{"deliveries": ds, "capped": capped}, http.StatusOK, err
	}))
}

// scopedFunc serves a webhooks route inside the caller's scoped
// transaction: the answer's body and status, or an error (a *Problem, or
// webhooks' ErrNotFound, or a failure).
type scopedFunc func(ctx context.Context, db DB, tenant string, r *http.Request) (any, int, error)

func (s *Server) scoped(write bool, fn scopedFunc) handlerFunc {
	return func(w http.ResponseWriter, r *http.Request, c caller) *Problem {
		ctx, cancel := context.WithTimeout(r.Context(), s.cfg.RequestTimeout)
		defer cancel()
		var body any
		var status int
		run := func(ctx context.Context, db DB) (err error) {
			body, status, err = fn(ctx, db, c.tenant, r)
			return err
		}
		var err error
		if write {
			err = s.writeScoped(ctx, c, run)
		} else {
			err = s.readScoped(ctx, c, run)
		}
		var p *Problem
		switch {
		case errors.As(err, &p):
			return p
		case errors.Is(err, errRevoked):
			return s.revoked(r, c)
		case errors.Is(err, webhooks.ErrNotFound):
			return errNotFound
		case err != nil:
			return s.internal(r, err)
		case status == http.StatusNoContent:
			w.WriteHeader(status)
			return nil
		}
		writeJSON(w, status, body)
		return nil
	}
}

func (s *Server) withID(write bool, fn func(ctx context.Context, db DB, tenant string, id pipeline.ID, r *http.Request) (any, int, error)) handlerFunc {
	return s.scoped(write, func(ctx context.Context, db DB, tenant string, r *http.Request) (any, int, error) {
		id, err := pipeline.ParseID(r.PathValue("id"))
		if err != nil {
			return nil, 0, errNotFound // not one of the tenant's subscriptions
		}
		return fn(ctx, db, tenant, id, r)
	})
}

// createWebhook is POST /v1/webhooks: {"url", "event_types"}. The
// Idempotency-Key names the subscription (its id is derived from it): the
// same key with the same request answers the same subscription again
// (200, Idempotent-Replayed: true, without its secret: shown once), with
// another request 409.
func (s *Server) createWebhook(w http.ResponseWriter, r *http.Request, c caller) *Problem {
	key, body, p := keyedBody(r, s.cfg.MaxBodyBytes)
	if p != nil {
		return p
	}
	obj, errs, p := decodeObject(body, "url", "event_types")
	if p != nil {
		return p
	}
	url, _ := obj.str("url", &errs)
	var types []string
	if raw, ok := obj["event_types"]; ok && string(raw) != "null" {
		if err := json.Unmarshal(raw, &types); err != nil {
			errs = append(errs, FieldError{"event_types", "must be an array of event type names"})
		}
	}
	if len(errs) == 0 {
		for _, fe := range webhooks.Check(url, types) {
			errs = append(errs, FieldError{fe.Field, fe.Message})
		}
	}
	if len(errs) > 0 {
		return invalid(errs...)
	}
	var sub webhooks.Subscription
	var created bool
	return s.scoped(true, func(ctx context.Context, db DB, tenant string, _ *http.Request) (any, int, error) {
		var err error
		sub, created, err = webhooks.Create(ctx, db, tenant, key, url, types)
		switch {
		case errors.Is(err, webhooks.ErrConflict):
			return nil, 0, errKeyReused
		case errors.Is(err, webhooks.ErrTooMany):
			return nil, 0, problem(http.StatusConflict, "too-many-webhooks", "Too many subscriptions",
				fmt.Sprintf("a tenant has at most %d; delete one first", webhooks.MaxSubscriptions))
		case err != nil:
			return nil, 0, err
		}
		w.Header().Set("Location", "/v1/webhooks/"+sub.ID.String())
		if !created {
			w.Header().Set("Idempotent-Replayed", "true")
			return sub, http.StatusOK, nil
		}
		return sub, http.StatusCreated, nil
	})(w, r, c)
}

// writeScoped is readScoped for a write: a read-write transaction scoped
// to c's tenant, committed when write succeeds.
func (s *Server) writeScoped(ctx context.Context, c caller, write func(ctx context.Context, db DB) error) error {
	return pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		var tenant string
		if err := tx.QueryRow(ctx, scopeSQL, c.keyHash).Scan(&tenant); err != nil {
			return fmt.Errorf("scope the write: %w", err)
		}
		if tenant != c.tenant {
			return errRevoked
		}
		return write(ctx, tx)
	})
}

const (
	// keyLockSQL is the advisory lock of a (tenant, Idempotency-Key), the
	// one accepts take (lockKeysSQL), so a rotate and a command with the
	// same key wait for each other.
	keyLockSQL = `SELECT pg_advisory_xact_lock(hashtextextended($1 || '/' || $2, 0))`
	// keyRecordSQL is the key's record inside the retention, if any.
	keyRecordSQL = `SELECT route, command_id, response_body FROM idempotency_keys
		WHERE tenant = $1 AND key = $2 AND created_at > now() - make_interval(secs => $3) AND created_at < now() + interval '1 day'
		ORDER BY created_at DESC LIMIT 1`
	// countReplaySQL counts a replay on the key's record, as accepts count
	// theirs (`onceflow idempotency-check`). A conflict's 409 rolls the
	// transaction back, so a rotate's conflicts are not counted.
	countReplaySQL = `UPDATE idempotency_keys SET replays = replays + 1, last_seen_at = now()
		WHERE tenant = $1 AND key = $2 AND created_at > now() - make_interval(secs => $3) AND created_at < now() + interval '1 day'`
	// rememberRotateSQL records a rotation's answer under its key.
	rememberRotateSQL = `INSERT INTO idempotency_keys (tenant, key, route, request_hash, command_id, response_status, response_headers, response_body)
		VALUES ($1, $2, $3, $4, $5, 200, '{}', $6)`
)

// rotateWebhook is POST /v1/webhooks/{id}/rotate: a new secret, the
// previous one signing too. With an Idempotency-Key, the rotation and its
// answer are remembered under the key for the idempotency retention, as a
// command's are: the same key again answers the same rotation, its secret
// included (Idempotent-Replayed: true), and rotates nothing. Rotating
// twice would drop the secret the receiver still verifies with, for a
// client that only lost the first answer. The same key on another route or
// subscription is a 409. Without a key each call rotates.
func (s *Server) rotateWebhook(w http.ResponseWriter, r *http.Request, c caller) *Problem {
	key := ""
	if len(r.Header.Values("Idempotency-Key")) > 0 {
		var p *Problem
		if key, p = idempotencyKey(r); p != nil {
			return p
		}
	}
	return s.withID(true, func(ctx context.Context, db DB, tenant string, id pipeline.ID, _ *http.Request) (any, int, error) {
		if key == "" {
			sub, err := webhooks.Rotate(ctx, db, tenant, id)
			return sub, http.StatusOK, err
		}
		if _, err := db.Exec(ctx, keyLockSQL, tenant, key); err != nil {
			return nil, 0, fmt.Errorf("lock the Idempotency-Key: %w", err)
		}
		var route string
		var made [16]byte
		var answer []byte
		retention := s.cfg.IdempotencyRetention.Seconds()
		err := db.QueryRow(ctx, keyRecordSQL, tenant, key, retention).Scan(&route, &made, &answer)
		switch {
		case err == nil && (route != webhookRotatePattern || pipeline.ID(made) != id):
			return nil, 0, errKeyReused
		case err == nil:
			if _, err := db.Exec(ctx, countReplaySQL, tenant, key, retention); err != nil {
				return nil, 0, fmt.Errorf("count the replay: %w", err)
			}
			w.Header().Set("Idempotent-Replayed", "true")
			return json.RawMessage(answer), http.StatusOK, nil
		case !errors.Is(err, pgx.ErrNoRows):
			return nil, 0, fmt.Errorf("read the Idempotency-Key: %w", err)
		}
		sub, err := webhooks.Rotate(ctx, db, tenant, id)
		if err != nil {
			return nil, 0, err
		}
		answer, err = json.Marshal(sub) // #nosec G117 -- the answer that shows the new secret, kept under its key so that a retry answers it again (docs/decisions/0048-webhook-subscriptions-and-secrets.md)
		if err != nil {
			return nil, 0, err
		}
		hash := sha256.Sum256([]byte(webhookRotatePattern + " " + id.String()))
		if _, err := db.Exec(ctx, rememberRotateSQL, tenant, key, webhookRotatePattern, hash[:], [16]byte(id), answer); err != nil {
			return nil, 0, fmt.Errorf("remember the rotation: %w", err)
		}
		return json.RawMessage(answer), http.StatusOK, nil
	})(w, r, c)
}
