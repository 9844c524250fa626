package chaos

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/onceflow/onceflow/examples/ledger"
	"github.com/onceflow/onceflow/pipeline"
	"github.com/onceflow/onceflow/pipeline/avro"
	"github.com/onceflow/onceflow/pipeline/kafka"
	"github.com/onceflow/onceflow/pipeline/processor"
)

// The hostile stream: records a producer writing straight to
// {prefix}.commands can send, which the processor must refuse
// (docs/processor.md), interleaved with the good traffic while the faults
// happen. Each goes to the DLQ with its reason in the transaction that
// commits its offset, so a read_committed reader sees it there exactly once
// however often the faults make the processor read it again; the ones that
// name a valid command of a valid aggregate are also recorded there as
// CommandFailed, and their status is failed. None may change a balance.

// headerHostile numbers each hostile record (the DLQ keeps a record's
// headers), so the checker knows every copy of it wherever it shows up. The
// processor ignores headers it does not know.
const headerHostile = "chaos-hostile"

// futureSkew is how far ahead a future-timestamp record is dated: well
// past the processor's MaxClockSkew (15 minutes by default; the chaos run
// keeps it), and inside Apache Kafka 4's message.timestamp.after.max.ms
// (an hour), beyond which the broker refuses the record at produce.
const futureSkew = 30 * time.Minute

// pastAge is how far back a past-timestamp record is dated: beyond the
// commands topic's retention (7 days) and a day, the processor's bound.
const pastAge = 9 * 24 * time.Hour

// hostileKind is one kind of record the processor must refuse.
type hostileKind struct {
	name string
	// reason is the dlq-reason the processor must give it; empty for a
	// record the broker itself must refuse (over max.message.bytes).
	reason string
	// onAggregate: the record names a valid command (a UUID command-id, a
	// tenant matching its key) of a valid aggregate (its key), so the
	// processor records the failure there as CommandFailed.
	onAggregate bool
	build       func(h hostileTarget) *kgo.Record
}

// hostileKinds are the poison kinds the processor refuses
// (pipeline/processor: parse), each built from a good command.
var hostileKinds = []hostileKind{
	{"key with invalid UTF-8", processor.ReasonInvalidKey, false, func(h hostileTarget) *kgo.Record {
		return withKey(h.deposit(), h.tenant+"/acc\xff"+h.tag)
	}},
	{"key with a NUL byte", processor.ReasonInvalidKey, false, func(h hostileTarget) *kgo.Record {
		return withKey(h.deposit(), h.tenant+"/acc\x00"+h.tag)
	}},
	{"key with a local id over MaxLocalIDLen", processor.ReasonInvalidKey, false, func(h hostileTarget) *kgo.Record {
		return withKey(h.deposit(), h.tenant+"/"+strings.Repeat("a", pipeline.MaxLocalIDLen+1))
	}},
	{"string field with invalid UTF-8", processor.ReasonInvalidField, true, func(h hostileTarget) *kgo.Record {
		return h.transfer("tr\xc3\x28"+h.tag, h.other)
	}},
	{"string field with a NUL byte", processor.ReasonInvalidField, true, func(h hostileTarget) *kgo.Record {
		return h.transfer("tr\x00"+h.tag, h.other)
	}},
	{"string field over MaxLocalIDLen", processor.ReasonInvalidField, true, func(h hostileTarget) *kgo.Record {
		return h.transfer("tr"+h.tag, strings.Repeat("b", pipeline.MaxLocalIDLen+1))
	}},
	{"command-id that is no UUID", processor.ReasonInvalidCommandID, false, func(h hostileTarget) *kgo.Record {
		return withHeader(h.deposit(), pipeline.HeaderCommandID, "not-a-uuid"+h.tag)
	}},
	{"command-id over a UUID's length", processor.ReasonInvalidCommandID, false, func(h hostileTarget) *kgo.Record {
		return withHeader(h.deposit(), pipeline.HeaderCommandID, strings.Repeat("0", 300))
	}},
	{"no command-id header", processor.ReasonMissingCommandID, false, func(h hostileTarget) *kgo.Record {
		return withoutHeader(h.deposit(), pipeline.HeaderCommandID)
	}},
	{"no tenant header", processor.ReasonMissingTenant, false, func(h hostileTarget) *kgo.Record {
		return withoutHeader(h.deposit(), pipeline.HeaderTenant)
	}},
	{"value of a schema id the registry does not have", processor.ReasonUnknownSchema, true, func(h hostileTarget) *kgo.Record {
		r := h.deposit()
		r.Value = avro.AppendHeader(nil, 1<<30)
		return r
	}},
	{"value that is not Avro", processor.ReasonUndecodable, true, func(h hostileTarget) *kgo.Record {
		r := h.deposit()
		r.Value = []byte("not avro at all")
		return r
	}},
	{"tenant header of another tenant", processor.ReasonTenantMismatch, false, func(h hostileTarget) *kgo.Record {
		return withHeader(h.deposit(), pipeline.HeaderTenant, h.foreign)
	}},
	{"command-type header unlike the value", processor.ReasonCommandTypeMismatch, true, func(h hostileTarget) *kgo.Record {
		return withHeader(h.deposit(), pipeline.HeaderCommandType, "Withdraw")
	}},
	{"timestamp half an hour ahead", processor.ReasonFutureTimestamp, true, func(h hostileTarget) *kgo.Record {
		r := h.deposit()
		r.Timestamp = time.Now().Add(futureSkew)
		return r
	}},
	{"timestamp days back, past the commands topic's retention", processor.ReasonPastTimestamp, true, func(h hostileTarget) *kgo.Record {
		r := h.deposit()
		r.Timestamp = time.Now().Add(-pastAge)
		return r
	}},
	{"timestamp before year 0", processor.ReasonPastTimestamp, true, func(h hostileTarget) *kgo.Record {
		r := h.deposit()
		r.Timestamp = time.Date(-1, 6, 1, 0, 0, 0, 0, time.UTC)
		return r
	}},
	{"value over the processor's MaxCommandBytes", processor.ReasonTooLarge, true, func(h hostileTarget) *kgo.Record {
		return h.transfer("tr"+h.tag+strings.Repeat("x", maxCommandBytes), h.other)
	}},
	{"record over the topic's max.message.bytes", "", false, func(h hostileTarget) *kgo.Record {
		return h.transfer("tr"+h.tag+strings.Repeat("y", h.w.maxMessageBytes+64<<10), h.other)
	}},
}

