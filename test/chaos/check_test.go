package chaos

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/onceflow/onceflow/examples/ledger"
	"github.com/onceflow/onceflow/pipeline"
	"github.com/onceflow/onceflow/pipeline/kafka"
)

// violation is a broken property with the records involved.
type violation struct {
	property string
	records  []string
}

func (v violation) String() string {
	const max = 20
	recs := v.records
	more := ""
	if len(recs) > max {
		more = fmt.Sprintf("\n    … and %d more", len(recs)-max)
		recs = recs[:max]
	}
	return v.property + "\n    " + strings.Join(recs, "\n    ") + more
}

// tally is what the checker counted, for the summary.
type tally struct {
	outcomes        int // commands with an outcome
	accepted        int
	rejected        int
	failed          int // good commands recorded as failed (must be 0)
	lost            int // commands without an outcome
	doubleEffects   int // events applied twice, balance mismatches
	processorDedup  int // command records the processor absorbed (same command-id on the same aggregate again)
	projectorDedup  int // event records the projector's inbox absorbed (same event-id again)
	events          int
	deposits        int64
	withdrawals     int64
	totalMoney      int64
	transfersRefund int

	hostileTaken   int           // hostile records in the commands topic
	hostileDLQ     int           // DLQ records of hostile records
	hostileFailed  int           // CommandFailed events of hostile records
	hostileRefused int           // records the broker refused (over max.message.bytes)
	refusalWait    time.Duration // the longest a refused record's producer waited for the refusal
	hostileUnsure  int           // records whose producer got an error, so whether the broker holds them is read from the topic
	hostileTwice   int           // records the broker holds more than once (their producer wrote them twice)
}

type outcome struct {
	status, cmdType, reason string
	events                  []string
}

// decodeFunc decodes an events-topic value.
type decodeFunc func(context.Context, []byte) (any, error)

// observation is what the checker reads from the drained pipeline.
type observation struct {
	status        map[commandKey]outcome
	balances      map[string]int64 // by aggregate id
	versions      map[string]int64
	commandsTopic string
	// Read read_committed from start to end.
	events, commands, dlq []*kgo.Record
}

func observe(ctx context.Context, c *cluster) (*observation, error) {
	topics := kafka.Topics{Prefix: c.pl.Prefix}
	o := &observation{status: map[commandKey]outcome{}, balances: map[string]int64{}, versions: map[string]int64{}, commandsTopic: topics.Commands()}
	rows, err := c.pool.Query(ctx, `SELECT command_id::text, tenant, aggregate_id, status, command_type, coalesce(reason, ''), event_ids::text[] FROM command_status`)
	if err != nil {
		return nil, fmt.Errorf("read command_status: %w", err)
	}
	for rows.Next() {
		var k commandKey
		var oc outcome
		if err := rows.Scan(&k.id, &k.tenant, &k.aggregate, &oc.status, &oc.cmdType, &oc.reason, &oc.events); err != nil {
			rows.Close()
			return nil, fmt.Errorf("read command_status: %w", err)
		}
		o.status[k] = oc
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read command_status: %w", err)
	}
	arows, err := c.pool.Query(ctx, `SELECT tenant || '/' || account_id, balance, version FROM accounts`)
	if err != nil {
		return nil, fmt.Errorf("read accounts: %w", err)
	}
	for arows.Next() {
		var agg string
		var bal, ver int64
		if err := arows.Scan(&agg, &bal, &ver); err != nil {
			arows.Close()
			return nil, fmt.Errorf("read accounts: %w", err)
		}
		o.balances[agg], o.versions[agg] = bal, ver
	}
	arows.Close()
	if err := arows.Err(); err != nil {
		return nil, fmt.Errorf("read accounts: %w", err)
	}
	for _, t := range []struct {
		name string
		into *[]*kgo.Record
	}{{topics.Events(), &o.events}, {topics.Commands(), &o.commands}, {topics.DLQ(), &o.dlq}} {
		if *t.into, err = readAll(ctx, c.pl.BrokerAddr, t.name); err != nil {
			return nil, fmt.Errorf("read %s: %w", t.name, err)
		}
	}
	return o, nil
}

