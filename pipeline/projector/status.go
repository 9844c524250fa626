package projector

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/onceflow/onceflow/pipeline"
)

// CommandStatus projects each command's outcome onto command_status:
// accepted with the ids of the events it produced, rejected with the
// reason, or failed (a CommandFailed event: the command went to the DLQ)
// with the DLQ reason; and the commands each decision sent to other
// aggregates (pipeline.Event.Derived), pending until their own outcome,
// with the command that sent them (recordDerivedSQL). Ingest inserts the pending row; a command produced
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
//
// Each event names the command type it answers (Event.CommandType, the
// command-type header); CommandTypeOf names it for events written before
// the processor recorded it.
type CommandStatus struct {
	// CommandTypeOf, if set, names the command an event without a command
	// type answers; nil, such an event's type stands for it.
	CommandTypeOf func(pipeline.Message) string
}

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

// recordDerivedSQL records the commands the batch's decisions sent to
// other aggregates (pipeline.Event.Derived), each with the command that
// sent it: pending, until its own outcome comes, or, when its row is
// already there (its outcome came first, from another partition, or
// earlier in this batch: the upsert runs before), only its cause. A
// command keeps the first cause recorded. GET /v1/commands/{id} and
// onceflow trace follow the causes from a command down to every command
// it led to (sql/00048).
const recordDerivedSQL = `INSERT INTO command_status AS c
		(command_id, tenant, aggregate_id, command_type, status, created_at, updated_at, cause_command_id, cause_aggregate_id)
	SELECT v.command_id, v.tenant, v.aggregate_id, v.command_type, 'pending', v.at, v.at, v.cause_id, v.cause_aggregate
	FROM unnest($1::uuid[], $2::text[], $3::text[], $4::text[], $5::timestamptz[], $6::uuid[], $7::text[])
		AS v(command_id, tenant, aggregate_id, command_type, at, cause_id, cause_aggregate)
	ON CONFLICT (command_id, tenant, aggregate_id) DO UPDATE SET
		cause_command_id = EXCLUDED.cause_command_id, cause_aggregate_id = EXCLUDED.cause_aggregate_id
	WHERE c.cause_command_id IS NULL`

// Apply implements pipeline.Projection.
func (c CommandStatus) Apply(ctx context.Context, tx pgx.Tx, ev pipeline.Event) error {
	return pipeline.ApplyOne(ctx, tx, c, ev)
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
func (o *commandOutcome) add(ev pipeline.Event, typeOf func(pipeline.Message) string) {
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
			o.status, o.cmdType = "accepted", ev.CommandType
			if o.cmdType == "" {
				o.cmdType = p.MessageType()
				if typeOf != nil {
					o.cmdType = typeOf(p)
				}
			}
			o.reason, o.detail = nil, nil
		}
	}
	o.eventIDs = append(o.eventIDs, ev.ID)
	o.at = ev.Time
}

// ApplyBatch implements pipeline.BatchProjection.
func (c CommandStatus) ApplyBatch(ctx context.Context, tx pgx.Tx, evs []pipeline.Event) ([]error, error) {
	if _, err := tx.Exec(ctx, upsertCommandStatusSQL, c.args(evs)...); err != nil {
		return nil, fmt.Errorf("record command outcomes: %w", err)
	}
	if args := derivedArgs(evs); args != nil {
		if _, err := tx.Exec(ctx, recordDerivedSQL, args...); err != nil {
			return nil, fmt.Errorf("record derived commands: %w", err)
		}
	}
	return make([]error, len(evs)), nil
}

// queue implements queuedProjection: the upsert, and the derived
// commands when the batch's decisions sent any, go in the batch's last
// round trip. Every event's outcome is nil.
func (c CommandStatus) queue(b *pgx.Batch, evs []pipeline.Event) ([]error, bool) {
	b.Queue(upsertCommandStatusSQL, c.args(evs)...)
	if args := derivedArgs(evs); args != nil {
		b.Queue(recordDerivedSQL, args...)
	}
	return make([]error, len(evs)), true
}

// derivedArgs are recordDerivedSQL's arguments for the commands evs name
// as derived (each once: every event of a decision names them), nil when
// they name none. A derived command's row is in its own tenant, the one
// its aggregate id names.
func derivedArgs(evs []pipeline.Event) []any {
	var seen map[commandKey]bool
	var ids, causes [][16]byte
	var tenants, aggs, types, causeAggs []string
	var ats []time.Time
	for _, ev := range evs {
		for _, d := range ev.Derived {
			tenant, _, err := pipeline.SplitAggregateID(d.AggregateID)
			if err != nil {
				continue // kafka.EventOf refuses it: not from a record
			}
			k := commandKey{d.ID, tenant, d.AggregateID}
			if seen[k] {
				continue
			}
			if seen == nil {
				seen = map[commandKey]bool{}
			}
			seen[k] = true
			ids, tenants, aggs, types = append(ids, [16]byte(d.ID)), append(tenants, tenant), append(aggs, d.AggregateID), append(types, d.Type)
			ats, causes, causeAggs = append(ats, ev.Time), append(causes, [16]byte(ev.CommandID)), append(causeAggs, ev.AggregateID)
		}
	}
	if seen == nil {
		return nil
	}
	return []any{ids, tenants, aggs, types, ats, causes, causeAggs}
}

// args are the upsert's arguments for evs, folded by command.
func (c CommandStatus) args(evs []pipeline.Event) []any {
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
		o.add(ev, c.CommandTypeOf)
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
	return []any{ids, tenants, aggs, types, statuses, reasons, details, eventIDs, ats}
}

// BeforeSwap keeps, when a rebuilt command_status replaces the live one, the
// rows whose status is not in the events: commands accepted over HTTP and not
// decided yet (pending), and commands whose outbox row went to outbox_dead
// (failed, with no CommandFailed event). They come with their ingested flag;
// a decided command's row is the rebuilt one, without it: finding, under the
// swap's lock, the few ids where the flag decides what GET answers would read
// the whole table while ingest's writes wait, and the earliest row, GET's
// other rule, is ingest's anyway unless a producer backdated a record with
// its id (docs/decisions/0002-get-command-answers-ingests-command.md). The
// projector calls it inside the swap transaction, with the live table locked
// against writers; the copy reads the live table's partial index on pending
// and failed rows.
func (CommandStatus) BeforeSwap(ctx context.Context, tx pgx.Tx, table, live, shadow string) error {
	_, err := tx.Exec(ctx, `INSERT INTO `+shadow+` SELECT * FROM `+live+` WHERE status IN ('pending', 'failed')
		ON CONFLICT (command_id, tenant, aggregate_id) DO NOTHING`)
	if err != nil {
		return fmt.Errorf("keep pending and failed commands: %w", err)
	}
	return nil
}
