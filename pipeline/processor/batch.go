package processor

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/twmb/franz-go/pkg/kgo"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

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
	ReasonInvalidField        = "invalid-field"
	ReasonFutureTimestamp     = "future-timestamp"
	ReasonPastTimestamp       = "past-timestamp"
	ReasonTooLarge            = "too-large"
	// ReasonBatchTooLarge is the DLQ record of an operator's skip of a
	// batch that decompresses beyond the consumers' bound: the batch
	// itself could not be read, so the record names its offsets only.
	ReasonBatchTooLarge = "batch-too-large"
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
	last      digest // the batch's last command that changed it, blamed for its snapshot
	entry     []byte // after snapshot(): the table entry (id and encoded snapshot)
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

	// now is the batch's time on the processor's clock (unix ms): the time
	// the ids it handles are remembered at, and what a command's time is
	// checked against.
	now int64
	// fresh holds the ids this batch handled, by partition, in order: they
	// go to the dedup changelog in the transaction and into the
	// partition's idStore once it commits; freshSet finds them meanwhile.
	fresh    map[int32][]digest
	freshSet map[partDigest]struct{}

	accepted, rejected, dedup int
	decidedAt                 []int64 // the times (unix ms) of the commands decided, for their age at commit
	dlq                       map[string]int
	failed                    error    // a transient failure: the batch aborts
	setAside                  []digest // refused commands this batch sent to the DLQ

	// refused holds the records the broker refused for good (too large,
	// invalid), each with the command whose decision it is; the produce
	// callbacks fill it from the client's goroutines.
	refusedMu sync.Mutex
	refused   []refusal
}

// refusal is a record the broker refused for good.
type refusal struct {
	cmd      digest
	part     int32
	size     int
	snapshot bool // a snapshot, blamed on the last command that changed the aggregate
	err      error
}

// partDigest is a command remembered in one partition.
type partDigest struct {
	partition int32
	d         digest
}

func newBatch[S any](p *Processor[S], ctx context.Context, cl *kgo.Client, promise *kgo.FirstErrPromise) *batch[S] {
	return &batch[S]{
		p: p, ctx: ctx, cl: cl, promise: promise,
		now:      p.now().UnixMilli(),
		overlay:  make(map[aggregateKey]*staged[S]),
		fresh:    make(map[int32][]digest),
		freshSet: make(map[partDigest]struct{}),
		dlq:      make(map[string]int),
	}
}

func (b *batch[S]) produce(r *kgo.Record) { b.cl.Produce(b.ctx, r, b.promise.Promise()) }

