package ingest

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"

	"github.com/onceflow/onceflow/pipeline"
)

// commandStatus is the body of GET /v1/commands/{id}.
type commandStatus struct {
	CommandID   string   `json:"command_id"`
	Status      string   `json:"status"`
	CommandType string   `json:"command_type"`
	AggregateID string   `json:"aggregate_id"`
	Reason      *string  `json:"reason,omitempty"`
	Detail      *string  `json:"detail,omitempty"`
	EventIDs    []string `json:"event_ids"`
}

// getCommandSQL reads a command of the caller's tenant. A command id is
// unique only within its aggregate: a tenant's direct Kafka producers may
// have used one id on several aggregates (or reused an id ingest minted),
// and each is its own command. With ?aggregate_id= ($3) the caller names
// which; without, the answer is the command ingest accepted under that id
// (the one its 202's Location names), else the earliest
// (docs/decisions.md).
const getCommandSQL = `SELECT aggregate_id, status, command_type, reason, detail, event_ids::text[]
	FROM command_status
	WHERE command_id = $1 AND tenant = $2 AND ($3::text IS NULL OR aggregate_id = $3)
	ORDER BY ingested DESC, created_at, aggregate_id
	LIMIT 1`

// getCommand answers a command's status. With ?wait=D (a Go duration such
// as 5s, or seconds) it long-polls: it answers as soon as the status is
// terminal (accepted, rejected or failed), or with the pending status after
// D (capped at MaxWait). The projector notifies the outcomes it commits
// (wakeups), so the row is read again when its command's outcome may be in
// it, and at least every WaitPoll besides, for a notification the
// listening connection missed: a waiting client costs a goroutine and a
// few cheap reads. At most MaxWaits clients wait at once, MaxWaitsPerTenant
// of one tenant, so one tenant's waiters cannot take the database's time
// from everyone's; a wait beyond them answers at once, as a wait that ran
// out would, with Retry-After: 1 when the command is still pending.
// ?aggregate_id= chooses among commands of the same id (getCommandSQL).
func (s *Server) getCommand(w http.ResponseWriter, r *http.Request, caller caller) *Problem {
	wait, p := parseWait(r.URL.Query().Get("wait"), s.cfg.MaxWait)
	if p != nil {
		return p
	}
	var aggregate *string
	if q := r.URL.Query(); q.Has("aggregate_id") {
		// Another tenant's aggregate is simply not found (404); only what
		// cannot be an aggregate id at all (nor a Postgres string) is a 422.
		a := q.Get("aggregate_id")
		if _, _, err := pipeline.SplitAggregateID(a); err != nil || !utf8.ValidString(a) || strings.ContainsRune(a, 0) {
			return invalid(FieldError{"aggregate_id", "must be an aggregate id as this route returns it: tenant/account-id"})
		}
		aggregate = &a
	}
	id, err := pipeline.ParseID(r.PathValue("id"))
	if err != nil {
		return errNotFound
	}
	refused := false
	if wait > 0 {
		ok, limit := s.waits.acquire(caller.tenant)
		if ok {
			defer s.waits.release(caller.tenant)
			s.metrics.waits.Inc()
			defer s.metrics.waits.Dec()
		} else {
			s.metrics.waitsRefused.WithLabelValues(limit).Inc()
			wait, refused = 0, true
		}
	}
	deadline := time.Now().Add(wait)
	if wait > 0 {
		// A command this process accepted moments ago, whose outcome no
		// notification has named since, is pending: its first wait need
		// not read the row, the notification that ends it wakes the wait
		// registered here, and the read after it answers (every answer
		// comes from a read, which also checks the key again). That is one
		// read per outcome instead of two when the client asks right after
		// its 202, as clients do. A missed notification costs WaitPoll, as
		// it does any wait.
		woken, forget := s.wake.wait(id)
		if !s.wake.takeFresh(id, caller.tenant, aggregate) {
			forget()
		} else if !s.awaitWakeup(r.Context(), woken, forget, wait) {
			return nil // the client is gone
		}
	}
	for {
		woken, forget := s.wake.wait(id)
		c, err := s.loadCommand(r.Context(), id, caller, aggregate)
		left := time.Until(deadline)
		if err != nil || c.Status != "pending" || left <= 0 {
			// Every answer forgets its registration: one left behind by a
			// 404 cost memory for as long as the process ran, and anyone
			// with a key could ask for any number of ids.
			forget()
		}
		if errors.Is(err, errRevoked) {
			return s.revoked(r, caller)
		}
		if errors.Is(err, pgx.ErrNoRows) {
			// Ingest writes the pending row with the command, so a command
			// of this tenant that exists is always found: no need to wait.
			return errNotFound
		}
		if err != nil {
			return s.internal(r, err)
		}
		if c.Status != "pending" || left <= 0 {
			if refused && c.Status == "pending" {
				w.Header().Set("Retry-After", "1")
			}
			writeJSON(w, http.StatusOK, c)
			return nil
		}
		if !s.awaitWakeup(r.Context(), woken, forget, left) {
			return nil // the client is gone
		}
	}
}