// check reads the drained pipeline and verifies the properties of the
// package doc; it returns the violations, first the most fundamental.
func check(ctx context.Context, c *cluster, m *model, decode decodeFunc) ([]violation, tally) {
	o, err := observe(ctx, c)
	if err != nil {
		return []violation{{property: err.Error()}}, tally{}
	}
	return verify(ctx, m, o, decode)
}

// source is where a record sits in the commands topic.
type source struct {
	partition int32
	offset    int64
}

func verify(ctx context.Context, m *model, o *observation, decode decodeFunc) ([]violation, tally) {
	var vs []violation
	var tl tally
	broken := func(property string, recs []string, count *int) {
		if len(recs) == 0 {
			return
		}
		sort.Strings(recs)
		if count != nil {
			*count += len(recs)
		}
		vs = append(vs, violation{property, recs})
	}

	// 1. Every command the pipeline accepted has exactly one outcome, a
	// decision: a good command never fails.
	var lost, failed []string
	for k, s := range m.commands {
		oc, ok := o.status[k]
		switch {
		case !ok || oc.status == "pending":
			lost = append(lost, fmt.Sprintf("%s %s %s/%s (via kafka: %v): no outcome (%q)", s.ID, s.Type, s.Tenant, s.Account, s.ViaKafka, oc.status))
		case oc.status == "accepted":
			tl.accepted++
		case oc.status == "rejected":
			tl.rejected++
		default:
			failed = append(failed, fmt.Sprintf("%s %s %s/%s (via kafka: %v): %s (%s)", s.ID, s.Type, s.Tenant, s.Account, s.ViaKafka, oc.status, oc.reason))
		}
	}
	tl.outcomes = tl.accepted + tl.rejected
	tl.failed = len(failed)
	broken("every accepted command has exactly one outcome", lost, &tl.lost)
	broken("no good command failed (went to the DLQ)", failed, &tl.lost)

	// 2. Balances equal the accepted commands; money is conserved.
	want := map[string]int64{} // tenant/account -> balance
	var flowErrs []string
	for k, s := range m.commands {
		if o.status[k].status != "accepted" {
			continue
		}
		agg := k.aggregate
		switch s.Type {
		case "Deposit":
			want[agg] += s.Amount
			tl.deposits += s.Amount
		case "Withdraw":
			want[agg] -= s.Amount
			tl.withdrawals += s.Amount
		case "RequestTransfer":
			want[agg] -= s.Amount
			credit := ledger.CreditCommandID(agg, pipeline.MustParseID(s.ID), s.Transfer).String()
			to := pipeline.AggregateID(s.Tenant, s.To)
			switch o.status[commandKey{credit, s.Tenant, to}].status {
			case "accepted":
				want[to] += s.Amount
			case "rejected":
				refund := ledger.RefundCommandID(pipeline.MustParseID(credit)).String()
				if st := o.status[commandKey{refund, s.Tenant, agg}].status; st == "accepted" {
					want[agg] += s.Amount
					tl.transfersRefund++
				} else {
					flowErrs = append(flowErrs, fmt.Sprintf("transfer %s: credit %s rejected, refund %s is %q", s.ID, credit, refund, st))
				}
			default:
				flowErrs = append(flowErrs, fmt.Sprintf("transfer %s: credit %s has no outcome (%q)", s.ID, credit, o.status[commandKey{credit, s.Tenant, to}].status))
			}
		}
	}
	broken("every transfer's credit (or refund) has its outcome", flowErrs, &tl.lost)
	var wrong []string
	for agg, bal := range o.balances {
		tl.totalMoney += bal
		if _, ok := want[agg]; !ok && bal != 0 {
			wrong = append(wrong, fmt.Sprintf("%s: balance %d, accepted commands say 0", agg, bal))
		}
	}
	for agg, w := range want {
		if o.balances[agg] != w {
			wrong = append(wrong, fmt.Sprintf("%s: balance %d, accepted commands say %d", agg, o.balances[agg], w))
		}
	}
	broken("every balance equals the accepted commands", wrong, &tl.doubleEffects)
	if tl.totalMoney != tl.deposits-tl.withdrawals {
		vs = append(vs, violation{"money is conserved", []string{fmt.Sprintf(
			"total %d, accepted deposits %d - withdrawals %d = %d", tl.totalMoney, tl.deposits, tl.withdrawals, tl.deposits-tl.withdrawals)}})
	}

	// 3. The commands topic: the copies of good commands the processor
	// skipped, and where the broker put each hostile record.
	taken := map[int][]*kgo.Record{} // hostile records by number
	seenCmd := map[[2]string]bool{}
	for _, r := range o.commands {
		if n, ok := hostileNumber(r); ok {
			taken[n] = append(taken[n], r)
			continue
		}
		k := [2]string{header(r, pipeline.HeaderCommandID), string(r.Key)}
		if seenCmd[k] {
			tl.processorDedup++
		}
		seenCmd[k] = true
	}
	hostile := map[int]*hostileRecord{}
	for _, h := range m.hostile {
		hostile[h.n] = h
	}
	at := map[source]*hostileRecord{}       // the hostile records the commands topic holds, by where
	failures := map[string]*hostileRecord{} // the CommandFailed event id each must get
	var strangers []string
	for n, recs := range taken {
		h := hostile[n]
		if h == nil {
			strangers = append(strangers, fmt.Sprintf("commands topic record at %d/%d is marked hostile %d, which the workload did not send", recs[0].Partition, recs[0].Offset, n))
			continue
		}
		for _, r := range recs {
			at[source{r.Partition, r.Offset}] = h
			if h.kind.onAggregate {
				failures[pipeline.FailureEventID(h.aggregate, pipeline.MustParseID(h.commandID), r.Partition, r.Offset).String()] = h
			}
		}
	}
	broken("the commands topic holds only hostile records the workload sent", strangers, nil)

	// 4. The events topic, read_committed, against what was applied and
	// what was sent: every event is of a command the workload sent (or of
	// a transfer's credit or refund), and every CommandFailed of a hostile
	// record.
	known := map[commandKey]bool{}
	for k, s := range m.commands {
		known[k] = true
		if s.Type == "RequestTransfer" {
			credit := ledger.CreditCommandID(k.aggregate, pipeline.MustParseID(s.ID), s.Transfer)
			known[commandKey{credit.String(), s.Tenant, pipeline.AggregateID(s.Tenant, s.To)}] = true
			known[commandKey{ledger.RefundCommandID(credit).String(), s.Tenant, k.aggregate}] = true
		}
	}
	recorded := map[string]bool{} // event ids command_status names
	for _, oc := range o.status {
		for _, e := range oc.events {
			recorded[e] = true
		}
	}
	copies := map[string]int{}
	first := map[string]*kgo.Record{}
	last := map[string]int64{}
	var gaps, unrecorded, unknown []string
	for _, r := range o.events {
		id := header(r, pipeline.HeaderEventID)
		if copies[id]++; copies[id] > 1 {
			tl.projectorDedup++ // re-produced with the same id: the inbox absorbs it
			continue
		}
		first[id] = r
		typ := header(r, pipeline.HeaderEventType)
		if !recorded[id] {
			unrecorded = append(unrecorded, fmt.Sprintf("event %s (%s of command %s on %s) was not applied",
				id, typ, header(r, pipeline.HeaderCommandID), r.Key))
		}
		switch k := (commandKey{header(r, pipeline.HeaderCommandID), header(r, pipeline.HeaderTenant), string(r.Key)}); {
		case failures[id] != nil: // a hostile record's failure: checked in 5
		case typ == "CommandFailed":
			unknown = append(unknown, fmt.Sprintf("CommandFailed %s of command %s on %q at offset %d/%d: no hostile record failed there",
				id, k.id, r.Key, r.Partition, r.Offset))
		case !known[k]:
			unknown = append(unknown, fmt.Sprintf("event %s (%s of command %s, tenant %q, on %q at offset %d/%d) is of no command the workload sent",
				id, typ, k.id, k.tenant, r.Key, r.Partition, r.Offset))
		}
		v, _ := strconv.ParseInt(header(r, pipeline.HeaderAggregateVersion), 10, 64)
		agg := string(r.Key)
		if typ == "CommandRejected" || typ == "CommandFailed" {
			// They carry the aggregate's current version (docs/consumers.md).
			if v != last[agg] {
				gaps = append(gaps, fmt.Sprintf("%s: %s at version %d, the aggregate is at %d (event %s at offset %d/%d)", agg, typ, v, last[agg], id, r.Partition, r.Offset))
			}
			continue
		}
		if v != last[agg]+1 {
			gaps = append(gaps, fmt.Sprintf("%s: version %d after %d (event %s at offset %d/%d)", agg, v, last[agg], id, r.Partition, r.Offset))
		}
		last[agg] = v
	}
	tl.events = len(first)
	var phantom []string
	for id := range recorded {
		if first[id] == nil {
			phantom = append(phantom, "event "+id+" is recorded in command_status but not in the events topic (read_committed)")
		}
	}
	var stale []string
	for agg, v := range last {
		if o.versions[agg] != v {
			stale = append(stale, fmt.Sprintf("%s: read model at version %d, events topic at %d", agg, o.versions[agg], v))
		}
	}
	broken("each aggregate's versions run 1..n in the events topic", gaps, &tl.doubleEffects)
	broken("every event in the events topic was applied", unrecorded, &tl.lost)
	broken("nothing was applied that the events topic (read_committed) does not hold", phantom, &tl.doubleEffects)
	broken("every read model is at its aggregate's last version", stale, &tl.doubleEffects)
	broken("every event is of a command the workload sent, or a hostile record's CommandFailed", unknown, &tl.doubleEffects)

	// 5. Hostile records: each the broker took is in the DLQ exactly once
	// (read_committed: it is written in the transaction that commits its
	// offset) with its reason and as it was sent; each naming a valid
	// command of a valid aggregate is recorded there once as CommandFailed
	// and shows failed; a record over max.message.bytes is refused to its
	// producer.
	dlq := map[source][]*kgo.Record{} // DLQ records by the commands-topic record they are of
	var stray []string
	for _, r := range o.dlq {
		part, perr := strconv.ParseInt(header(r, pipeline.HeaderDLQSourcePartition), 10, 32)
		off, oerr := strconv.ParseInt(header(r, pipeline.HeaderDLQSourceOffset), 10, 64)
		src := source{int32(part), off}
		switch {
		case header(r, pipeline.HeaderDLQSourceTopic) != o.commandsTopic || perr != nil || oerr != nil:
			stray = append(stray, fmt.Sprintf("DLQ record at %d/%d names source %q %q/%q", r.Partition, r.Offset,
				header(r, pipeline.HeaderDLQSourceTopic), header(r, pipeline.HeaderDLQSourcePartition), header(r, pipeline.HeaderDLQSourceOffset)))
		case at[src] == nil:
			stray = append(stray, fmt.Sprintf("DLQ record at %d/%d (reason %s, command %s on %q) is of %d/%d, no hostile record: a good command",
				r.Partition, r.Offset, header(r, pipeline.HeaderDLQReason), header(r, pipeline.HeaderCommandID), r.Key, part, off))
		default:
			dlq[src] = append(dlq[src], r)
		}
	}
	var missing, twice, unlike, notFailed, badStatus, broker []string
	for _, h := range m.hostile {
		recs := taken[h.n]
		tl.hostileTaken += len(recs)
		if len(recs) > 1 {
			tl.hostileTwice++
		}
		if h.kind.reason == "" {
			if !errors.Is(h.err, kerr.MessageTooLarge) || len(recs) > 0 {
				broker = append(broker, fmt.Sprintf("hostile %d (%s, %d bytes): produce error %v after %s and %d copies in the commands topic, want MESSAGE_TOO_LARGE and none",
					h.n, h.kind.name, len(h.value), h.err, h.wait.Round(time.Millisecond), len(recs)))
			} else {
				tl.hostileRefused++
				tl.refusalWait = max(tl.refusalWait, h.wait)
			}
			continue
		}
		if h.err != nil {
			tl.hostileUnsure++
		}
		if h.acked && !takenAt(recs, h.partition, h.offset) {
			missing = append(missing, fmt.Sprintf("hostile %d (%s): acknowledged at %d/%d, not in the commands topic", h.n, h.kind.name, h.partition, h.offset))
		}
		for _, r := range recs {
			inDLQ := dlq[source{r.Partition, r.Offset}]
			tl.hostileDLQ += len(inDLQ)
			switch {
			case len(inDLQ) == 0:
				missing = append(missing, fmt.Sprintf("hostile %d (%s) from %d/%d: not in the DLQ", h.n, h.kind.name, r.Partition, r.Offset))
			case len(inDLQ) > 1:
				var at []string
				for _, d := range inDLQ {
					at = append(at, fmt.Sprintf("%d/%d", d.Partition, d.Offset))
				}
				twice = append(twice, fmt.Sprintf("hostile %d (%s) from %d/%d: %d times in the DLQ, at %s", h.n, h.kind.name, r.Partition, r.Offset, len(inDLQ), strings.Join(at, ", ")))
			}
			for _, d := range inDLQ {
				if got := header(d, pipeline.HeaderDLQReason); got != h.kind.reason {
					unlike = append(unlike, fmt.Sprintf("hostile %d (%s) at DLQ %d/%d: reason %q, want %q", h.n, h.kind.name, d.Partition, d.Offset, got, h.kind.reason))
				}
				if !bytes.Equal(d.Key, h.key) || !bytes.Equal(d.Value, h.value) {
					unlike = append(unlike, fmt.Sprintf("hostile %d (%s) at DLQ %d/%d: not the key and value sent", h.n, h.kind.name, d.Partition, d.Offset))
				}
			}
			if !h.kind.onAggregate {
				continue
			}
			id := pipeline.FailureEventID(h.aggregate, pipeline.MustParseID(h.commandID), r.Partition, r.Offset).String()
			ev := first[id]
			if ev == nil {
				notFailed = append(notFailed, fmt.Sprintf("hostile %d (%s) from %d/%d: no CommandFailed %s on %s", h.n, h.kind.name, r.Partition, r.Offset, id, h.aggregate))
				continue
			}
			if copies[id] > 1 {
				twice = append(twice, fmt.Sprintf("hostile %d (%s) from %d/%d: its CommandFailed %s is %d times in the events topic", h.n, h.kind.name, r.Partition, r.Offset, id, copies[id]))
			}
			if err := failedAs(ctx, decode, ev, h); err != nil {
				notFailed = append(notFailed, fmt.Sprintf("hostile %d (%s) from %d/%d: CommandFailed %s: %v", h.n, h.kind.name, r.Partition, r.Offset, id, err))
				continue
			}
			tl.hostileFailed++
		}
		if h.kind.onAggregate && len(recs) > 0 {
			st, ok := o.status[commandKey{h.commandID, h.tenant, h.aggregate}]
			if !ok || st.status != "failed" || st.reason != h.kind.reason || st.cmdType != h.cmdType {
				badStatus = append(badStatus, fmt.Sprintf("hostile %d (%s), command %s on %s: command_status %q (reason %q, type %q), want failed (reason %q, type %q)",
					h.n, h.kind.name, h.commandID, h.aggregate, st.status, st.reason, st.cmdType, h.kind.reason, h.cmdType))
			}
		}
	}
	broken("every hostile record the broker took is in the DLQ exactly once", append(missing, twice...), nil)
	tl.lost += len(missing)
	tl.doubleEffects += len(twice)
	broken("every hostile record's DLQ copy has its expected reason and is the record sent", unlike, nil)
	broken("the DLQ holds only hostile records", stray, &tl.doubleEffects)
	broken("every hostile record naming a valid command of a valid aggregate is recorded there as CommandFailed with its reason", notFailed, &tl.lost)
	broken("every hostile record naming a valid command of a valid aggregate shows failed with its reason in command_status", badStatus, &tl.lost)
	broken("a record over the topic's max.message.bytes is refused to its producer and nowhere else", broker, nil)

	if n := m.conflicts.Load(); n > 0 {
		vs = append(vs, violation{"no request was refused as a reused key (the workload never reuses one)", []string{fmt.Sprintf("%d 409 answers", n)}})
	}
	if n := m.clientErrors.Load(); n > 0 {
		vs = append(vs, violation{"no valid request was refused", append([]string{fmt.Sprintf("%d 4xx answers, the first:", n)}, m.refusals...)})
	}
	if n := m.abandoned.Load(); n > 0 {
		vs = append(vs, violation{"every request was eventually answered", []string{fmt.Sprintf("%d requests never answered", n)}})
	}
	return vs, tl
}