// produceFor produces a record of cmd's decision. If the broker refuses it
// for good, it is noted with cmd: the transaction aborts, and the batch is
// decided again with cmd sent to the DLQ instead (Processor.learnRefused).
func (b *batch[S]) produceFor(r *kgo.Record, cmd digest) {
	promise := b.promise.Promise()
	snapshot := r.Topic == b.p.state
	b.cl.Produce(b.ctx, r, func(r *kgo.Record, err error) {
		if err != nil && kafka.RefusedForGood(err) {
			size := len(r.Key) + len(r.Value)
			b.refusedMu.Lock()
			b.refused = append(b.refused, refusal{cmd, r.Partition, size, snapshot, fmt.Errorf("%s record of %d bytes: %w", r.Topic, size, err)})
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
	// The decision's span, a child of kotel's receive span when the record
	// has a trace; the records of the decision are produced in it.
	ctx, span := b.p.tracer.Child(r.Context, "onceflow.processor.decide")
	defer span.End()
	cmd, perr, err := b.parse(r)
	if err != nil {
		b.fail(err)
		return
	}
	if perr != nil {
		outcomeOf(span, "dlq")
		b.deadLetter(r, cmd, perr)
		return
	}
	agg, err := b.load(r.Partition, cmd.AggregateID)
	if err != nil {
		b.fail(err)
		return
	}
	d := dedupDigest(cmd.AggregateID, cmd.ID)
	if b.remembered(r.Partition, d) {
		outcomeOf(span, "duplicate")
		b.dedup++
		return
	}
	if err, ok := b.p.refusedFor(d); ok {
		b.deadLetter(r, cmd, &poison{ReasonOutputRefused, fmt.Errorf("the broker refused its decision for good: %w", err)})
		b.setAside = append(b.setAside, d)
		return
	}
	out, perr := b.decide(agg, cmd)
	if perr != nil {
		outcomeOf(span, "dlq")
		b.deadLetter(r, cmd, perr)
		return
	}
	// Encode everything before producing anything, so a command either
	// produces its whole decision or goes to the DLQ.
	recs := make([]*kgo.Record, 0, len(out.events)+len(out.effects))
	for _, ev := range out.events {
		rec, err := b.eventRecord(ev)
		if err != nil {
			b.deadLetter(r, cmd, &poison{ReasonEncode, err})
			return
		}
		recs = append(recs, rec)
	}
	for _, ef := range out.effects {
		rec, err := b.commandRecord(cmd, ef)
		if err != nil {
			b.deadLetter(r, cmd, &poison{ReasonEncode, err})
			return
		}
		recs = append(recs, rec)
	}
	for _, rec := range recs {
		if span.IsRecording() {
			rec.Context = ctx
		}
		b.produceFor(rec, d)
	}
	if out.rejected {
		outcomeOf(span, "rejected")
		b.rejected++
	} else {
		outcomeOf(span, "accepted")
		b.accepted++
	}
	b.decidedAt = append(b.decidedAt, cmd.Time.UnixMilli())
	agg.snap.State, agg.snap.Version = out.state, out.version
	agg.snap.forget(b.now - b.p.cfg.DedupWindow.Milliseconds())
	agg.dirty, agg.last = true, d
	b.remember(r.Partition, d)
}

// remembered reports whether the partition has handled the command d
// names within the dedup window: in a committed transaction or earlier in
// this batch.
func (b *batch[S]) remembered(part int32, d digest) bool {
	if _, ok := b.freshSet[partDigest{part, d}]; ok {
		return true
	}
	ids := b.p.idStore(part)
	return ids != nil && ids.contains(d)
}

// remember notes that the batch handled the command d names.
func (b *batch[S]) remember(part int32, d digest) {
	b.fresh[part] = append(b.fresh[part], d)
	b.freshSet[partDigest{part, d}] = struct{}{}
}

// parse checks a command record's key, headers and size, decodes its
// value and checks its fields, as ingest checks an HTTP request: a command
// produced straight to Kafka gets no more trust than one sent over HTTP. A
// poison record is the record's fault (it goes to the DLQ); an error is
// not (the registry is unreachable): the batch aborts and is decided again
// after a pause. The returned command carries whatever identity was valid
// before the record turned out poison (Command.ID, Tenant and AggregateID
// once key and headers checked out): the processor then records the
// failure on the aggregate (deadLetter).
func (b *batch[S]) parse(r *kgo.Record) (pipeline.Command, *poison, error) {
	f := kafka.CommandFieldsOf(r)
	idHdr, tenant, cmdType, traceparent := f.CommandID, f.Tenant, f.CommandType, f.Traceparent
	haveID, haveTenant := f.HasCommandID, f.HasTenant
	var cmd pipeline.Command
	if !haveID || len(idHdr) == 0 {
		return cmd, poisoned(ReasonMissingCommandID, "record has no %s header", pipeline.HeaderCommandID), nil
	}
	id, err := pipeline.ParseID(string(idHdr))
	if err != nil {
		return cmd, poisoned(ReasonInvalidCommandID, "%s %s: %v", pipeline.HeaderCommandID, quote(idHdr), err), nil
	}
	if !haveTenant || len(tenant) == 0 {
		return cmd, poisoned(ReasonMissingTenant, "record has no %s header", pipeline.HeaderTenant), nil
	}
	aggTenant, local, err := pipeline.SplitAggregateID(string(r.Key))
	if err != nil {
		return cmd, poisoned(ReasonInvalidKey, "key %s: want tenant/local-id", quote(r.Key)), nil
	}
	if pipeline.ValidateLocalID(aggTenant) != nil || pipeline.ValidateLocalID(local) != nil {
		return cmd, poisoned(ReasonInvalidKey, "key %s: tenant and local id %v", quote(r.Key), pipeline.ErrInvalidLocalID), nil
	}
	if aggTenant != string(tenant) {
		return cmd, poisoned(ReasonTenantMismatch, "aggregate %s belongs to tenant %q, not %s", quote(r.Key), aggTenant, quote(tenant)), nil
	}
	// From here on the record names a valid command of a valid aggregate.
	cmd = pipeline.Command{ID: id, Tenant: aggTenant, AggregateID: string(r.Key), Time: r.Timestamp}
	if validTraceparent(traceparent) {
		cmd.Traceparent = string(traceparent) // an invalid one is dropped, as W3C Trace Context says
	}
	if n := len(r.Value); n > b.p.cfg.MaxCommandBytes {
		return cmd, poisoned(ReasonTooLarge, "value of %d bytes, over the limit of %d", n, b.p.cfg.MaxCommandBytes), nil
	}
	if skew := r.Timestamp.UnixMilli() - b.now; skew > b.p.cfg.MaxClockSkew.Milliseconds() {
		return cmd, poisoned(ReasonFutureTimestamp, "record time %s is %s ahead of the processor's clock (the limit is %s)",
			r.Timestamp.UTC().Format(time.RFC3339Nano), time.Duration(skew)*time.Millisecond, b.p.cfg.MaxClockSkew), nil
	}
	// A command the pipeline accepted (accepted-by: an outbox row ingest
	// took, a decision's command) is dated when it was accepted: it is
	// never failed for the time the relay or the processor took since.
	// Before the Unix epoch is refused whoever sent it.
	if r.Timestamp.UnixMilli() < 0 || !acceptedByPipeline(f.AcceptedBy) && b.tooOld(r.Timestamp) {
		return cmd, poisoned(ReasonPastTimestamp, "record time %s is before the Unix epoch or more than %s behind the processor's clock (the commands topic's retention and a day, or ONCEFLOW_PROCESSOR_MAX_COMMAND_AGE)",
			r.Timestamp.UTC().Format(time.RFC3339Nano), b.p.maxCommandAge), nil
	}
	v, err := b.p.serdes.Commands.Decode(b.ctx, r.Value)
	switch {
	case errors.Is(err, pipeline.ErrUnknownSchema):
		return cmd, &poison{ReasonUnknownSchema, err}, nil
	case errors.Is(err, pipeline.ErrIncompatible):
		return cmd, &poison{ReasonUnknownType, err}, nil
	case errors.Is(err, pipeline.ErrUndecodable):
		return cmd, &poison{ReasonUndecodable, err}, nil
	case err != nil:
		return cmd, nil, err
	}
	msg, ok := v.(pipeline.Message)
	if !ok {
		return cmd, poisoned(ReasonUnknownType, "decoded a %T, which is not a command", v), nil
	}
	if len(cmdType) > 0 && string(cmdType) != msg.MessageType() {
		return cmd, poisoned(ReasonCommandTypeMismatch, "header says %s, value is %q", quote(cmdType), msg.MessageType()), nil
	}
	if h, ok := b.p.decider.(handlesTypes); ok && !h.Handles(msg.MessageType()) {
		return cmd, poisoned(ReasonUnknownType, "no decider is registered for command type %s", msg.MessageType()), nil
	}
	cmd.Payload = msg
	if err := pipeline.ValidateMessage(msg, b.p.cfg.MaxStringBytes); err != nil {
		return cmd, &poison{ReasonInvalidField, err}, nil
	}
	return cmd, nil, nil
}

// acceptedByPipeline says whether an accepted-by header names a part of
// the pipeline that accepts commands (pipeline.HeaderAcceptedBy).
func acceptedByPipeline(v []byte) bool {
	return string(v) == pipeline.AcceptedByRelay || string(v) == pipeline.AcceptedByProcessor
}

// acceptedHeader marks the commands a decision sends: the processor
// accepted them with their cause, and they carry the cause's time.
var acceptedHeader = kgo.RecordHeader{Key: pipeline.HeaderAcceptedBy, Value: []byte(pipeline.AcceptedByProcessor)}

// quote prints bytes from a record for a DLQ detail or a log: Go-quoted
// (invalid UTF-8 and control characters escaped) and cut at 200 bytes.
func quote(b []byte) string {
	const max = 200
	if len(b) > max {
		return strconv.Quote(string(b[:max])) + fmt.Sprintf("... (%d bytes)", len(b))
	}
	return strconv.Quote(string(b))
}

// validTraceparent reports whether v is a W3C traceparent of version 00:
// "00-" 32 hex "-" 16 hex "-" 2 hex, trace and parent ids not all zero.
func validTraceparent(v []byte) bool {
	if len(v) != 55 || v[0] != '0' || v[1] != '0' || v[2] != '-' || v[35] != '-' || v[52] != '-' {
		return false
	}
	hex := func(s []byte) (allZero, ok bool) {
		allZero = true
		for _, c := range s {
			switch {
			case '0' <= c && c <= '9', 'a' <= c && c <= 'f':
			default:
				return false, false
			}
			allZero = allZero && c == '0'
		}
		return allZero, true
	}
	z1, ok1 := hex(v[3:35])
	z2, ok2 := hex(v[36:52])
	_, ok3 := hex(v[53:55])
	return ok1 && ok2 && ok3 && !z1 && !z2
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
	base := pipeline.Event{CommandID: cmd.ID, CommandType: cmd.Type(), Tenant: cmd.Tenant, AggregateID: cmd.AggregateID, Time: cmd.Time, Traceparent: cmd.Traceparent}
	base.Derived = d.Sent() // on every event of the decision, a rejection's too
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
	return kafka.EventRecord(b.p.events, ev, value), nil
}

func (b *batch[S]) commandRecord(cause pipeline.Command, ef pipeline.Effect) (*kgo.Record, error) {
	topic, serde := b.p.commands, b.p.serdes.Commands
	if t, ok := b.p.serdes.Targets[ef.Payload.MessageType()]; ok {
		topic, serde = t.Topic, t.Commands
	}
	value, err := serde.Encode(b.ctx, ef.Payload)
	if err != nil {
		return nil, fmt.Errorf("encode %s: %w", ef.Payload.MessageType(), err)
	}
	rec, err := kafka.CommandRecord(topic, ef.AggregateID, ef.CommandID, ef.Payload.MessageType(), value, cause.Time, cause.Traceparent)
	if err != nil {
		return nil, err
	}
	rec.Headers = append(rec.Headers, acceptedHeader)
	return rec, nil
}

// deadLetter produces r to the DLQ with its reason, in the transaction.
// When the record names a valid command of a valid aggregate (cmd.ID is
// set), the failure is also recorded on the aggregate as a CommandFailed
// event, so the command's status is failed instead of pending forever. A
// failure is not remembered for dedup: a redrive of the record is decided.
func (b *batch[S]) deadLetter(r *kgo.Record, cmd pipeline.Command, p *poison) {
	b.p.dlqLog.log(b.p.logger, "poison command to dlq", "partition", r.Partition, "offset", r.Offset, "reason", p.reason, "err", p.err)
	detail := truncate(p.err.Error(), maxDetailBytes)
	b.produce(deadLetterRecord(b.p.dlq, r, p.reason, detail, b.dated(r.Timestamp), int(b.p.batchMaxBytes)-batchOverhead))
	b.dlq[p.reason]++
	if cmd.ID.IsZero() {
		return
	}
	agg, err := b.load(r.Partition, cmd.AggregateID)
	if err != nil {
		b.fail(err)
		return
	}
	cmdType := ""
	if cmd.Payload != nil {
		cmdType = cmd.Type()
	} else if t := headerValue(r, pipeline.HeaderCommandType); utf8.ValidString(t) && !strings.ContainsRune(t, 0) {
		cmdType = truncate(t, 128)
	}
	at := b.dated(cmd.Time)
	ev := pipeline.Event{
		ID: pipeline.FailureEventID(cmd.AggregateID, cmd.ID, r.Partition, r.Offset), CommandID: cmd.ID, CommandType: cmdType,
		Tenant: cmd.Tenant, AggregateID: cmd.AggregateID, Version: agg.snap.Version, Time: at, Traceparent: cmd.Traceparent,
		Payload: pipeline.CommandFailed{CommandType: cmdType, Reason: p.reason, Detail: detail},
	}
	rec, err := b.eventRecord(ev)
	if err != nil {
		// The events schema has no CommandFailed (a domain's schema from
		// before it existed): the DLQ record alone tells.
		b.p.dlqLog.log(b.p.logger, "cannot record a command's failure on its aggregate", "aggregate_id", cmd.AggregateID, "err", err)
		return
	}
	b.produce(rec)
}

// dated is t, or the batch's time if t is later or too old (tooOld). A
// command dated further ahead of the processor's clock than MaxClockSkew
// is poison: its DLQ record and its failure are dated when it was
// handled, so no broker refuses them for a timestamp ahead of its own
// (Kafka 4 refuses records more than an hour ahead by default), which
// would fail the whole batch they are in. A command inside the skew keeps
// its time in its events: MaxClockSkew stays well below the brokers'
// limit. A command dated too far back is poison too, and its failure is
// dated when it was handled, so no consumer of the events meets a time it
// cannot hold.
func (b *batch[S]) dated(t time.Time) time.Time {
	if t.UnixMilli() > b.now || b.tooOld(t) {
		return time.UnixMilli(b.now)
	}
	return t
}

// tooOld says whether t is before the Unix epoch or more than
// MaxCommandAge behind the batch's time.
func (b *batch[S]) tooOld(t time.Time) bool {
	ms := t.UnixMilli()
	return ms < 0 || b.now-ms > b.p.maxCommandAge.Milliseconds()
}

// maxDetailBytes bounds a DLQ detail (a header and an event field).
const maxDetailBytes = 1024

// truncate cuts s to at most n bytes, at a rune boundary, and makes it
// valid UTF-8.
func truncate(s string, n int) string {
	s = strings.ToValidUTF8(s, "\ufffd")
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n] + "..."
}

func headerValue(r *kgo.Record, key string) string {
	for _, h := range r.Headers {
		if h.Key == key {
			return string(h.Value)
		}
	}
	return ""
}

// snapshot produces the changed aggregates' snapshots to the state topic
// and the ids the batch handled to the dedup changelog, each at the
// command's partition number.
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
		b.p.metrics.snapshotBytes.Observe(float64(len(e) - valueAt))
		b.produceFor(&kgo.Record{Topic: b.p.state, Partition: a.partition, Key: e[valueAt-len(id) : valueAt], Value: e[valueAt:], Timestamp: time.UnixMilli(b.now)}, a.last)
	}
	for part, ds := range b.fresh {
		for len(ds) > 0 {
			n := min(len(ds), b.p.digestsPerRecord)
			b.produce(&kgo.Record{Topic: b.p.dedupTopic, Partition: part, Value: dedupRecordValue(ds[:n]), Timestamp: time.UnixMilli(b.now)})
			ds = ds[n:]
		}
	}
}