// hostileTarget is what one hostile record is built from, all drawn from
// the stream's seeded generator.
type hostileTarget struct {
	w       *workload
	ctx     context.Context
	tenant  string // the tenant of the aggregate the record names
	account string // its local id (the hot account half the time)
	other   string // another account of the tenant, a transfer's target
	foreign string // another tenant
	amount  int64
	tag     string // unique per record: no two share a key or a transfer id
}

func (h hostileTarget) command(p pipeline.Message) *kgo.Record {
	value, err := h.w.encode(h.ctx, p)
	if err != nil {
		panic(err) // the serde is ours; this is a bug
	}
	r, err := kafka.CommandRecord(h.w.topic, pipeline.AggregateID(h.tenant, h.account), pipeline.NewCommandID(), p.MessageType(), value, time.Now(), "")
	if err != nil {
		panic(err)
	}
	return r
}

func (h hostileTarget) deposit() *kgo.Record { return h.command(ledger.Deposit{Amount: h.amount}) }

// transfer is a RequestTransfer: were it applied, it would debit the
// account, which the balance check would see.
func (h hostileTarget) transfer(transferID, to string) *kgo.Record {
	return h.command(ledger.RequestTransfer{TransferID: transferID, To: to, Amount: h.amount})
}

func withKey(r *kgo.Record, key string) *kgo.Record {
	r.Key = []byte(key)
	return r
}

func withHeader(r *kgo.Record, key, value string) *kgo.Record {
	for i := range r.Headers {
		if r.Headers[i].Key == key {
			r.Headers[i].Value = []byte(value)
		}
	}
	return r
}

func withoutHeader(r *kgo.Record, key string) *kgo.Record {
	r.Headers = slices.DeleteFunc(r.Headers, func(h kgo.RecordHeader) bool { return h.Key == key })
	return r
}

// hostileRecord is one hostile record the workload produced, and what the
// broker answered.
type hostileRecord struct {
	n          int
	kind       *hostileKind
	key, value []byte
	commandID  string // the command-id header as sent
	cmdType    string // the command-type header as sent: what CommandFailed must name
	tenant     string // onAggregate: the tenant and the aggregate it is recorded on
	aggregate  string
	acked      bool // the broker took it, at partition/offset
	partition  int32
	offset     int64
	err        error         // the producer's error, if it got one
	wait       time.Duration // from produce to the broker's answer
}