// failedAs checks a hostile record's CommandFailed event: on its
// aggregate, with its reason and the command type its header named.
func failedAs(ctx context.Context, decode decodeFunc, ev *kgo.Record, h *hostileRecord) error {
	if typ := header(ev, pipeline.HeaderEventType); typ != "CommandFailed" || string(ev.Key) != h.aggregate || header(ev, pipeline.HeaderTenant) != h.tenant {
		return fmt.Errorf("a %s on %q (tenant %q), want a CommandFailed on %s", typ, ev.Key, header(ev, pipeline.HeaderTenant), h.aggregate)
	}
	v, err := decode(ctx, ev.Value)
	if err != nil {
		return fmt.Errorf("decode: %w", err)
	}
	f, ok := v.(pipeline.CommandFailed)
	if !ok || f.Reason != h.kind.reason || f.CommandType != h.cmdType {
		return fmt.Errorf("%+v, want reason %q and command type %q", v, h.kind.reason, h.cmdType)
	}
	return nil
}

// hostileNumber returns the number a hostile record carries.
func hostileNumber(r *kgo.Record) (int, bool) {
	for _, h := range r.Headers {
		if h.Key == headerHostile {
			n, err := strconv.Atoi(string(h.Value))
			if err != nil {
				return -1, true
			}
			return n, true
		}
	}
	return 0, false
}

func takenAt(recs []*kgo.Record, partition int32, offset int64) bool {
	for _, r := range recs {
		if r.Partition == partition && r.Offset == offset {
			return true
		}
	}
	return false
}

func header(r *kgo.Record, key string) string {
	for _, h := range r.Headers {
		if h.Key == key {
			return string(h.Value)
		}
	}
	return ""
}

// readAll reads a topic read_committed from its start to its end.
func readAll(ctx context.Context, broker, topic string) ([]*kgo.Record, error) {
	cl, err := kgo.NewClient(kgo.SeedBrokers(kafka.ParseBrokers(broker)...))
	if err != nil {
		return nil, err
	}
	defer cl.Close()
	return kafka.ReadTopic(ctx, cl, topic, true)
}
