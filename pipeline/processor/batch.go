package processor

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"strconv"
	"sync"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/onceflow/onceflow/pipeline"
	"github.com/onceflow/onceflow/pipeline/kafka"
)

// DLQ reasons (the dlq-reason header and the reason label of
// onceflow_dlq_records_total).
const (
	ReasonMissingCommandID    = "missing-command-id"
	ReasonInvalidCommandID    = "invalid-command-id"
	ReasonMissingTenant       = "missing-tenant"
	ReasonInvalidKey          = "invalid-key"
	ReasonTenantMismatch      = "tenant-mismatch"
	ReasonUnknownSchema       = "unknown-schema"
	ReasonUndecodable         = "undecodable"
	ReasonUnknownType         = "unknown-command-type"
	ReasonCommandTypeMismatch = "command-type-mismatch"
	ReasonDeciderPanic        = "decider-panic"
	ReasonDeciderError        = "decider-error"
	ReasonEncode              = "unencodable-decision"
	ReasonOutputRefused       = "output-refused"
)

// HeaderDLQDetail carries the human-readable detail of a DLQ reason.
const HeaderDLQDetail = "dlq-detail"

// handlesTypes is implemented by deciders that know which command types
// they accept (pipeline.Aggregate): any other type is poison.
type handlesTypes interface {
	Handles(commandType string) bool
}

// staged is an aggregate as a batch sees it: decoded on first touch, changed
// by the batch's commands, installed only if the transaction commits.
type staged[S any] struct {
	snap      Snapshot[S]
	partition int32
	dirty     bool
	last      pipeline.ID // the batch's last command that changed it, blamed for its snapshot
	entry     []byte      // after snapshot(): the table entry (id and encoded snapshot)
}

// aggregateKey names an aggregate within a partition. An aggregate's
// commands all come on one partition when producers partition by key, as
// they must; keying by partition too keeps each partition's snapshots
// consistent with its offsets even when one does not.
type aggregateKey struct {
	partition int32
	id        string
}

// batch is one transaction's work.
type batch[S any] struct {
	p       *Processor[S]
	ctx     context.Context
	cl      *kgo.Client
	promise *kgo.FirstErrPromise
	overlay map[aggregateKey]*staged[S]
	buf     []byte // scratch for snapshot encoding

	accepted, rejected, dedup int
	dlq                       map[string]int
	failed                    error         // a transient failure: the batch aborts
	setAside                  []pipeline.ID // refused commands this batch sent to the DLQ

	// refused holds the records the broker refused for good (too large,
	// invalid), each with the command whose decision it is; the produce
	// callbacks fill it from the client's goroutines.
	refusedMu sync.Mutex
	refused   []refusal
}

// refusal is a record the broker refused for good.
type refusal struct {
	cmd      pipeline.ID
	size     int
	snapshot bool // a snapshot, blamed on the last command that changed the aggregate
	err      error
}

func newBatch[S any](p *Processor[S], ctx context.Context, cl *kgo.Client, promise *kgo.FirstErrPromise) *batch[S] {
	return &batch[S]{
		p: p, ctx: ctx, cl: cl, promise: promise,
		overlay: make(map[aggregateKey]*staged[S]),
		dlq:     make(map[string]int),
	}
}

func (b *batch[S]) produce(r *kgo.Record) { b.cl.Produce(b.ctx, r, b.promise.Promise()) }

// produceFor produces a record of cmd's decision. If the broker refuses it
// for good, it is noted with cmd: the transaction aborts, and the batch is
// decided again with cmd sent to the DLQ instead (Processor.learnRefused).
func (b *batch[S]) produceFor(r *kgo.Record, cmd pipeline.ID) {
	promise := b.promise.Promise()
	snapshot := r.Topic == b.p.state
	b.cl.Produce(b.ctx, r, func(r *kgo.Record, err error) {
		if err != nil && kafka.RefusedForGood(err) {
			size := len(r.Key) + len(r.Value)
			b.refusedMu.Lock()
			b.refused = append(b.refused, refusal{cmd, size, snapshot, fmt.Errorf("%s record of %d bytes: %w", r.Topic, size, err)})
			b.refusedMu.Unlock()
		}
		promise(r, err)
	})
}

// fail aborts the batch: nothing it produced will commit.
func (b *batch[S]) fail(err error) {
	if b.failed == nil {
		b.failed = err
		b.promise.Promise()(nil, err)
	}
}

// poison is a record that cannot be handled, with the DLQ reason.
type poison struct {
	reason string
	err    error
}