// loadCommand reads a command of the caller's in a transaction scoped to
// its tenant (scope.go), in one round trip: errRevoked if the key is no
// longer active, pgx.ErrNoRows if there is no such command.
//
// The two statements are one batch without BEGIN and COMMIT: Postgres runs
// what a pipeline sends before its Sync (pgx sends one, after the last
// statement) as one implicit transaction, so the scope holds for the read
// and ends with it. Its own statements write nothing, so a read-only
// transaction (a Query's, readScoped) would add two statements per
// outcome read and guard nothing.
func (s *Server) loadCommand(ctx context.Context, id pipeline.ID, caller caller, aggregate *string) (commandStatus, error) {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.RequestTimeout)
	defer cancel()
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		return commandStatus{}, fmt.Errorf("acquire a connection: %w", err)
	}
	defer conn.Release()
	s.metrics.commandReads.Inc()
	c := commandStatus{CommandID: id.String()}
	var tenant string
	found := false
	b := &pgx.Batch{}
	b.Queue(scopeSQL, caller.keyHash).QueryRow(func(row pgx.Row) error { return row.Scan(&tenant) })
	b.Queue(getCommandSQL, id.String(), caller.tenant, aggregate).Query(func(rows pgx.Rows) error {
		for rows.Next() {
			found = true
			if err := rows.Scan(&c.AggregateID, &c.Status, &c.CommandType, &c.Reason, &c.Detail, &c.EventIDs); err != nil {
				return err
			}
		}
		return rows.Err()
	})
	if err := conn.SendBatch(ctx, b).Close(); err != nil {
		return commandStatus{}, err
	}
	switch {
	case tenant != caller.tenant:
		return commandStatus{}, errRevoked
	case !found:
		return commandStatus{}, pgx.ErrNoRows
	}
	if c.EventIDs == nil {
		c.EventIDs = []string{}
	}
	return c, nil
}

// awaitWakeup waits for woken, a command's outcome notification, at most
// WaitPoll and d, and reports false if the client went away meanwhile. A
// registration that did not fire is forgotten.
func (s *Server) awaitWakeup(ctx context.Context, woken <-chan struct{}, forget func(), d time.Duration) bool {
	select {
	case <-ctx.Done():
		forget()
		return false
	case <-woken:
	case <-time.After(min(s.cfg.WaitPoll, d)):
		forget()
	}
	return true
}

// parseWait reads ?wait=: a Go duration (5s, 1500ms) or whole seconds.
func parseWait(v string, maxWait time.Duration) (time.Duration, *Problem) {
	if v == "" {
		return 0, nil
	}
	d, err := time.ParseDuration(v)
	if err != nil {
		n, nerr := strconv.Atoi(v)
		if nerr != nil {
			return 0, invalid(FieldError{"wait", "must be a duration such as 5s, or a number of seconds"})
		}
		d = time.Duration(min(n, 1<<30)) * time.Second
	}
	if d < 0 {
		return 0, invalid(FieldError{"wait", "must not be negative"})
	}
	return min(d, maxWait), nil
}
