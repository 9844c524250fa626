package ingest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/onceflow/onceflow/pipeline"
	"github.com/onceflow/onceflow/pipeline/kafka"
	"github.com/onceflow/onceflow/pipeline/postgres"
)

// InboundHoldEnv names the environment variable the ingest binary reads to
// install a Config.AfterInbound that never returns for an event id with
// its value as prefix: test-only (the process is then killed, with the
// event stored and its delivery unanswered), unset in production.
const InboundHoldEnv = "ONCEFLOW_TEST_INBOUND_HOLD"

// HoldInbound is that AfterInbound: it blocks forever on an event id
// starting with prefix.
func HoldInbound(prefix string) func(eventID string) {
	return func(eventID string) {
		if strings.HasPrefix(eventID, prefix) {
			select {}
		}
	}
}

// inboundPattern is the route of every provider's deliveries.
const inboundPattern = "POST /v1/inbound/{provider}"

// inboundNamespace is the UUIDv5 namespace of inbound commands' ids: the
// id of an event's command is derived from (provider, event id), so even
// two commands of one event (which the stored event prevents) would be one
// command to the processor, which skips an id it handled.
var inboundNamespace = pipeline.MustParseID("6f6e6365-666c-4f77-8069-6e626f756e64")

// InboundCommandID is the command id of a provider's event.
func InboundCommandID(provider, eventID string) pipeline.ID {
	return pipeline.NameID(inboundNamespace, []byte(provider+"\x00"+eventID))
}

// InboundAnswer is the body of a 200 to a delivery.
type InboundAnswer struct {
	Provider string `json:"provider"`
	EventID  string `json:"event_id"`
	// Status is what the event did the first time it was delivered:
	// enqueued (it became CommandID), recorded (it won and makes no
	// command), superseded (an event of the same aggregate already applied
	// wins over it), ignored (its type is not configured).
	Status    string `json:"status"`
	CommandID string `json:"command_id,omitempty"`
	// Duplicate says this delivery was of an event already stored: it
	// changed nothing.
	Duplicate bool `json:"duplicate"`
}

const (
	// insertEventSQL stores a delivery's event, or counts the delivery on
	// the event's row. Concurrent deliveries of one event wait on the
	// primary key for the first's transaction and then count: fresh says
	// this transaction inserted the row (xmax is 0 on a row the statement
	// inserted, the transaction id of an upsert's update otherwise).
	insertEventSQL = `INSERT INTO inbound_events
		(provider, event_id, event_type, tenant, aggregate_id, version, precedence, status, command_type, payload)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)
		ON CONFLICT (provider, event_id) DO UPDATE
		SET deliveries = inbound_events.deliveries + 1, last_delivery_at = now()
		RETURNING xmax = 0, status, command_id::text`

	// applySQL decides whether a new event wins over the aggregate's
	// current one (inbound_aggregates, under its row lock: the upsert's
	// WHERE is the precedence rule of docs/inbound.md) and, if it wins and
	// makes a command, writes the command as ingest writes any command:
	// the outbox row and the pending command_status row. Then it sets the
	// event's status. An event delivered again after the retention deleted
	// its row makes nothing: if it made a command, that command's status
	// row (kept for good) is there (prior: the event is enqueued as it was,
	// no second command, the aggregate's winner untouched); if it was the
	// aggregate's winner, it does not win over itself.
	applySQL = `WITH prior AS (
		SELECT 1 FROM command_status WHERE command_id = $8::uuid AND tenant = $14 AND aggregate_id = $3
	), won AS (
		INSERT INTO inbound_aggregates AS a (provider, aggregate_id, event_id, event_type, version, precedence)
		SELECT $1, $3, $2, $4, $5, $6 WHERE NOT EXISTS (SELECT 1 FROM prior)
		ON CONFLICT (provider, aggregate_id) DO UPDATE
		SET event_id = excluded.event_id, event_type = excluded.event_type, version = excluded.version,
			precedence = excluded.precedence, updated_at = now()
		WHERE excluded.event_id <> a.event_id AND excluded.precedence >= a.precedence
			AND (excluded.version IS NULL OR a.version IS NULL OR excluded.version > a.version)
		RETURNING 1
	), outbox_row AS (
		INSERT INTO outbox (shard, topic, key, value, headers)
		SELECT $9, $10, $11, $12, $13::jsonb WHERE $7 AND EXISTS (SELECT 1 FROM won)
	), status_row AS (
		INSERT INTO command_status (command_id, tenant, aggregate_id, command_type, status, ingested)
		SELECT $8::uuid, $14, $3, $15, 'pending', true WHERE $7 AND EXISTS (SELECT 1 FROM won)
		ON CONFLICT DO NOTHING
	)
	UPDATE inbound_events
	SET status = CASE WHEN EXISTS (SELECT 1 FROM prior) THEN 'enqueued'
			WHEN NOT EXISTS (SELECT 1 FROM won) THEN 'superseded' WHEN $7 THEN 'enqueued' ELSE 'recorded' END,
		command_id = CASE WHEN EXISTS (SELECT 1 FROM prior) OR $7 AND EXISTS (SELECT 1 FROM won) THEN $8::uuid END
	WHERE provider = $1 AND event_id = $2
	RETURNING status`

	// expireEventsSQL deletes a page of events older than the retention,
	// by the database's clock.
	expireEventsSQL = `DELETE FROM inbound_events WHERE ctid IN (
		SELECT ctid FROM inbound_events WHERE received_at < now() - make_interval(secs => $1) LIMIT 5000)`
)

