package ingest

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"

	"github.com/onceflow/onceflow/pipeline"
)

// commandStatus is the body of GET /v1/commands/{id}: the command's own
// status (status, reason, detail, event_ids: what its decision was), the
// outcome of the command with every command it led to, and those commands
// (docs/ingest.md#outcome).
type commandStatus struct {
	CommandID   string           `json:"command_id"`
	Status      string           `json:"status"`
	CommandType string           `json:"command_type"`
	AggregateID string           `json:"aggregate_id"`
	Reason      *string          `json:"reason,omitempty"`
	Detail      *string          `json:"detail,omitempty"`
	EventIDs    []string         `json:"event_ids"`
	Outcome     commandOutcome   `json:"outcome"`
	Derived     []derivedCommand `json:"derived"`
}

// commandOutcome is pipeline.Outcome in the body.
type commandOutcome struct {
	Status      string `json:"status"`
	Reason      string `json:"reason,omitempty"`
	Detail      string `json:"detail,omitempty"`
	CommandID   string `json:"command_id,omitempty"`
	AggregateID string `json:"aggregate_id,omitempty"`
	CommandType string `json:"command_type,omitempty"`
}

// derivedCommand is a command the command led to, with its own status
// and the command that sent it.
type derivedCommand struct {
	CommandID        string   `json:"command_id"`
	Status           string   `json:"status"`
	CommandType      string   `json:"command_type"`
	AggregateID      string   `json:"aggregate_id"`
	Reason           *string  `json:"reason,omitempty"`
	Detail           *string  `json:"detail,omitempty"`
	EventIDs         []string `json:"event_ids"`
	CauseCommandID   string   `json:"cause_command_id"`
	CauseAggregateID string   `json:"cause_aggregate_id"`
}

// Bounds of the commands an answer lists under a command: MaxDerived in
// all, MaxDerivedDepth commands deep (a cause, what it sent, what that
// sent, ...); getDerivedSQL spells the depth. A saga beyond them is
// answered with what is within.
const (
	MaxDerived      = 100
	MaxDerivedDepth = 8
)

// getCommandSQL reads a command of the caller's tenant. A command id is
// unique only within its aggregate: a tenant's direct Kafka producers may
// have used one id on several aggregates (or reused an id ingest minted),
// and each is its own command. With ?aggregate_id= ($3) the caller names
// which; without, the answer is the command ingest accepted under that id
// (the one its 202's Location names), else the earliest
// (docs/decisions/0002-get-command-answers-ingests-command.md).
//
// led says whether the command led to other commands: whether any row
// names it as its cause (sql/00048).
const getCommandSQL = `SELECT aggregate_id, status, command_type, reason, detail, event_ids::text[],
		EXISTS (SELECT 1 FROM command_status AS d
			WHERE d.cause_command_id = $1 AND d.tenant = $2 AND d.cause_aggregate_id = c.aggregate_id)
	FROM command_status AS c
	WHERE command_id = $1 AND tenant = $2 AND ($3::text IS NULL OR aggregate_id = $3)
	ORDER BY ingested DESC, created_at, aggregate_id
	LIMIT 1`

// getDerivedSQL reads the commands that commands of id $1 in tenant $2
// led to, down the causes (sql/00048's index), a cause before what it
// sent: MaxDerivedDepth deep, and twice MaxDerived rows, of which
// derivedOf keeps those under the command getCommandSQL found (another
// command of the same id, on another aggregate, may have led to some). It
// names no aggregate, so that its parameters give a plan made for their
// values nothing to gain: Postgres keeps the generic plan of the prepared
// statement instead of planning the recursion again at each read.
const getDerivedSQL = `WITH RECURSIVE derived AS (
		SELECT command_id, aggregate_id, status, command_type, reason, detail, event_ids, created_at,
			cause_command_id, cause_aggregate_id, 1 AS depth
		FROM command_status
		WHERE cause_command_id = $1 AND tenant = $2
		UNION ALL
		SELECT c.command_id, c.aggregate_id, c.status, c.command_type, c.reason, c.detail, c.event_ids, c.created_at,
			c.cause_command_id, c.cause_aggregate_id, d.depth + 1
		FROM derived AS d JOIN command_status AS c
			ON c.cause_command_id = d.command_id AND c.tenant = $2 AND c.cause_aggregate_id = d.aggregate_id
		WHERE d.depth < 8
	)
	SELECT command_id::text, aggregate_id, status, command_type, reason, detail, event_ids::text[],
		cause_command_id::text, cause_aggregate_id
	FROM derived
	ORDER BY depth, created_at, command_id
	LIMIT 200`

