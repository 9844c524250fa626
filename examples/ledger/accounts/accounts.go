// Package accounts is the ledger's read model: the accounts table, its
// migrations, the projection of the account events onto it and the
// account as GET /v1/accounts/{id} answers it. ledgerapp declares it in the
// ledger's Domain; the library's tests use it as the read model of a real
// domain without the application around it. It imports the vocabulary
// (package pipeline) and nothing else of onceflow.
package accounts

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/onceflow/onceflow/examples/ledger"
	"github.com/onceflow/onceflow/pipeline"
)

//go:embed migrations/*.sql
var migrationFiles embed.FS

// Migrations are the accounts table's goose migrations (NNNNN_name.sql at
// the root): the ledger domain's Migrations. (fs.Sub fails only on an
// invalid path, which "migrations" is not.)
var Migrations, _ = fs.Sub(migrationFiles, "migrations")

// The ledger's projections are batch projections: the projector hands them
// a poll batch at a time and each writes it with a few set-based statements.
// Their SQL names tables without a schema, so a rebuild can point them at
// shadow tables through the search path (see pipeline/projector).

// Projection projects account events onto the accounts table. Versions
// are guarded: an account's events in a batch are folded in Go on top of
// the stored version (a duplicate is at or below it, a gap above it + 1)
// and written by a statement that matches only the version they follow.
type Projection struct{}

var _ pipeline.BatchProjection[pgx.Tx] = Projection{}

// Name implements pipeline.Projection.
func (Projection) Name() string { return "accounts" }

// Tables names what a rebuild of accounts rebuilds.
func (Projection) Tables() []string { return []string{"accounts"} }

const (
	accountVersionsSQL = `SELECT a.tenant, a.account_id, a.version
		FROM unnest($1::text[], $2::text[]) AS k(tenant, account_id)
		JOIN accounts a ON a.tenant = k.tenant AND a.account_id = k.account_id`
	insertAccountsSQL = `INSERT INTO accounts (tenant, account_id, currency, balance, status, version, updated_at)
		SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::bigint[], $5::text[], $6::bigint[], $7::timestamptz[])
		ON CONFLICT (tenant, account_id) DO NOTHING`
	// The version guard: a row is written only at the version the folded
	// events follow.
	updateAccountsSQL = `UPDATE accounts a SET
			balance = a.balance + v.delta,
			status = CASE WHEN v.closed THEN 'closed' ELSE a.status END,
			version = v.version,
			updated_at = v.at
		FROM unnest($1::text[], $2::text[], $3::bigint[], $4::bool[], $5::bigint[], $6::timestamptz[], $7::bigint[])
			AS v(tenant, account_id, delta, closed, version, at, expected)
		WHERE a.tenant = v.tenant AND a.account_id = v.account_id AND a.version = v.expected`
)

// account is one account's events of a batch, folded.
type account struct {
	tenant, id string
	exists     bool  // a row is stored
	stored     int64 // its version (0 when none)
	version    int64 // after the events applied so far
	delta      int64
	currency   string
	closed     bool
	at         time.Time
	gap        error // set once a gap is found: later events are not applied
}

// Apply implements pipeline.Projection.
func (a Projection) Apply(ctx context.Context, tx pgx.Tx, ev pipeline.Event) error {
	return pipeline.ApplyOne(ctx, tx, a, ev)
}

// ApplyBatch implements pipeline.BatchProjection.
func (Projection) ApplyBatch(ctx context.Context, tx pgx.Tx, evs []pipeline.Event) ([]error, error) {
	out := make([]error, len(evs))
	b := batchOf(evs, out)
	if len(b.order) == 0 {
		return out, nil
	}
	if err := b.readVersions(ctx, tx); err != nil {
		return nil, err
	}
	for i, ev := range evs {
		if a := b.byID[ev.AggregateID]; a != nil && out[i] == nil && !leavesAccount(ev) {
			out[i] = a.fold(ev)
		}
	}
	return out, b.write(ctx, tx)
}

// batch is the accounts a batch's events change, by aggregate id and in
// the order they first appear.
type batch struct {
	byID  map[string]*account
	order []*account
}

// batchOf finds the accounts evs change; an event whose aggregate id
// does not parse gets its permanent error in out.
func batchOf(evs []pipeline.Event, out []error) batch {
	b := batch{byID: make(map[string]*account)}
	for i, ev := range evs {
		if leavesAccount(ev) {
			continue // a rejection or a failure leaves the account as it is
		}
		if _, ok := b.byID[ev.AggregateID]; ok {
			continue
		}
		tenant, id, err := pipeline.SplitAggregateID(ev.AggregateID)
		if err != nil {
			out[i] = pipeline.Permanent(err)
			continue
		}
		a := &account{tenant: tenant, id: id}
		b.byID[ev.AggregateID] = a
		b.order = append(b.order, a)
	}
	return b
}

// readVersions reads the stored version of each account that has a row.
func (b batch) readVersions(ctx context.Context, tx pgx.Tx) error {
	tenants, ids := make([]string, len(b.order)), make([]string, len(b.order))
	for i, a := range b.order {
		tenants[i], ids[i] = a.tenant, a.id
	}
	rows, err := tx.Query(ctx, accountVersionsSQL, tenants, ids)
	if err != nil {
		return fmt.Errorf("read account versions: %w", err)
	}
	var tenant, id string
	var version int64
	_, err = pgx.ForEachRow(rows, []any{&tenant, &id, &version}, func() error {
		a := b.byID[pipeline.AggregateID(tenant, id)]
		a.exists, a.stored, a.version = true, version, version
		return nil
	})
	if err != nil {
		return fmt.Errorf("read account versions: %w", err)
	}
	return nil
}