func (e *poison) Error() string { return e.reason + ": " + e.err.Error() }

func poisoned(reason string, format string, args ...any) *poison {
	return &poison{reason, fmt.Errorf(format, args...)}
}

// handle decides one command record.
func (b *batch[S]) handle(r *kgo.Record) {
	if b.failed != nil {
		return
	}
	cmd, perr, err := b.parse(r)
	if err != nil {
		b.fail(err)
		return
	}
	if perr != nil {
		b.deadLetter(r, perr)
		return
	}
	agg, err := b.load(r.Partition, cmd.AggregateID)
	if err != nil {
		b.fail(err)
		return
	}
	if agg.snap.seen(cmd.ID) {
		b.dedup++
		return
	}
	if err, ok := b.p.refused[cmd.ID]; ok {
		b.deadLetter(r, &poison{ReasonOutputRefused, fmt.Errorf("the broker refused its decision for good: %w", err)})
		b.setAside = append(b.setAside, cmd.ID)
		return
	}
	out, perr := b.decide(agg, cmd)
	if perr != nil {
		b.deadLetter(r, perr)
		return
	}
	// Encode everything before producing anything, so a command either
	// produces its whole decision or goes to the DLQ.
	recs := make([]*kgo.Record, 0, len(out.events)+len(out.effects))
	for _, ev := range out.events {
		rec, err := b.eventRecord(ev)
		if err != nil {
			b.deadLetter(r, &poison{ReasonEncode, err})
			return
		}
		recs = append(recs, rec)
	}
	for _, ef := range out.effects {
		rec, err := b.commandRecord(cmd, ef)
		if err != nil {
			b.deadLetter(r, &poison{ReasonEncode, err})
			return
		}
		recs = append(recs, rec)
	}
	for _, rec := range recs {
		b.produceFor(rec, cmd.ID)
	}
	if out.rejected {
		b.rejected++
	} else {
		b.accepted++
	}
	agg.snap.State, agg.snap.Version = out.state, out.version
	agg.snap.remember(cmd.ID, cmd.Time, b.p.cfg.DedupWindow)
	agg.dirty, agg.last = true, cmd.ID
}

// parse checks a command record's headers and decodes its value. A
// poison record is the record's fault (it goes to the DLQ); an error is
// not (the registry is unreachable): the batch aborts and is decided again
// after a pause.
func (b *batch[S]) parse(r *kgo.Record) (pipeline.Command, *poison, error) {
	var idHdr, tenant, cmdType, traceparent string
	var haveID bool
	for _, h := range r.Headers {
		switch h.Key {
		case pipeline.HeaderCommandID:
			idHdr, haveID = string(h.Value), true
		case pipeline.HeaderTenant:
			tenant = string(h.Value)
		case pipeline.HeaderCommandType:
			cmdType = string(h.Value)
		case pipeline.HeaderTraceparent:
			traceparent = string(h.Value)
		}
	}
	if !haveID || idHdr == "" {
		return pipeline.Command{}, poisoned(ReasonMissingCommandID, "record has no %s header", pipeline.HeaderCommandID), nil
	}
	id, err := pipeline.ParseID(idHdr)
	if err != nil {
		return pipeline.Command{}, poisoned(ReasonInvalidCommandID, "%s %q: %v", pipeline.HeaderCommandID, idHdr, err), nil
	}
	if tenant == "" {
		return pipeline.Command{}, poisoned(ReasonMissingTenant, "record has no %s header", pipeline.HeaderTenant), nil
	}
	aggTenant, _, err := pipeline.SplitAggregateID(string(r.Key))
	if err != nil {
		return pipeline.Command{}, poisoned(ReasonInvalidKey, "%v", err), nil
	}
	if aggTenant != tenant {
		return pipeline.Command{}, poisoned(ReasonTenantMismatch, "aggregate %q belongs to tenant %q, not %q", r.Key, aggTenant, tenant), nil
	}
	v, err := b.p.serdes.Commands.Decode(b.ctx, r.Value)
	switch {
	case errors.Is(err, pipeline.ErrUnknownSchema):
		return pipeline.Command{}, &poison{ReasonUnknownSchema, err}, nil
	case errors.Is(err, pipeline.ErrIncompatible):
		return pipeline.Command{}, &poison{ReasonUnknownType, err}, nil
	case errors.Is(err, pipeline.ErrUndecodable):
		return pipeline.Command{}, &poison{ReasonUndecodable, err}, nil
	case err != nil:
		return pipeline.Command{}, nil, err
	}
	msg, ok := v.(pipeline.Message)
	if !ok {
		return pipeline.Command{}, poisoned(ReasonUnknownType, "decoded a %T, which is not a command", v), nil
	}
	if cmdType != "" && cmdType != msg.MessageType() {
		return pipeline.Command{}, poisoned(ReasonCommandTypeMismatch, "header says %q, value is %q", cmdType, msg.MessageType()), nil
	}
	if h, ok := b.p.decider.(handlesTypes); ok && !h.Handles(msg.MessageType()) {
		return pipeline.Command{}, poisoned(ReasonUnknownType, "no decider is registered for command type %s", msg.MessageType()), nil
	}
	return pipeline.Command{
		ID: id, Tenant: tenant, AggregateID: string(r.Key), Time: r.Timestamp,
		Traceparent: traceparent, Payload: msg,
	}, nil, nil
}