// runHostile produces hostile records until stop ends: rounds of every
// kind in a seeded order, a seeded pause before each, then one reuse of a
// command id. Every draw is made before the record is sent, so a seed sends
// the same sequence however long the broker takes to answer.
func (w *workload) runHostile(stop, finish context.Context) {
	rng := rand.New(rand.NewPCG(w.seed, 0x40571e))
	for n := 0; ; {
		for _, k := range rng.Perm(len(hostileKinds)) {
			pause := time.Duration(100+rng.IntN(300)) * time.Millisecond
			h := w.target(finish, rng, n)
			select {
			case <-stop.Done():
				return
			case <-time.After(pause):
			}
			w.sendHostile(finish, n, &hostileKinds[k], h)
			n++
		}
		w.reuse(finish, rng)
	}
}

// target draws what the n-th hostile record is built from.
func (w *workload) target(ctx context.Context, rng *rand.Rand, n int) hostileTarget {
	ti := rng.IntN(len(w.tenants))
	t := w.tenants[ti]
	i := rng.IntN(len(t.accounts))
	if rng.IntN(100) < 50 {
		i = hotAccount
	}
	return hostileTarget{
		w: w, ctx: ctx, tenant: t.name, account: t.accounts[i],
		other:   t.accounts[(i+1+rng.IntN(len(t.accounts)-1))%len(t.accounts)],
		foreign: w.tenants[(ti+1+rng.IntN(len(w.tenants)-1))%len(w.tenants)].name,
		amount:  int64(1 + rng.IntN(500)),
		tag:     fmt.Sprintf("-h%d", n),
	}
}

// hostileProduceTimeout bounds the wait for the broker's answer to one
// hostile record: the producer retries through broker restarts on its
// own, so a record is sent once, and any answer, an error included, is an
// answer. An oversized record must get its refusal well within it.
const hostileProduceTimeout = 2 * time.Minute

func (w *workload) sendHostile(ctx context.Context, n int, kind *hostileKind, h hostileTarget) {
	r := kind.build(h)
	r.Headers = append(r.Headers, kgo.RecordHeader{Key: headerHostile, Value: []byte(strconv.Itoa(n))})
	hr := &hostileRecord{
		n: n, kind: kind, key: r.Key, value: r.Value,
		commandID: header(r, pipeline.HeaderCommandID), cmdType: header(r, pipeline.HeaderCommandType),
	}
	if kind.onAggregate {
		hr.tenant, hr.aggregate = h.tenant, pipeline.AggregateID(h.tenant, h.account)
	}
	pctx, cancel := context.WithTimeout(ctx, hostileProduceTimeout)
	defer cancel()
	start := time.Now()
	got, err := w.hostileProducer.ProduceSync(pctx, r).First()
	hr.wait = time.Since(start)
	if err != nil {
		hr.err = err
	} else {
		hr.acked, hr.partition, hr.offset = true, got.Partition, got.Offset
	}
	w.m.mu.Lock()
	w.m.hostile = append(w.m.hostile, hr)
	w.m.mu.Unlock()
}

// reuse produces the id of the last command ingest accepted again,
// straight to Kafka, as a Deposit to another account of its tenant and to
// an account of another tenant. No poison: a command is its id within its
// tenant and aggregate, so these are two more commands, to be applied.
func (w *workload) reuse(ctx context.Context, rng *rand.Rand) {
	// Drawn first, so the stream's sequence does not depend on whether
	// ingest accepted anything yet.
	nextAccount, nextTenant, foreignAccount := rng.IntN(len(w.tenants[0].accounts)-1), rng.IntN(len(w.tenants)-1), rng.IntN(len(w.tenants[0].accounts))
	amount := int64(1 + rng.IntN(500))
	last := w.m.lastHTTP.Load()
	if last == nil {
		return
	}
	ti, ai := 0, 0
	for i, t := range w.tenants {
		if t.name == last.Tenant {
			ti = i
		}
	}
	for i, a := range w.tenants[ti].accounts {
		if a == last.Account {
			ai = i
		}
	}
	same := w.tenants[ti]
	other := w.tenants[(ti+1+nextTenant)%len(w.tenants)]
	id := pipeline.MustParseID(last.ID)
	a := w.produceDeposit(ctx, id, same.name, same.accounts[(ai+1+nextAccount)%len(same.accounts)], amount, false)
	b := w.produceDeposit(ctx, id, other.name, other.accounts[foreignAccount], amount, false)
	if a && b {
		w.m.reusedIDs.Add(1)
	}
}