// fold applies ev, the account's next event in the batch, to what the
// batch writes, and returns its outcome: nil, a duplicate, or the gap
// that stops the account's later events.
func (a *account) fold(ev pipeline.Event) error {
	switch {
	case a.gap != nil:
		return a.gap
	case ev.Version <= a.version:
		return pipeline.ErrDuplicate
	case ev.Version > a.version+1:
		a.gap = pipeline.CheckVersion(ev.AggregateID, a.version, ev.Version)
		return a.gap
	}
	opened, isOpen := ev.Payload.(ledger.AccountOpened)
	if !a.exists && a.version == 0 && !isOpen {
		// An account's first event must open it: anything else means
		// the opening is missing.
		a.gap = &pipeline.VersionGapError{AggregateID: ev.AggregateID, Stored: 0, Got: ev.Version}
		return a.gap
	}
	switch e := ev.Payload.(type) {
	case ledger.AccountOpened:
		a.currency = opened.Currency
	case ledger.AccountClosed:
		a.closed = true
	case ledger.Deposited:
		a.delta += e.Amount
	case ledger.Withdrawn:
		a.delta -= e.Amount
	case ledger.TransferDebited:
		a.delta -= e.Amount
	case ledger.TransferCredited:
		a.delta += e.Amount
	case ledger.TransferRefunded:
		a.delta += e.Amount
	}
	// Any other event of the account still moves its version: the
	// account changed in a way this read model does not show.
	a.version = ev.Version
	a.at = ev.Time
	return nil
}

// write inserts the new accounts and updates the others, each at the
// version its events follow.
func (b batch) write(ctx context.Context, tx pgx.Tx) error {
	var ins, upd accountColumns
	for _, a := range b.order {
		if a.version == a.stored {
			continue // nothing new (duplicates, a gap first, rejections or failures only)
		}
		if a.exists {
			upd.add(a)
		} else {
			ins.add(a)
		}
	}
	if n := len(ins.tenant); n > 0 {
		tag, err := tx.Exec(ctx, insertAccountsSQL, ins.tenant, ins.id, ins.currency, ins.delta, ins.status, ins.version, ins.at)
		if err != nil {
			return fmt.Errorf("insert accounts: %w", err)
		}
		if tag.RowsAffected() != int64(n) {
			return fmt.Errorf("insert accounts: %d of %d rows written: %w", tag.RowsAffected(), n, errConcurrentWrite)
		}
	}
	if n := len(upd.tenant); n > 0 {
		tag, err := tx.Exec(ctx, updateAccountsSQL, upd.tenant, upd.id, upd.delta, upd.closed, upd.version, upd.at, upd.expected)
		if err != nil {
			return fmt.Errorf("update accounts: %w", err)
		}
		if tag.RowsAffected() != int64(n) {
			return fmt.Errorf("update accounts: %d of %d rows at the expected version: %w", tag.RowsAffected(), n, errConcurrentWrite)
		}
	}
	return nil
}

// leavesAccount reports an event that does not change its aggregate: a
// CommandRejected or CommandFailed carries the aggregate's current version
// and moves nothing.
func leavesAccount(ev pipeline.Event) bool {
	switch ev.Payload.(type) {
	case pipeline.CommandRejected, pipeline.CommandFailed:
		return true
	}
	return false
}

// errConcurrentWrite: a row changed between reading its version and writing
// it. The projector serializes the writers of a partition, so this means a
// writer from outside the projector; the batch is rolled back and retried.
var errConcurrentWrite = errors.New("read model changed concurrently")

// accountColumns are the arrays one statement writes.
type accountColumns struct {
	tenant, id, currency, status []string
	delta, version, expected     []int64
	closed                       []bool
	at                           []time.Time
}

func (c *accountColumns) add(a *account) {
	status := "open"
	if a.closed {
		status = "closed"
	}
	c.tenant = append(c.tenant, a.tenant)
	c.id = append(c.id, a.id)
	c.currency = append(c.currency, a.currency)
	c.status = append(c.status, status)
	c.delta = append(c.delta, a.delta)
	c.version = append(c.version, a.version)
	c.expected = append(c.expected, a.stored)
	c.closed = append(c.closed, a.closed)
	c.at = append(c.at, a.at)
}

// Account is the answer of GET /v1/accounts/{id}.
type Account struct {
	AccountID string `json:"account_id"`
	Balance   int64  `json:"balance" doc:"Minor units."`
	Currency  string `json:"currency"`
	Status    string `json:"status" doc:"open or closed."`
	Version   int64  `json:"version" doc:"The aggregate version of the last event applied."`
}

const getAccountSQL = `SELECT balance, currency, status, version FROM accounts WHERE tenant = $1 AND account_id = $2`

// Reader is what Get reads through: the tenant's read-only transaction of
// a query (onceflow.DB).
type Reader interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Get reads the tenant's account id; found is false for an account the
// tenant does not have, or an id that names nothing.
func Get(ctx context.Context, db Reader, tenant, id string) (a Account, found bool, err error) {
	a = Account{AccountID: id}
	if pipeline.ValidateLocalID(id) != nil {
		return Account{}, false, nil // names nothing, like an id that does not exist
	}
	err = db.QueryRow(ctx, getAccountSQL, tenant, id).Scan(&a.Balance, &a.Currency, &a.Status, &a.Version)
	if errors.Is(err, pgx.ErrNoRows) {
		return Account{}, false, nil
	}
	return a, err == nil, err
}