// getCommand answers a command's status and its outcome. With ?wait=D (a
// Go duration such as 5s, or seconds) it long-polls: it answers as soon
// as the status is terminal (accepted, rejected or failed), or, with
// ?for=outcome, as soon as the outcome is (completed, rejected, failed or
// compensated: no command it led to is pending), or after D (capped at
// MaxWait). The projector notifies the outcomes it commits (wakeups), so
// the rows are read again when an outcome of the command, or, with
// ?for=outcome, of a command it led to that was pending, may be in them,
// and at least every WaitPoll besides, for a notification the listening
// connection missed: a waiting client costs a goroutine and a few cheap
// reads. At most MaxWaits clients wait at once, MaxWaitsPerTenant of one
// tenant, so one tenant's waiters cannot take the database's time from
// everyone's; a wait beyond them answers at once, as a wait that ran out
// would, with Retry-After: 1 when what it waits for is still pending.
// ?aggregate_id= chooses among commands of the same id (getCommandSQL).
func (s *Server) getCommand(w http.ResponseWriter, r *http.Request, caller caller) *Problem {
	wait, p := parseWait(r.URL.Query().Get("wait"), s.cfg.MaxWait)
	if p != nil {
		return p
	}
	forOutcome := false
	switch r.URL.Query().Get("for") {
	case "", "status":
	case "outcome":
		forOutcome = true
	default:
		return invalid(FieldError{"for", "must be status (the command's own decision, the default) or outcome (the command with every command it led to)"})
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
		// The write timeout bounds what a request takes besides its wait.
		if err := http.NewResponseController(w).SetWriteDeadline(deadline.Add(s.cfg.WriteTimeout)); err != nil {
			s.logger.Warn("cannot extend a wait's write deadline; the wait may be cut at the write timeout", "err", err)
		}
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
	done := func(c commandStatus) bool {
		if forOutcome {
			return c.Outcome.Status != pipeline.OutcomePending
		}
		return c.Status != "pending"
	}
	// The commands whose outcome ends or advances the wait: the command,
	// and with ?for=outcome those it led to that are pending. A command
	// first seen pending in a read was not registered before it: the rows
	// are read again with it registered, so its outcome, committed in
	// between, is not missed.
	watched := []pipeline.ID{id}
	for {
		woken, forget := s.wake.wait(watched...)
		c, err := s.loadCommand(r.Context(), id, caller, aggregate)
		left := time.Until(deadline)
		if err != nil || done(c) || left <= 0 {
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
		if done(c) || left <= 0 {
			if refused && !done(c) {
				w.Header().Set("Retry-After", "1")
			}
			writeJSON(w, http.StatusOK, c)
			return nil
		}
		if forOutcome {
			if more := c.pendingDerived(watched); len(more) > 0 {
				forget()
				watched = append(watched, more...)
				continue
			}
		}
		if !s.awaitWakeup(r.Context(), woken, forget, left) {
			return nil // the client is gone
		}
	}
}

// pendingDerived are the commands c led to that are pending and not
// among watched.
func (c commandStatus) pendingDerived(watched []pipeline.ID) []pipeline.ID {
	var more []pipeline.ID
	for _, d := range c.Derived {
		if d.Status != "pending" {
			continue
		}
		id, err := pipeline.ParseID(d.CommandID)
		if err == nil && !slices.Contains(watched, id) && !slices.Contains(more, id) {
			more = append(more, id)
		}
	}
	return more
}

// loadCommand reads a command of the caller's, and the commands it led
// to, in transactions scoped to its tenant (scope.go): errRevoked if the
// key is no longer active, pgx.ErrNoRows if there is no such command.
//
// The scope and the command's read are one batch without BEGIN and
// COMMIT: Postgres runs what a pipeline sends before its Sync (pgx sends
// one, after the last statement) as one implicit transaction, so the
// scope holds for the read and ends with it. Its own statements write
// nothing, so a read-only transaction (a Query's, readScoped) would add
// two statements per outcome read and guard nothing. The read says
// whether the command led to any other (getCommandSQL's led, a probe of
// sql/00048's index); only then does a second round trip, scoped again,
// read them (getDerivedSQL): most commands lead to none, and a read of
// one costs what it did. The second read comes after the first, so a
// command read as decided has in it every command its decision sent (the
// projector records them in the same transaction).
func (s *Server) loadCommand(ctx context.Context, id pipeline.ID, caller caller, aggregate *string) (commandStatus, error) {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.RequestTimeout)
	defer cancel()
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		return commandStatus{}, fmt.Errorf("acquire a connection: %w", err)
	}
	defer conn.Release()
	s.metrics.commandReads.Inc()
	c := commandStatus{CommandID: id.String(), Derived: []derivedCommand{}}
	var tenant string
	found, led := false, false
	b := &pgx.Batch{}
	b.Queue(scopeSQL, caller.keyHash).QueryRow(func(row pgx.Row) error { return row.Scan(&tenant) })
	b.Queue(getCommandSQL, id.String(), caller.tenant, aggregate).Query(func(rows pgx.Rows) error {
		for rows.Next() {
			found = true
			if err := rows.Scan(&c.AggregateID, &c.Status, &c.CommandType, &c.Reason, &c.Detail, &c.EventIDs, &led); err != nil {
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
	if led {
		var derived []derivedCommand
		b := &pgx.Batch{}
		b.Queue(scopeSQL, caller.keyHash).QueryRow(func(row pgx.Row) error { return row.Scan(&tenant) })
		b.Queue(getDerivedSQL, id.String(), caller.tenant).Query(func(rows pgx.Rows) error {
			for rows.Next() {
				var d derivedCommand
				if err := rows.Scan(&d.CommandID, &d.AggregateID, &d.Status, &d.CommandType, &d.Reason, &d.Detail, &d.EventIDs,
					&d.CauseCommandID, &d.CauseAggregateID); err != nil {
					return err
				}
				if d.EventIDs == nil {
					d.EventIDs = []string{}
				}
				derived = append(derived, d)
			}
			return rows.Err()
		})
		if err := conn.SendBatch(ctx, b).Close(); err != nil {
			return commandStatus{}, err
		}
		if tenant != caller.tenant {
			return commandStatus{}, errRevoked
		}
		c.Derived = derivedOf(c.CommandID, c.AggregateID, derived)
	}
	c.Outcome = c.outcome()
	return c, nil
}

// derivedOf are the commands of rows (a cause before what it sent) under
// the command id of aggregate, at most MaxDerived.
func derivedOf(id, aggregate string, rows []derivedCommand) []derivedCommand {
	type key struct{ id, aggregate string }
	under := map[key]bool{{id, aggregate}: true}
	out := []derivedCommand{}
	for _, d := range rows {
		if len(out) == MaxDerived {
			break
		}
		if under[key{d.CauseCommandID, d.CauseAggregateID}] {
			under[key{d.CommandID, d.AggregateID}] = true
			out = append(out, d)
		}
	}
	return out
}

// outcome is pipeline.OutcomeOf c and the commands it led to.
func (c commandStatus) outcome() commandOutcome {
	state := func(id, aggregate, cmdType, status string, reason, detail *string) pipeline.CommandState {
		cs := pipeline.CommandState{CommandID: id, AggregateID: aggregate, CommandType: cmdType, Status: status}
		if reason != nil {
			cs.Reason = *reason
		}
		if detail != nil {
			cs.Detail = *detail
		}
		return cs
	}
	derived := make([]pipeline.CommandState, len(c.Derived))
	for i, d := range c.Derived {
		derived[i] = state(d.CommandID, d.AggregateID, d.CommandType, d.Status, d.Reason, d.Detail)
		derived[i].CauseID, derived[i].CauseAggregateID = d.CauseCommandID, d.CauseAggregateID
	}
	o := pipeline.OutcomeOf(state(c.CommandID, c.AggregateID, c.CommandType, c.Status, c.Reason, c.Detail), derived)
	return commandOutcome{Status: o.Status, Reason: o.Reason, Detail: o.Detail, CommandID: o.CommandID, AggregateID: o.AggregateID, CommandType: o.CommandType}
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
