package ledger

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/onceflow/onceflow/pipeline"
)

// The ledger's projections are batch projections: the projector hands them
// a poll batch at a time and each writes it with a few set-based statements.
// Their SQL names tables without a schema, so a rebuild can point them at
// shadow tables through the search path (see pipeline/projector).

// Accounts projects account events onto the accounts table. Versions are
// guarded: an account's events in a batch are folded in Go on top of the
// stored version (a duplicate is at or below it, a gap above it + 1) and
// written by a statement that matches only the version they follow.
type Accounts struct{}

var _ pipeline.BatchProjection[pgx.Tx] = Accounts{}

// Name implements pipeline.Projection.
func (Accounts) Name() string { return "accounts" }

// Tables names what a rebuild of accounts rebuilds.
func (Accounts) Tables() []string { return []string{"accounts"} }

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
func (a Accounts) Apply(ctx context.Context, tx pgx.Tx, ev pipeline.Event) error {
	return single(a.ApplyBatch(ctx, tx, []pipeline.Event{ev}))
}

// ApplyBatch implements pipeline.BatchProjection.
func (Accounts) ApplyBatch(ctx context.Context, tx pgx.Tx, evs []pipeline.Event) ([]error, error) {
	out := make([]error, len(evs))
	byID := make(map[string]*account)
	var order []*account
	for i, ev := range evs {
		if leavesAccount(ev) {
			continue // a rejection or a failure leaves the account as it is
		}
		if _, ok := byID[ev.AggregateID]; ok {
			continue
		}
		tenant, id, err := pipeline.SplitAggregateID(ev.AggregateID)
		if err != nil {
			out[i] = pipeline.Permanent(err)
			continue
		}
		a := &account{tenant: tenant, id: id}
		byID[ev.AggregateID] = a
		order = append(order, a)
	}
	if len(order) == 0 {
		return out, nil
	}
	tenants, ids := make([]string, len(order)), make([]string, len(order))
	for i, a := range order {
		tenants[i], ids[i] = a.tenant, a.id
	}
	rows, err := tx.Query(ctx, accountVersionsSQL, tenants, ids)
	if err != nil {
		return nil, fmt.Errorf("read account versions: %w", err)
	}
	var tenant, id string
	var version int64
	_, err = pgx.ForEachRow(rows, []any{&tenant, &id, &version}, func() error {
		a := byID[pipeline.AggregateID(tenant, id)]
		a.exists, a.stored, a.version = true, version, version
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("read account versions: %w", err)
	}

	for i, ev := range evs {
		a := byID[ev.AggregateID]
		if a == nil || out[i] != nil {
			continue
		}
		if leavesAccount(ev) {
			continue
		}
		if a.gap != nil {
			out[i] = a.gap
			continue
		}
		switch {
		case ev.Version <= a.version:
			out[i] = pipeline.ErrDuplicate
			continue
		case ev.Version > a.version+1:
			a.gap = pipeline.CheckVersion(ev.AggregateID, a.version, ev.Version)
			out[i] = a.gap
			continue
		}
		opened, isOpen := ev.Payload.(AccountOpened)
		if !a.exists && a.version == 0 && !isOpen {
			// An account's first event must open it: anything else means
			// the opening is missing.
			a.gap = &pipeline.VersionGapError{AggregateID: ev.AggregateID, Stored: 0, Got: ev.Version}
			out[i] = a.gap
			continue
		}
		switch e := ev.Payload.(type) {
		case AccountOpened:
			a.currency = opened.Currency
		case AccountClosed:
			a.closed = true
		case Deposited:
			a.delta += e.Amount
		case Withdrawn:
			a.delta -= e.Amount
		case TransferDebited:
			a.delta -= e.Amount
		case TransferCredited:
			a.delta += e.Amount
		case TransferRefunded:
			a.delta += e.Amount
		}
		// Any other event of the account still moves its version: the
		// account changed in a way this read model does not show.
		a.version = ev.Version
		a.at = ev.Time
	}

	var ins, upd accountColumns
	for _, a := range order {
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
			return nil, fmt.Errorf("insert accounts: %w", err)
		}
		if tag.RowsAffected() != int64(n) {
			return nil, fmt.Errorf("insert accounts: %d of %d rows written: %w", tag.RowsAffected(), n, errConcurrentWrite)
		}
	}
	if n := len(upd.tenant); n > 0 {
		tag, err := tx.Exec(ctx, updateAccountsSQL, upd.tenant, upd.id, upd.delta, upd.closed, upd.version, upd.at, upd.expected)
		if err != nil {
			return nil, fmt.Errorf("update accounts: %w", err)
		}
		if tag.RowsAffected() != int64(n) {
			return nil, fmt.Errorf("update accounts: %d of %d rows at the expected version: %w", tag.RowsAffected(), n, errConcurrentWrite)
		}
	}
	return out, nil
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

// single is Apply's result from a one-event ApplyBatch.
func single(outcomes []error, err error) error {
	if err != nil {
		return err
	}
	return outcomes[0]
}

// CommandStatus projects each command's outcome onto command_status:
// accepted with the ids of the events it produced, rejected with the
// reason, or failed (a CommandFailed event: the command went to the DLQ)
// with the DLQ reason. Ingest inserts the pending row; a command produced
// straight to Kafka gets its row here. A command is its id within its
// aggregate and tenant, the table's key: the same id on two aggregates, or
// in two tenants, is two rows that never mix.
//
// An outcome (accepted or rejected) is final: it replaces a failure (a
// redrive of the DLQ record that then succeeded), and a failure never
// replaces it (a poison copy of a command already decided, or a failure
// replayed after the success). The rule does not depend on the order the
// events come in, so a rebuild, which reads them again in their log order,
// ends where the live table did. Recording an event id is idempotent (an
// id already in event_ids is not added again), so the table stays right
// even for an event the inbox no longer remembers. The failure's event id
// is listed while the command is failed and dropped when an outcome
// replaces it: event_ids are then the events of the decision.
type CommandStatus struct{}

var _ pipeline.BatchProjection[pgx.Tx] = CommandStatus{}

// Name implements pipeline.Projection.
func (CommandStatus) Name() string { return "command_status" }

// Tables names what a rebuild of command_status rebuilds.
func (CommandStatus) Tables() []string { return []string{"command_status"} }

// created_at and updated_at of a row the projector writes are its event's
// time (the command's time), so a rebuild writes the same values. The WHERE
// clause keeps an outcome from being replaced by a failure; a row a failure
// created without a command type (the record was undecodable) takes the
// outcome's.
const upsertCommandStatusSQL = `INSERT INTO command_status AS c
		(command_id, tenant, aggregate_id, command_type, status, reason, detail, event_ids, created_at, updated_at)
	SELECT v.command_id, v.tenant, v.aggregate_id, v.command_type, v.status, v.reason, v.detail, v.event_ids::uuid[], v.at, v.at
	FROM unnest($1::uuid[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[], $7::text[], $8::text[], $9::timestamptz[])
		AS v(command_id, tenant, aggregate_id, command_type, status, reason, detail, event_ids, at)
	ON CONFLICT (command_id, tenant, aggregate_id) DO UPDATE SET
		status = EXCLUDED.status,
		command_type = CASE WHEN c.command_type = '' THEN EXCLUDED.command_type ELSE c.command_type END,
		reason = EXCLUDED.reason,
		detail = EXCLUDED.detail,
		event_ids = CASE WHEN c.status = 'failed' AND EXCLUDED.status <> 'failed' THEN EXCLUDED.event_ids
			ELSE c.event_ids || ARRAY(SELECT e FROM unnest(EXCLUDED.event_ids) e WHERE e <> ALL (c.event_ids)) END,
		updated_at = EXCLUDED.updated_at
	WHERE EXCLUDED.status <> 'failed' OR c.status IN ('pending', 'failed')`

// Apply implements pipeline.Projection.
func (c CommandStatus) Apply(ctx context.Context, tx pgx.Tx, ev pipeline.Event) error {
	return single(c.ApplyBatch(ctx, tx, []pipeline.Event{ev}))
}

// commandKey names a command: its id within its tenant and aggregate.
type commandKey struct {
	id                pipeline.ID
	tenant, aggregate string
}

// commandOutcome is one command's events of a batch, folded: the decision
// (accepted or rejected) if the batch has one, else its failures.
type commandOutcome struct {
	status, cmdType string
	reason, detail  *string
	eventIDs        []pipeline.ID
	at              time.Time
}

// add folds ev into o: a decision's events replace the failures before
// them, a failure after a decision is ignored.
func (o *commandOutcome) add(ev pipeline.Event) {
	decided := o.status == "accepted" || o.status == "rejected"
	switch p := ev.Payload.(type) {
	case pipeline.CommandFailed:
		if decided {
			return // an outcome is final
		}
		o.status, o.cmdType = "failed", p.CommandType
		o.reason, o.detail = &p.Reason, &p.Detail
	case pipeline.CommandRejected:
		if !decided {
			o.eventIDs = o.eventIDs[:0] // the failures' ids, if any
		}
		o.status, o.cmdType = "rejected", p.CommandType
		o.reason, o.detail = &p.Reason, &p.Detail
	default:
		if !decided {
			o.eventIDs = o.eventIDs[:0]
			o.status, o.cmdType = "accepted", commandTypeOf(p)
			o.reason, o.detail = nil, nil
		}
	}
	o.eventIDs = append(o.eventIDs, ev.ID)
	o.at = ev.Time
}

// ApplyBatch implements pipeline.BatchProjection.
func (CommandStatus) ApplyBatch(ctx context.Context, tx pgx.Tx, evs []pipeline.Event) ([]error, error) {
	byCmd := make(map[commandKey]*commandOutcome, len(evs))
	var order []commandKey
	for _, ev := range evs {
		k := commandKey{ev.CommandID, ev.Tenant, ev.AggregateID}
		o := byCmd[k]
		if o == nil {
			o = &commandOutcome{}
			byCmd[k] = o
			order = append(order, k)
		}
		o.add(ev)
	}
	n := len(order)
	ids := make([][16]byte, n)
	tenants, aggs, types, statuses, eventIDs := make([]string, n), make([]string, n), make([]string, n), make([]string, n), make([]string, n)
	reasons, details := make([]*string, n), make([]*string, n)
	ats := make([]time.Time, n)
	var b strings.Builder
	for i, k := range order {
		o := byCmd[k]
		b.Reset()
		b.WriteByte('{') // a uuid[] literal
		for j, id := range o.eventIDs {
			if j > 0 {
				b.WriteByte(',')
			}
			b.WriteString(id.String())
		}
		b.WriteByte('}')
		ids[i], tenants[i], aggs[i], types[i], statuses[i] = [16]byte(k.id), k.tenant, k.aggregate, o.cmdType, o.status
		reasons[i], details[i], eventIDs[i], ats[i] = o.reason, o.detail, b.String(), o.at
	}
	if _, err := tx.Exec(ctx, upsertCommandStatusSQL, ids, tenants, aggs, types, statuses, reasons, details, eventIDs, ats); err != nil {
		return nil, fmt.Errorf("record command outcomes: %w", err)
	}
	return make([]error, len(evs)), nil
}

// BeforeSwap keeps, when a rebuilt command_status replaces the live one,
// the rows whose status is not in the events: commands accepted over HTTP
// and not decided yet (pending), and commands whose outbox row went to
// outbox_dead (failed, with no CommandFailed event). They come with their
// ingested flag; a decided command's row is the rebuilt one, without it:
// finding, under the swap's lock, the few ids where the flag decides what
// GET answers would read the whole table while ingest's writes wait, and
// the earliest row, GET's other rule, is ingest's anyway unless a producer
// backdated a record with its id (docs/decisions.md). The projector calls
// it inside the swap transaction, with the live table locked against
// writers; the copy reads the live table's partial index on pending and
// failed rows.
func (CommandStatus) BeforeSwap(ctx context.Context, tx pgx.Tx, table, live, shadow string) error {
	_, err := tx.Exec(ctx, `INSERT INTO `+shadow+` SELECT * FROM `+live+` WHERE status IN ('pending', 'failed')
		ON CONFLICT (command_id, tenant, aggregate_id) DO NOTHING`)
	if err != nil {
		return fmt.Errorf("keep pending and failed commands: %w", err)
	}
	return nil
}

// commandTypeOf names the command an accepted event answers.
func commandTypeOf(m pipeline.Message) string {
	switch m.(type) {
	case AccountOpened:
		return OpenAccount{}.MessageType()
	case Deposited:
		return Deposit{}.MessageType()
	case Withdrawn:
		return Withdraw{}.MessageType()
	case AccountClosed:
		return CloseAccount{}.MessageType()
	case TransferDebited:
		return RequestTransfer{}.MessageType()
	case TransferCredited:
		return CreditTransfer{}.MessageType()
	case TransferRefunded:
		return RefundTransfer{}.MessageType()
	}
	return m.MessageType()
}

// Projections returns the ledger's read models in the order the projector
// applies them.
func Projections() []pipeline.Projection[pgx.Tx] {
	return []pipeline.Projection[pgx.Tx]{Accounts{}, CommandStatus{}, AuditLog{}}
}
