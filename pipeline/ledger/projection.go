package ledger

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/onceflow/onceflow/pipeline"
)

// Accounts projects account events onto the accounts table. Every update is
// guarded by version = event version - 1; a miss is classified by
// pipeline.CheckVersion against the stored version.
type Accounts struct{}

var _ pipeline.Projection[pgx.Tx] = Accounts{}

// Name implements pipeline.Projection.
func (Accounts) Name() string { return "accounts" }

const (
	openAccountSQL = `INSERT INTO accounts (tenant, account_id, currency, balance, status, version, updated_at)
		SELECT $1, $2, $3, 0, 'open', $4::bigint, $5 WHERE $4::bigint = 1
		ON CONFLICT (tenant, account_id) DO NOTHING`
	moveBalanceSQL = `UPDATE accounts SET balance = balance + $3::bigint, version = $4::bigint, updated_at = $5
		WHERE tenant = $1 AND account_id = $2 AND version = $4::bigint - 1`
	closeAccountSQL = `UPDATE accounts SET status = 'closed', version = $3::bigint, updated_at = $4
		WHERE tenant = $1 AND account_id = $2 AND version = $3::bigint - 1`
	accountVersionSQL = `SELECT version FROM accounts WHERE tenant = $1 AND account_id = $2`
)

// Apply implements pipeline.Projection.
func (Accounts) Apply(ctx context.Context, tx pgx.Tx, ev pipeline.Event) error {
	tenant, id, err := pipeline.SplitAggregateID(ev.AggregateID)
	if err != nil {
		return pipeline.Permanent(err)
	}
	var delta int64
	switch e := ev.Payload.(type) {
	case AccountOpened:
		return guarded(ctx, tx, tenant, id, ev)(tx.Exec(ctx, openAccountSQL, tenant, id, e.Currency, ev.Version, ev.Time))
	case AccountClosed:
		return guarded(ctx, tx, tenant, id, ev)(tx.Exec(ctx, closeAccountSQL, tenant, id, ev.Version, ev.Time))
	case Deposited:
		delta = e.Amount
	case Withdrawn:
		delta = -e.Amount
	case TransferDebited:
		delta = -e.Amount
	case TransferCredited:
		delta = e.Amount
	case TransferRefunded:
		delta = e.Amount
	default: // CommandRejected changes no account
		return nil
	}
	return guarded(ctx, tx, tenant, id, ev)(tx.Exec(ctx, moveBalanceSQL, tenant, id, delta, ev.Version, ev.Time))
}

// guarded turns a version-guarded statement's outcome into nil (applied),
// pipeline.ErrDuplicate or a *pipeline.VersionGapError.
func guarded(ctx context.Context, tx pgx.Tx, tenant, id string, ev pipeline.Event) func(tag interface{ RowsAffected() int64 }, err error) error {
	return func(tag interface{ RowsAffected() int64 }, err error) error {
		if err != nil {
			return fmt.Errorf("apply %s v%d to %s: %w", ev.Type(), ev.Version, ev.AggregateID, err)
		}
		if tag.RowsAffected() == 1 {
			return nil
		}
		var stored int64
		if err := tx.QueryRow(ctx, accountVersionSQL, tenant, id).Scan(&stored); err != nil && !errors.Is(err, pgx.ErrNoRows) {
			return fmt.Errorf("read version of %s: %w", ev.AggregateID, err)
		}
		return pipeline.CheckVersion(ev.AggregateID, stored, ev.Version)
	}
}

// CommandStatus projects each command's outcome onto command_status:
// accepted with the ids of the events it produced, or rejected with the
// reason. Ingest inserts the pending row; a command produced straight to
// Kafka gets its row here.
type CommandStatus struct{}

var _ pipeline.Projection[pgx.Tx] = CommandStatus{}

// Name implements pipeline.Projection.
func (CommandStatus) Name() string { return "command_status" }

const upsertCommandStatusSQL = `INSERT INTO command_status
		(command_id, tenant, aggregate_id, command_type, status, reason, detail, event_ids, updated_at)
	VALUES ($1, $2, $3, $4, $5, $6, $7, ARRAY[$8::uuid], now())
	ON CONFLICT (command_id) DO UPDATE SET
		status = EXCLUDED.status,
		reason = EXCLUDED.reason,
		detail = EXCLUDED.detail,
		event_ids = CASE WHEN $8::uuid = ANY (command_status.event_ids) THEN command_status.event_ids
		                 ELSE command_status.event_ids || $8::uuid END,
		updated_at = now()`

// Apply implements pipeline.Projection.
func (CommandStatus) Apply(ctx context.Context, tx pgx.Tx, ev pipeline.Event) error {
	status, cmdType := "accepted", commandTypeOf(ev.Payload)
	var reason, detail *string
	if r, ok := ev.Payload.(pipeline.CommandRejected); ok {
		status, cmdType = "rejected", r.CommandType
		reason, detail = &r.Reason, &r.Detail
	}
	_, err := tx.Exec(ctx, upsertCommandStatusSQL,
		ev.CommandID.String(), ev.Tenant, ev.AggregateID, cmdType, status, reason, detail, ev.ID.String())
	if err != nil {
		return fmt.Errorf("record outcome of command %s: %w", ev.CommandID, err)
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
	return []pipeline.Projection[pgx.Tx]{Accounts{}, CommandStatus{}}
}