// inboundEventRow is a verified delivery, ready to be stored.
type inboundEventRow struct {
	provider, eventID, eventType, tenant string
	aggregateID                          *string
	version                              *int64
	precedence                           int
	commandType                          *string
	commandID                            pipeline.ID
	topic                                string
	value, payload                       []byte
	shard                                int
}

// inbound is the handler of POST /v1/inbound/{provider}: verify the
// signature and the timestamp, read the event out of the delivery, store
// it once and, if it wins over what its aggregate already had, enqueue its
// command in the same transaction (docs/inbound.md). Nothing is written
// before the signature checks out.
func (s *Server) inbound(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	name := r.PathValue("provider")
	outcome := "refused"
	defer func() {
		if _, ok := s.providers[name]; !ok {
			name = "unknown" // bounded labels: only configured names
		}
		s.metrics.inbound.WithLabelValues(name, outcome).Inc()
		s.metrics.inboundDuration.Observe(time.Since(start).Seconds())
	}()
	p := s.providers[name]
	if p == nil {
		writeProblem(w, problem(http.StatusNotFound, "inbound-provider-unknown", "Unknown provider", "no inbound provider is configured under this name"))
		return
	}
	body, pr := readBody(r, s.cfg.MaxBodyBytes)
	if pr != nil {
		writeProblem(w, pr)
		return
	}
	switch err := p.verifier.verify(r.Header, body, time.Now()); {
	case errors.Is(err, errSignature):
		outcome = "bad-signature"
		writeProblem(w, problem(http.StatusUnauthorized, "inbound-signature-invalid", "Signature invalid",
			"the signature does not match any of this provider's secrets"))
		return
	case errors.Is(err, errStale):
		outcome = "stale"
		writeProblem(w, problem(http.StatusUnauthorized, "inbound-timestamp-stale", "Timestamp outside the tolerance",
			fmt.Sprintf("the signed timestamp is more than %s from this server's clock; a replayed delivery is refused", p.Tolerance)))
		return
	case err != nil:
		var prob *Problem
		if errors.As(err, &prob) {
			writeProblem(w, prob)
			return
		}
		writeProblem(w, s.internal(r, err))
		return
	}
	row, pr := s.inboundEvent(r, p, body)
	if pr != nil {
		outcome = "invalid"
		writeProblem(w, pr)
		return
	}
	ans, err := s.storeInbound(r.Context(), row)
	if err != nil {
		outcome = "error"
		writeProblem(w, s.internal(r, err))
		return
	}
	if s.cfg.AfterInbound != nil {
		s.cfg.AfterInbound(row.eventID)
	}
	outcome = ans.Status
	if ans.Duplicate {
		outcome = "duplicate"
	}
	writeJSON(w, http.StatusOK, ans)
}