// commit installs the batch's snapshots and remembered ids after its
// transaction committed, and counts what it did.
func (b *batch[S]) commit() {
	p := b.p
	cutoff := b.now - p.cfg.DedupWindow.Milliseconds()
	p.mu.Lock()
	for _, a := range b.overlay {
		if !a.dirty {
			continue
		}
		if tab, owned := p.parts[a.partition]; owned {
			tab.put(string(a.entry))
		}
	}
	for part, ds := range b.fresh {
		if ids, owned := p.ids[part]; owned {
			ids.add(ds, b.now)
			ids.expire(cutoff)
		}
	}
	for _, d := range b.setAside {
		delete(p.refused, d)
	}
	p.updateGaugesLocked()
	p.mu.Unlock()
	now := time.Now().UnixMilli()
	for _, at := range b.decidedAt {
		p.metrics.age.Observe(float64(max(now-at, 0)) / 1000)
	}
	p.metrics.commands.WithLabelValues("accepted").Add(float64(b.accepted))
	p.metrics.commands.WithLabelValues("rejected").Add(float64(b.rejected))
	p.metrics.dedup.Add(float64(b.dedup))
	for reason, n := range b.dlq {
		p.metrics.dlq.WithLabelValues(reason).Add(float64(n))
	}
}

// outcomeOf notes a decision's outcome on its span.
func outcomeOf(span trace.Span, outcome string) {
	if span.IsRecording() {
		span.SetAttributes(attribute.String("onceflow.outcome", outcome))
	}
}
