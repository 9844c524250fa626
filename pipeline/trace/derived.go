package trace

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/onceflow/onceflow/pipeline"
)

// Derived is a command the traced command led to: its decision sent it
// to another aggregate (a transfer's credit), or the decision of one
// that did (the credit's refund), with its command_status row, its
// events and the consumers that applied them.
type Derived struct {
	Command
	CauseCommandID   string  `json:"cause_command_id"`
	CauseAggregateID string  `json:"cause_aggregate_id"`
	Events           []Event `json:"events"`
}

// Outcome is the outcome of the traced command with every command it led
// to (pipeline.OutcomeOf; docs/ingest.md#outcome).
type Outcome struct {
	Status      string `json:"status"`
	Reason      string `json:"reason,omitempty"`
	Detail      string `json:"detail,omitempty"`
	CommandID   string `json:"command_id,omitempty"`
	AggregateID string `json:"aggregate_id,omitempty"`
	CommandType string `json:"command_type,omitempty"`
}

// derivedSQL reads the commands command $1 of aggregate $3 (tenant $2) led
// to, down the causes command_status records (sql/00048), a cause before
// what it sent, as GET /v1/commands/{id} does.
const derivedSQL = `WITH RECURSIVE derived AS (
		SELECT c.*, 1 AS depth FROM command_status AS c
		WHERE c.cause_command_id = $1 AND c.tenant = $2 AND c.cause_aggregate_id = $3
		UNION ALL
		SELECT c.*, d.depth + 1 FROM derived AS d JOIN command_status AS c
			ON c.cause_command_id = d.command_id AND c.tenant = $2 AND c.cause_aggregate_id = d.aggregate_id
		WHERE d.depth < 8
	)
	SELECT command_id::text, tenant, aggregate_id, command_type, status, coalesce(reason, ''), coalesce(detail, ''),
		ingested, event_ids::text[], created_at, updated_at, cause_command_id::text, cause_aggregate_id
	FROM derived ORDER BY depth, created_at, command_id LIMIT 100`

// readDerived reads the commands t's command led to, their events and
// inbox rows, and the outcome of the whole.
func readDerived(ctx context.Context, tx pgx.Tx, t *Trace) error {
	c := t.Command
	rows, err := tx.Query(ctx, derivedSQL, c.CommandID, c.Tenant, c.AggregateID)
	if err != nil {
		return fmt.Errorf("read the derived commands: %w", err)
	}
	for rows.Next() {
		var d Derived
		if err := rows.Scan(&d.CommandID, &d.Tenant, &d.AggregateID, &d.CommandType, &d.Status, &d.Reason, &d.Detail,
			&d.Ingested, &d.EventIDs, &d.CreatedAt, &d.UpdatedAt, &d.CauseCommandID, &d.CauseAggregateID); err != nil {
			return err
		}
		t.Derived = append(t.Derived, d)
	}
	if err := rows.Err(); err != nil {
		return err
	}
	states := make([]pipeline.CommandState, len(t.Derived))
	for i := range t.Derived {
		d := &t.Derived[i]
		if d.Events, err = readEvents(ctx, tx, d.CommandID, d.AggregateID); err != nil {
			return err
		}
		states[i] = pipeline.CommandState{CommandID: d.CommandID, AggregateID: d.AggregateID, CauseID: d.CauseCommandID, CauseAggregateID: d.CauseAggregateID,
			CommandType: d.CommandType, Status: d.Status, Reason: d.Reason, Detail: d.Detail}
	}
	o := pipeline.OutcomeOf(pipeline.CommandState{CommandID: c.CommandID, AggregateID: c.AggregateID, CommandType: c.CommandType,
		Status: c.Status, Reason: c.Reason, Detail: c.Detail}, states)
	t.Outcome = Outcome{Status: o.Status, Reason: o.Reason, Detail: o.Detail, CommandID: o.CommandID, AggregateID: o.AggregateID, CommandType: o.CommandType}
	return nil
}

// readEvents reads a command's events from audit_log and the inbox rows
// of each.
func readEvents(ctx context.Context, tx pgx.Tx, commandID, aggregateID string) ([]Event, error) {
	rows, err := tx.Query(ctx, eventsSQL, commandID, aggregateID)
	if err != nil {
		return nil, fmt.Errorf("read the events: %w", err)
	}
	evs := []Event{}
	for rows.Next() {
		e := Event{Inbox: []Inbox{}, Deliveries: []Delivery{}, Jobs: []Job{}}
		if err := rows.Scan(&e.EventID, &e.EventType, &e.Version, &e.OccurredAt); err != nil {
			return nil, err
		}
		evs = append(evs, e)
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	ids := make([]string, len(evs))
	for i, e := range evs {
		ids[i] = e.EventID
	}
	rows, err = tx.Query(ctx, inboxSQL, ids)
	if err != nil {
		return nil, fmt.Errorf("read the inbox: %w", err)
	}
	for rows.Next() {
		var id string
		var in Inbox
		if err := rows.Scan(&id, &in.Consumer, &in.ReceivedAt); err != nil {
			return nil, err
		}
		for i := range evs {
			if evs[i].EventID == id {
				evs[i].Inbox = append(evs[i].Inbox, in)
			}
		}
	}
	return evs, rows.Err()
}

// derivedSteps are the timeline's steps of the derived commands, each
// with its events and status, then the outcome of the whole; none when
// the command led to no other.
func (t *Trace) derivedSteps(add func(at time.Time, stage, format string, args ...any)) {
	if len(t.Derived) == 0 {
		return
	}
	for _, d := range t.Derived {
		add(d.CreatedAt, "derived", "%s %s for %s, sent by %s of %s", d.CommandType, d.CommandID, d.AggregateID, d.CauseCommandID, d.CauseAggregateID)
		for _, e := range d.Events {
			add(e.OccurredAt, "event", "%s %s version %d, %s", e.EventType, e.EventID, e.Version, where(e.Position))
			for _, in := range e.Inbox {
				add(in.ReceivedAt, "inbox", "%s applied %s", in.Consumer, e.EventID)
			}
		}
		add(d.UpdatedAt, "status", "%s", statusText(d.Status, d.Reason))
	}
	o := t.Outcome
	what := o.Status
	if o.CommandID != "" {
		what += fmt.Sprintf(": %s %s of %s %s", o.CommandType, o.CommandID, o.AggregateID, statusText("refused", o.Reason))
	}
	at := t.Command.UpdatedAt
	for _, d := range t.Derived {
		if d.UpdatedAt.After(at) {
			at = d.UpdatedAt
		}
	}
	add(at, "outcome", "%s", what)
}

// where says where an event is on the events topic.
func where(p *Position) string {
	if p == nil {
		return "not found on the events topic"
	}
	return fmt.Sprintf("on %s partition %d offset %d", p.Topic, p.Partition, p.Offset)
}

// statusText is a status with its reason, if any.
func statusText(status, reason string) string {
	if reason != "" {
		return status + " (" + reason + ")"
	}
	return status
}