// inboundEvent reads the event, its aggregate and its command out of a
// verified delivery. A delivery the configuration cannot read is a 422:
// the provider will retry it, and an operator sees it in the metrics and
// the answer's detail.
func (s *Server) inboundEvent(r *http.Request, p *inboundProvider, body []byte) (inboundEventRow, *Problem) {
	if !json.Valid(body) {
		return inboundEventRow{}, invalid(FieldError{"", "the body is not JSON"})
	}
	d := delivery{header: r.Header.Get, body: body}
	row := inboundEventRow{provider: p.Name, tenant: p.Tenant, payload: body}
	var errs []FieldError
	var ok bool
	if row.eventID, ok = d.text(p.EventID); !ok || len(row.eventID) > 255 {
		errs = append(errs, FieldError{p.EventID, "the event id: want a string or an integer of at most 255 characters"})
	}
	if row.eventType, ok = d.text(p.EventType); !ok {
		errs = append(errs, FieldError{p.EventType, "the event type: want a string"})
	}
	if len(errs) > 0 {
		return row, invalid(errs...)
	}
	ev, known := p.events[row.eventType]
	if !known {
		return row, nil // stored as ignored
	}
	row.precedence = ev.Precedence
	localID, ok := d.text(ev.aggregateID)
	if !ok || pipeline.ValidateLocalID(localID) != nil {
		errs = append(errs, FieldError{ev.aggregateID, "the aggregate id: " + pipeline.ErrInvalidLocalID.Error()})
	}
	if p.Version != "" {
		v, ok := d.text(p.Version)
		n, err := strconv.ParseInt(v, 10, 64)
		if !ok || err != nil {
			errs = append(errs, FieldError{p.Version, "the version: want an integer"})
		}
		row.version = &n
	}
	if len(errs) > 0 {
		return row, invalid(errs...)
	}
	aggregateID := pipeline.AggregateID(p.Tenant, localID)
	row.aggregateID = &aggregateID
	if ev.route == nil {
		return row, nil // recorded when it wins
	}
	obj := object{}
	for field, loc := range ev.Fields {
		if raw, ok := d.raw(loc); ok {
			obj[field] = raw
		}
	}
	cmd, pr := ev.route.build(localID, obj, nil, s.cfg.MaxStringBytes)
	if pr != nil {
		pr.Detail = "the event's fields do not make a valid " + ev.Command
		return row, pr
	}
	value, err := ev.route.Encoder.Encode(r.Context(), cmd.payload)
	if err != nil {
		return row, s.internal(r, fmt.Errorf("encode %s: %w", ev.Command, err))
	}
	t := cmd.payload.MessageType()
	row.commandType, row.value, row.topic = &t, value, ev.route.Topic
	row.commandID = InboundCommandID(p.Name, row.eventID)
	row.shard = pipeline.OutboxShard(aggregateID, s.cfg.Shards)
	return row, nil
}

