package projector

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/onceflow/onceflow/pipeline"
	"github.com/onceflow/onceflow/pipeline/avro"
)

// AuditLog records every event once in audit_log, whose primary key is the
// event id: an event the inbox no longer remembers is still recorded once
// (reported as a duplicate). Rows are never updated or deleted.
type AuditLog struct{}

var _ pipeline.BatchProjection[pgx.Tx] = AuditLog{}

// Name implements pipeline.Projection.
func (AuditLog) Name() string { return "audit_log" }

// Tables names what a rebuild of audit_log rebuilds.
func (AuditLog) Tables() []string { return []string{"audit_log"} }

const insertAuditSQL = `INSERT INTO audit_log (event_id, tenant, aggregate_id, version, event_type, command_id, payload, occurred_at)
	SELECT * FROM unnest($1::uuid[], $2::text[], $3::text[], $4::bigint[], $5::text[], $6::uuid[], $7::jsonb[], $8::timestamptz[])
	ON CONFLICT (event_id) DO NOTHING
	RETURNING event_id`

// Apply implements pipeline.Projection.
func (a AuditLog) Apply(ctx context.Context, tx pgx.Tx, ev pipeline.Event) error {
	return pipeline.ApplyOne(ctx, tx, a, ev)
}

// copyAuditFrom is the batch size from which the audit rows go in with
// COPY. Below it one INSERT is cheaper: COPY under a savepoint is four
// round trips (savepoint, COPY, its data, release) where the INSERT is
// one, and a batch of a few events (a live projector's, at a modest
// rate) is mostly round trips.
const copyAuditFrom = 64

// ApplyBatch implements pipeline.BatchProjection. A large batch's rows go
// in with COPY, the fastest way into Postgres; an event already recorded
// (which the inbox lets through only after its retention) fails the COPY
// on the primary key, and the batch is then written again, under a
// savepoint, with ON CONFLICT DO NOTHING to find which. A small batch
// goes in that way at once (copyAuditFrom).
func (AuditLog) ApplyBatch(ctx context.Context, tx pgx.Tx, evs []pipeline.Event) ([]error, error) {
	n := len(evs)
	rows, err := auditRows(evs)
	if err != nil {
		return nil, err
	}
	out := make([]error, n)
	if n >= copyAuditFrom {
		sp, err := tx.Begin(ctx)
		if err != nil {
			return nil, fmt.Errorf("insert audit log: %w", err)
		}
		_, err = sp.CopyFrom(ctx, pgx.Identifier{"audit_log"}, auditColumns, pgx.CopyFromRows(rows))
		if err == nil {
			if err := sp.Commit(ctx); err != nil {
				return nil, fmt.Errorf("insert audit log: %w", err)
			}
			return out, nil
		}
		if rbErr := sp.Rollback(ctx); rbErr != nil || !isUniqueViolation(err) {
			return nil, fmt.Errorf("insert audit log: %w", err)
		}
	}
	rs, err := tx.Query(ctx, insertAuditSQL, insertArgs(rows)...)
	if err != nil {
		return nil, fmt.Errorf("insert audit log: %w", err)
	}
	written, err := pgx.CollectRows(rs, pgx.RowTo[[16]byte])
	if err != nil {
		return nil, fmt.Errorf("insert audit log: %w", err)
	}
	duplicates(evs, written, out)
	return out, nil
}

// queue implements queuedProjection: below copyAuditFrom events the
// INSERT goes in the batch's last round trip, and the events it did not
// write are duplicates once that has run; a larger batch takes its COPY
// in round trips of its own (false).
func (AuditLog) queue(b *pgx.Batch, evs []pipeline.Event) ([]error, bool) {
	if len(evs) >= copyAuditFrom {
		return nil, false
	}
	rows, err := auditRows(evs)
	if err != nil {
		return nil, false // ApplyBatch reports it
	}
	out := make([]error, len(evs))
	b.Queue(insertAuditSQL, insertArgs(rows)...).Query(func(rs pgx.Rows) error {
		written, err := pgx.CollectRows(rs, pgx.RowTo[[16]byte])
		if err != nil {
			return fmt.Errorf("insert audit log: %w", err)
		}
		duplicates(evs, written, out)
		return nil
	})
	return out, true
}

// auditRows are evs' audit_log rows, in auditColumns' order.
func auditRows(evs []pipeline.Event) ([][]any, error) {
	rows := make([][]any, len(evs))
	for i, ev := range evs {
		p, err := fieldsJSON(ev.Payload)
		if err != nil {
			return nil, fmt.Errorf("audit %s %s: %w", ev.Type(), ev.ID, err)
		}
		rows[i] = []any{[16]byte(ev.ID), ev.Tenant, ev.AggregateID, ev.Version, ev.Type(), [16]byte(ev.CommandID), string(p), ev.Time}
	}
	return rows, nil
}

// duplicates sets the outcome of each event of evs whose row was not
// written to ErrDuplicate.
func duplicates(evs []pipeline.Event, written [][16]byte, out []error) {
	isNew := make(map[[16]byte]bool, len(written))
	for _, id := range written {
		isNew[id] = true
	}
	for i, ev := range evs {
		id := [16]byte(ev.ID)
		if !isNew[id] {
			out[i] = pipeline.ErrDuplicate
		}
		isNew[id] = false // the same id twice in the batch is recorded once
	}
}

var auditColumns = []string{"event_id", "tenant", "aggregate_id", "version", "event_type", "command_id", "payload", "occurred_at"}

// insertArgs are insertAuditSQL's arguments: rows by column.
func insertArgs(rows [][]any) []any {
	cols := make([][]any, len(auditColumns))
	for c := range cols {
		cols[c] = make([]any, len(rows))
		for i := range rows {
			cols[c][i] = rows[i][c]
		}
	}
	return []any{typed[[16]byte](cols[0]), typed[string](cols[1]), typed[string](cols[2]),
		typed[int64](cols[3]), typed[string](cols[4]), typed[[16]byte](cols[5]), typed[string](cols[6]), typed[time.Time](cols[7])}
}

func typed[T any](col []any) []T {
	out := make([]T, len(col))
	for i, v := range col {
		out[i] = v.(T)
	}
	return out
}

func isUniqueViolation(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "23505"
}

// fieldsJSON encodes an event's fields as a JSON object named as in its
// Avro record, so the audit log reads like the events topic.
func fieldsJSON(m pipeline.Message) ([]byte, error) {
	if reflect.ValueOf(m).Kind() != reflect.Struct {
		return json.Marshal(m)
	}
	fields, err := avro.Fields(m)
	if err != nil {
		return nil, err
	}
	return json.Marshal(fields)
}