// load returns the batch's copy of an aggregate, decoding its committed
// snapshot on first touch. A partition whose state is not restored (which
// the group protocol rules out) fails the batch rather than deciding on an
// empty state.
func (b *batch[S]) load(part int32, id string) (*staged[S], error) {
	k := aggregateKey{part, id}
	if a, ok := b.overlay[k]; ok {
		return a, nil
	}
	tab := b.p.table(part)
	if tab == nil {
		return nil, fmt.Errorf("partition %d has a record but no restored state", part)
	}
	a := &staged[S]{partition: part}
	if value, ok := tab.get(id); ok {
		snap, err := b.p.codec.decode(b.ctx, []byte(value))
		if err != nil {
			// Restore decoded it once already; failing now means the
			// registry is unreachable for an old schema id.
			return nil, fmt.Errorf("decode state of %s: %w", id, err)
		}
		a.snap = snap
	}
	b.overlay[k] = a
	return a, nil
}

// outcome is a command's decision with the aggregate it leads to.
type outcome[S any] struct {
	events   []pipeline.Event
	effects  []pipeline.Effect
	rejected bool
	state    S
	version  int64
}

// decide runs the decider on agg (without changing it), turning a panic
// into a poison record, and returns the events with their ids and
// versions, the follow-up commands and the new state.
func (b *batch[S]) decide(agg *staged[S], cmd pipeline.Command) (out outcome[S], perr *poison) {
	defer func() {
		if v := recover(); v != nil {
			out, perr = outcome[S]{}, poisoned(ReasonDeciderPanic, "decider panicked on %s: %v", cmd.Type(), v)
		}
	}()
	state, version := agg.snap.State, agg.snap.Version
	d, err := b.p.decider.Decide(state, cmd)
	base := pipeline.Event{CommandID: cmd.ID, Tenant: cmd.Tenant, AggregateID: cmd.AggregateID, Time: cmd.Time, Traceparent: cmd.Traceparent}
	out = outcome[S]{effects: d.Commands, state: state, version: version}
	if rej, ok := pipeline.AsRejection(err); ok {
		ev := base
		ev.ID = pipeline.EventID(cmd.AggregateID, cmd.ID, 0)
		ev.Version = version // a rejection does not change the aggregate
		ev.Payload = pipeline.CommandRejected{CommandType: cmd.Type(), Reason: rej.Reason, Detail: rej.Detail}
		out.events, out.rejected = []pipeline.Event{ev}, true
		return out, nil
	}
	if err != nil {
		return outcome[S]{}, &poison{ReasonDeciderError, err}
	}
	for i, m := range d.Events {
		out.version++
		ev := base
		ev.ID = pipeline.EventID(cmd.AggregateID, cmd.ID, i)
		ev.Version = out.version
		ev.Payload = m
		out.state = b.p.decider.Evolve(out.state, ev)
		out.events = append(out.events, ev)
	}
	return out, nil
}

func (b *batch[S]) eventRecord(ev pipeline.Event) (*kgo.Record, error) {
	value, err := b.p.serdes.Events.Encode(b.ctx, ev.Payload)
	if err != nil {
		return nil, fmt.Errorf("encode %s: %w", ev.Type(), err)
	}
	rec := &kgo.Record{
		Topic: b.p.events, Key: []byte(ev.AggregateID), Value: value, Timestamp: ev.Time,
		Headers: []kgo.RecordHeader{
			{Key: pipeline.HeaderEventID, Value: []byte(ev.ID.String())},
			{Key: pipeline.HeaderEventType, Value: []byte(ev.Type())},
			{Key: pipeline.HeaderCommandID, Value: []byte(ev.CommandID.String())},
			{Key: pipeline.HeaderAggregateVersion, Value: []byte(strconv.FormatInt(ev.Version, 10))},
			{Key: pipeline.HeaderTenant, Value: []byte(ev.Tenant)},
		},
	}
	if ev.Traceparent != "" {
		rec.Headers = append(rec.Headers, kgo.RecordHeader{Key: pipeline.HeaderTraceparent, Value: []byte(ev.Traceparent)})
	}
	return rec, nil
}