// storeInbound stores the event and, when it wins, its command, in one
// transaction; a delivery of a stored event answers what the first did.
func (s *Server) storeInbound(ctx context.Context, row inboundEventRow) (InboundAnswer, error) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.cfg.RequestTimeout)
	defer cancel()
	ans := InboundAnswer{Provider: row.provider, EventID: row.eventID}
	status := "received"
	if row.aggregateID == nil {
		status = "ignored"
	}
	enqueued := false
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		var fresh bool
		var commandID *string
		err := tx.QueryRow(ctx, insertEventSQL, row.provider, row.eventID, row.eventType, row.tenant, row.aggregateID,
			row.version, row.precedence, status, row.commandType, row.payload).Scan(&fresh, &ans.Status, &commandID)
		if err != nil {
			return fmt.Errorf("store inbound event: %w", err)
		}
		if commandID != nil {
			ans.CommandID = *commandID
		}
		if !fresh || row.aggregateID == nil {
			ans.Duplicate = !fresh
			return nil
		}
		headers := map[string]string{}
		if row.commandType != nil {
			for _, h := range kafka.CommandHeaders(row.commandID, row.tenant, *row.commandType, "") {
				headers[h.Key] = string(h.Value)
			}
		}
		hj, _ := json.Marshal(headers)
		err = tx.QueryRow(ctx, applySQL, row.provider, row.eventID, *row.aggregateID, row.eventType, row.version,
			row.precedence, row.commandType != nil, row.commandID.String(), row.shard, row.topic,
			[]byte(*row.aggregateID), row.value, string(hj), row.tenant, row.commandType).Scan(&ans.Status)
		if err != nil {
			return fmt.Errorf("apply inbound event: %w", err)
		}
		if ans.Status == "enqueued" {
			ans.CommandID = row.commandID.String()
			enqueued = true // or was, before the retention (prior): the relays look and find nothing
		}
		return nil
	})
	if err != nil {
		return InboundAnswer{}, err
	}
	if enqueued {
		s.metrics.accepted.Inc()
		shards := []int{row.shard}
		if s.cfg.OnAccept != nil {
			shards = s.cfg.OnAccept(shards)
		}
		if len(shards) > 0 {
			s.wake.accepted(shards...)
		}
	}
	return ans, nil
}

// expireInbound deletes, every hour, the events older than the retention
// (InboundRetention), a page at a time. Every ingest process runs it; the
// pages are disjoint by the time they are deleted.
func (s *Server) expireInbound(ctx context.Context) {
	for {
		for {
			tag, err := s.pool.Exec(ctx, expireEventsSQL, s.cfg.InboundRetention.Seconds())
			if err != nil {
				if ctx.Err() == nil && !postgres.IsUnavailable(err) {
					s.logger.Warn("expire inbound events", "err", err)
				}
				break
			}
			if tag.RowsAffected() < 5000 {
				break
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(time.Hour + rand.N(10*time.Minute)): // #nosec G404 -- a sleep's jitter
		}
	}
}

// EncodeCommand makes a command of commandType for the tenant-local
// aggregate localID from fields (a JSON object of its members, as its
// route's body has them), validated as that route validates a request,
// and returns its commands topic and encoded value: what a command
// ingest did not receive over HTTP (a reconciliation's correction) needs
// to go through the outbox like any other.
func (s *Server) EncodeCommand(ctx context.Context, commandType, localID string, fields json.RawMessage) (string, []byte, error) {
	r := s.byType[commandType]
	if r == nil {
		return "", nil, fmt.Errorf("no route of this deployment takes %s", commandType)
	}
	if err := pipeline.ValidateLocalID(localID); err != nil {
		return "", nil, fmt.Errorf("aggregate id %q: %w", localID, err)
	}
	obj, errs, p := decodeObject(fields, r.members()...)
	var cmd command
	if p == nil {
		cmd, p = r.build(localID, obj, errs, s.cfg.MaxStringBytes)
	}
	if p != nil {
		b, _ := json.Marshal(p.Errors)
		return "", nil, fmt.Errorf("%s: %s", p.Title, b)
	}
	value, err := r.Encoder.Encode(ctx, cmd.payload)
	if err != nil {
		return "", nil, fmt.Errorf("encode %s: %w", commandType, err)
	}
	return r.Topic, value, nil
}
