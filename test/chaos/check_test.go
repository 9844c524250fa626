package chaos

import (
	"context"
	"fmt"
	"sort"
	"strconv"
	"strings"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/onceflow/onceflow/pipeline"
	"github.com/onceflow/onceflow/pipeline/kafka"
	"github.com/onceflow/onceflow/pipeline/ledger"
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
	lost            int // commands without an outcome
	doubleEffects   int // events applied twice, balance mismatches
	processorDedup  int // command records the processor absorbed (same command-id again)
	projectorDedup  int // event records the projector's inbox absorbed (same event-id again)
	events          int
	deposits        int64
	withdrawals     int64
	totalMoney      int64
	transfersRefund int
}

type outcome struct {
	status, aggregate string
	events            []string
}

// check verifies the properties of the package doc and returns the
// violations, first the most fundamental.
func check(ctx context.Context, c *cluster, m *model) ([]violation, tally) {
	var vs []violation
	var tl tally

	// 1. Every command the pipeline accepted has exactly one outcome.
	status := map[string]outcome{}
	rows, err := c.pool.Query(ctx, `SELECT command_id::text, status, aggregate_id, event_ids::text[] FROM command_status`)
	if err != nil {
		return []violation{{property: "read command_status: " + err.Error()}}, tl
	}
	for rows.Next() {
		var id string
		var o outcome
		if err := rows.Scan(&id, &o.status, &o.aggregate, &o.events); err != nil {
			return []violation{{property: "read command_status: " + err.Error()}}, tl
		}
		status[id] = o
	}
	rows.Close()
	var lost []string
	for id, s := range m.commands {
		o, ok := status[id]
		switch {
		case !ok || o.status == "pending":
			lost = append(lost, fmt.Sprintf("%s %s %s/%s (via kafka: %v): no outcome (%q)", id, s.Type, s.Tenant, s.Account, s.ViaKafka, o.status))
		case o.status == "accepted":
			tl.accepted++
		default:
			tl.rejected++
		}
	}
	tl.outcomes = tl.accepted + tl.rejected
	if len(lost) > 0 {
		sort.Strings(lost)
		tl.lost = len(lost)
		vs = append(vs, violation{"every accepted command has exactly one outcome", lost})
	}

	// 2. Balances equal the accepted commands; money is conserved.
	want := map[string]int64{} // tenant/account -> balance
	var flowErrs []string
	for id, s := range m.commands {
		if status[id].status != "accepted" {
			continue
		}
		agg := pipeline.AggregateID(s.Tenant, s.Account)
		switch s.Type {
		case "Deposit":
			want[agg] += s.Amount
			tl.deposits += s.Amount
		case "Withdraw":
			want[agg] -= s.Amount
			tl.withdrawals += s.Amount
		case "RequestTransfer":
			want[agg] -= s.Amount
			credit := ledger.CreditCommandID(pipeline.MustParseID(id), s.Transfer).String()
			switch status[credit].status {
			case "accepted":
				want[pipeline.AggregateID(s.Tenant, s.To)] += s.Amount
			case "rejected":
				refund := ledger.RefundCommandID(pipeline.MustParseID(credit)).String()
				if status[refund].status == "accepted" {
					want[agg] += s.Amount
					tl.transfersRefund++
				} else {
					flowErrs = append(flowErrs, fmt.Sprintf("transfer %s: credit %s rejected, refund %s is %q", id, credit, refund, status[refund].status))
				}
			default:
				flowErrs = append(flowErrs, fmt.Sprintf("transfer %s: credit %s has no outcome (%q)", id, credit, status[credit].status))
			}
		}
	}
	if len(flowErrs) > 0 {
		sort.Strings(flowErrs)
		tl.lost += len(flowErrs)
		vs = append(vs, violation{"every transfer's credit (or refund) has its outcome", flowErrs})
	}
	have := map[string]int64{}
	versions := map[string]int64{}
	arows, err := c.pool.Query(ctx, `SELECT tenant || '/' || account_id, balance, version FROM accounts`)
	if err != nil {
		return append(vs, violation{property: "read accounts: " + err.Error()}), tl
	}
	for arows.Next() {
		var agg string
		var bal, ver int64
		arows.Scan(&agg, &bal, &ver)
		have[agg], versions[agg] = bal, ver
		tl.totalMoney += bal
	}
	arows.Close()
	var wrong []string
	for agg, w := range want {
		if have[agg] != w {
			wrong = append(wrong, fmt.Sprintf("%s: balance %d, accepted commands say %d", agg, have[agg], w))
		}
	}
	for agg, h := range have {
		if _, ok := want[agg]; !ok && h != 0 {
			wrong = append(wrong, fmt.Sprintf("%s: balance %d, accepted commands say 0", agg, h))
		}
	}
	if len(wrong) > 0 {
		sort.Strings(wrong)
		tl.doubleEffects += len(wrong)
		vs = append(vs, violation{"every balance equals the accepted commands", wrong})
	}
	if tl.totalMoney != tl.deposits-tl.withdrawals {
		vs = append(vs, violation{"money is conserved", []string{fmt.Sprintf(
			"total %d, accepted deposits %d - withdrawals %d = %d", tl.totalMoney, tl.deposits, tl.withdrawals, tl.deposits-tl.withdrawals)}})
	}

	// 3. The events topic, read_committed, against what was applied.
	events, err := readAll(ctx, c.pl.BrokerAddr, c.pl.Prefix+".events")
	if err != nil {
		return append(vs, violation{property: "read events: " + err.Error()}), tl
	}
	commands, err := readAll(ctx, c.pl.BrokerAddr, c.pl.Prefix+".commands")
	if err != nil {
		return append(vs, violation{property: "read commands: " + err.Error()}), tl
	}
	seenCmd := map[string]bool{}
	for _, r := range commands {
		id := header(r, pipeline.HeaderCommandID)
		if seenCmd[id] {
			tl.processorDedup++
		}
		seenCmd[id] = true
	}
	recorded := map[string]bool{} // event ids command_status names
	for _, o := range status {
		for _, e := range o.events {
			recorded[e] = true
		}
	}
	seen := map[string]bool{}
	last := map[string]int64{}
	var gaps, unrecorded []string
	for _, r := range events {
		id := header(r, pipeline.HeaderEventID)
		if seen[id] {
			tl.projectorDedup++ // re-produced with the same id: the inbox absorbs it
			continue
		}
		seen[id] = true
		if !recorded[id] {
			unrecorded = append(unrecorded, fmt.Sprintf("event %s (%s of command %s on %s) was not applied",
				id, header(r, pipeline.HeaderEventType), header(r, pipeline.HeaderCommandID), r.Key))
		}
		if header(r, pipeline.HeaderEventType) == "CommandRejected" {
			continue // carries the current version
		}
		v, _ := strconv.ParseInt(header(r, pipeline.HeaderAggregateVersion), 10, 64)
		agg := string(r.Key)
		if v != last[agg]+1 {
			gaps = append(gaps, fmt.Sprintf("%s: version %d after %d (event %s at offset %d/%d)", agg, v, last[agg], id, r.Partition, r.Offset))
		}
		last[agg] = v
	}
	tl.events = len(seen)
	var phantom []string
	for id := range recorded {
		if !seen[id] {
			phantom = append(phantom, "event "+id+" is recorded in command_status but not in the events topic (read_committed)")
		}
	}
	var stale []string
	for agg, v := range last {
		if versions[agg] != v {
			stale = append(stale, fmt.Sprintf("%s: read model at version %d, events topic at %d", agg, versions[agg], v))
		}
	}
	for _, p := range []struct {
		name string
		recs []string
	}{
		{"each aggregate's versions run 1..n in the events topic", gaps},
		{"every event in the events topic was applied", unrecorded},
		{"nothing was applied that the events topic (read_committed) does not hold", phantom},
		{"every read model is at its aggregate's last version", stale},
	} {
		if len(p.recs) > 0 {
			sort.Strings(p.recs)
			if p.name != "every event in the events topic was applied" {
				tl.doubleEffects += len(p.recs)
			} else {
				tl.lost += len(p.recs)
			}
			vs = append(vs, violation{p.name, p.recs})
		}
	}
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
	cl, err := kgo.NewClient(kgo.SeedBrokers(broker))
	if err != nil {
		return nil, err
	}
	defer cl.Close()
	return kafka.ReadTopic(ctx, cl, topic, true)
}