func (b *batch[S]) commandRecord(cause pipeline.Command, ef pipeline.Effect) (*kgo.Record, error) {
	value, err := b.p.serdes.Commands.Encode(b.ctx, ef.Payload)
	if err != nil {
		return nil, fmt.Errorf("encode %s: %w", ef.Payload.MessageType(), err)
	}
	return CommandRecord(b.p.commands, ef.AggregateID, ef.CommandID, ef.Payload.MessageType(), value, cause.Time, cause.Traceparent)
}

// deadLetter produces r to the DLQ with its reason, in the transaction.
func (b *batch[S]) deadLetter(r *kgo.Record, p *poison) {
	b.p.dlqLog.log(b.p.logger, "poison command to dlq", "partition", r.Partition, "offset", r.Offset, "reason", p.reason, "err", p.err)
	b.produce(deadLetterRecord(b.p.dlq, r, p.reason, p.err.Error()))
	b.dlq[p.reason]++
}

// deadLetterRecord is r as it goes to the DLQ: key, value, timestamp and
// headers as they came, plus the reason headers.
func deadLetterRecord(topic string, r *kgo.Record, reason, detail string) *kgo.Record {
	headers := append(append([]kgo.RecordHeader(nil), r.Headers...),
		kgo.RecordHeader{Key: pipeline.HeaderDLQReason, Value: []byte(reason)},
		kgo.RecordHeader{Key: HeaderDLQDetail, Value: []byte(detail)},
		kgo.RecordHeader{Key: pipeline.HeaderDLQSourceTopic, Value: []byte(r.Topic)},
		kgo.RecordHeader{Key: pipeline.HeaderDLQSourcePartition, Value: []byte(strconv.Itoa(int(r.Partition)))},
		kgo.RecordHeader{Key: pipeline.HeaderDLQSourceOffset, Value: []byte(strconv.FormatInt(r.Offset, 10))},
	)
	return &kgo.Record{Topic: topic, Key: r.Key, Value: r.Value, Headers: headers, Timestamp: r.Timestamp}
}

// snapshot produces the changed aggregates' snapshots to the state topic,
// at the command's partition number.
func (b *batch[S]) snapshot() {
	for k, a := range b.overlay {
		if !a.dirty {
			continue
		}
		id := k.id
		// The record's key and value are slices of the table entry the
		// commit installs, so the snapshot is encoded once.
		e := binary.AppendUvarint(make([]byte, 0, 2+len(id)+64), uint64(len(id)))
		e = append(e, id...)
		valueAt := len(e)
		e, err := b.p.codec.appendEncode(b.ctx, e, &a.snap)
		if err != nil {
			// The transaction must not commit without this snapshot.
			b.fail(fmt.Errorf("encode snapshot of %s: %w", id, err))
			return
		}
		a.entry = e
		b.produceFor(&kgo.Record{Topic: b.p.state, Partition: a.partition, Key: e[valueAt-len(id) : valueAt], Value: e[valueAt:], Timestamp: a.snap.lastAt()}, a.last)
	}
}

// commit installs the batch's snapshots after its transaction committed,
// and counts what it did.
func (b *batch[S]) commit() {
	p := b.p
	p.mu.Lock()
	for _, a := range b.overlay {
		if !a.dirty {
			continue
		}
		if tab, owned := p.parts[a.partition]; owned {
			tab.put(string(a.entry))
		}
	}
	p.metrics.aggregates.Set(float64(p.countLocked()))
	p.mu.Unlock()
	for _, id := range b.setAside {
		delete(p.refused, id)
	}
	p.metrics.commands.WithLabelValues("accepted").Add(float64(b.accepted))
	p.metrics.commands.WithLabelValues("rejected").Add(float64(b.rejected))
	p.metrics.dedup.Add(float64(b.dedup))
	for reason, n := range b.dlq {
		p.metrics.dlq.WithLabelValues(reason).Add(float64(n))
	}
}
