package verify

import (
	"fmt"
	"strings"
	"time"
)

// join reports what the stages' records disagree on.
func (v *run) join(undecided map[cmdKey]position) {
	v.joinKeys()
	v.joinCommands(undecided)
	v.joinEvents()
	v.rep.Findings = append(v.rep.Findings, v.jobs...)
	v.rep.Findings = append(v.rep.Findings, v.deliveries...)
}

func (v *run) add(f Finding) { v.rep.Findings = append(v.rep.Findings, f) }

// joinKeys: ingest writes the key record, the outbox row and the pending
// status in one transaction, so a key names a command with a status; the
// keys without one are read as such (keysSQL).
func (v *run) joinKeys() {
	for _, k := range v.keys {
		v.add(Finding{Stage: StageIngest, Kind: Lost, Tenant: k.tenant, CommandID: k.commandID, Since: k.createdAt,
			LastSeen: fmt.Sprintf("Idempotency-Key %q: accepted, no command_status row", k.key)})
	}
}

// undecided returns the commands on a commands topic in the window with
// no event nor DLQ record: few (those in flight), whose outcomes are then
// looked up (decided).
func (v *run) undecided() map[cmdKey]position {
	out := map[cmdKey]position{}
	for k, p := range v.commands {
		if !v.decidedOn[k] && !v.inDLQ[k] && !p.time.Before(v.cfg.From) && p.time.Before(v.cfg.To) {
			out[k] = p
		}
	}
	return out
}

// joinCommands follows each pending command of the window, and each
// command on a commands topic in the window, to where it was last seen:
// a command with an event on the events topic was decided (the projectors'
// part is joinEvents'); one without is in the outbox, on a commands topic
// or in a DLQ, or lost.
func (v *run) joinCommands(undecided map[cmdKey]position) {
	pending := map[cmdKey]status{}
	for _, s := range v.statuses {
		if s.status == "pending" {
			pending[s.cmdKey] = s
		}
	}
	bound := v.now.Add(-v.cfg.PendingBound)
	for k, s := range pending {
		if v.decidedOn[k] || v.inDLQ[k] {
			continue
		}
		f := Finding{Tenant: s.tenant, AggregateID: k.aggregate, CommandID: k.id, Since: s.createdAt}
		if r, ok := v.outbox[k]; ok {
			if r.createdAt.Before(bound) {
				f.Stage, f.Kind, f.LastSeen = StageRelay, Pending, fmt.Sprintf("outbox row %d of shard %d, not shipped", r.id, r.shard)
				v.add(f)
			}
			continue
		}
		if r, ok := v.dead[k]; ok {
			f.Stage, f.Kind, f.LastSeen = StageRelay, Pending, fmt.Sprintf("outbox_dead row %d: refused by the broker, the command is not failed yet", r.id)
			v.add(f)
			continue
		}
		if _, ok := v.commands[k]; ok {
			continue // the processor's part, below
		}
		if v.anyTruncated(v.cfg.commandsTopics()) {
			continue // said in NotChecked
		}
		f.Stage, f.Kind = StageRelay, Lost
		f.LastSeen = fmt.Sprintf("command_status %s (%s): neither in the outbox nor on %s", s.status, s.commandType, strings.Join(v.cfg.commandsTopics(), ", "))
		if !s.ingested {
			f.Stage = StageProcessor
			f.LastSeen = fmt.Sprintf("command_status %s (%s, sent by a decision): not on %s", s.status, s.commandType, strings.Join(v.cfg.commandsTopics(), ", "))
		}
		v.add(f)
	}
	for k, p := range undecided {
		s, known := pending[k]
		if !known && v.cfg.Tenant != "" && !strings.HasPrefix(k.aggregate, v.cfg.Tenant+"/") {
			continue
		}
		f := Finding{Stage: StageProcessor, AggregateID: k.aggregate, CommandID: k.id, Tenant: s.tenant, Since: p.time}
		if group, next := v.processor(p); next > p.offset {
			f.Kind = Lost
			f.LastSeen = fmt.Sprintf("%s; processor group %s is past it (offset %d), no event and no DLQ record", p, group, next)
			v.add(f)
		} else if p.time.Before(bound) {
			f.Kind = Pending
			f.LastSeen = fmt.Sprintf("%s; processor group %s at offset %d", p, group, next)
			v.add(f)
		}
	}
}

// processor returns the group reading p's topic and its next offset on
// p's partition (-1 without one).
func (v *run) processor(p position) (string, int64) {
	for _, c := range v.cfg.Commands {
		if c.Topic == p.topic {
			if next, ok := v.processed[p.topic][p.partition]; ok {
				return c.Group, next
			}
			return c.Group, -1
		}
	}
	return "", -1
}

// joinEvents checks each event of the window: one record per id on the
// events topic, and one inbox row at each projector that is past it.
func (v *run) joinEvents() {
	bound := v.now.Add(-v.cfg.PendingBound)
	// Inbox partitions are dropped a day at a time after the retention:
	// an event older than that (a day's margin) has no row to find.
	forgotten := v.now.Add(-v.cfg.InboxRetention + 24*time.Hour)
	if v.cfg.From.Before(forgotten) {
		v.rep.NotChecked = append(v.rep.NotChecked, fmt.Sprintf("events before %s at the projectors: the inbox keeps its rows %s (its retention), so they cannot be told lost",
			forgotten.UTC().Format(time.RFC3339), v.cfg.InboxRetention))
	}
	for id, e := range v.events {
		first := e.first
		if first.time.Before(v.cfg.From) || !first.time.Before(v.cfg.To) || (v.cfg.Tenant != "" && e.tenant != v.cfg.Tenant) {
			continue
		}
		f := Finding{Tenant: e.tenant, AggregateID: e.aggregate, CommandID: e.commandID, EventID: id, Since: first.time}
		if len(e.more) > 0 {
			var at []string
			for _, p := range append([]position{first}, e.more...) {
				at = append(at, fmt.Sprintf("%d@%d", p.partition, p.offset))
			}
			f.Stage, f.Kind = StageEvents, DuplicateRecord
			f.LastSeen = fmt.Sprintf("%s at partition@offset %s: consumers apply it once by its id", first.topic, strings.Join(at, ", "))
			v.add(f)
		}
		if first.time.Before(forgotten) {
			continue
		}
		for _, consumer := range v.cfg.Events[v.eventTopics[first.topic]].Projectors {
			f := f
			f.Stage, f.Consumer = StageProjector, consumer
			a := v.inbox[inboxKey{consumer, id}]
			if a.count > 1 {
				f.Kind, f.LastSeen = Doubled, fmt.Sprintf("%d inbox rows of %s, the first at %s", a.count, consumer, a.first.UTC().Format("2006-01-02T15:04:05.000Z"))
				v.add(f)
			}
			if a.count > 0 {
				continue
			}
			next, ok := v.offsets[consumer][first.topic][first.partition]
			switch {
			case ok && next > first.offset && !v.skipped(consumer, first):
				f.Kind, f.LastSeen = Lost, fmt.Sprintf("%s; %s is past it (offset %d) with no inbox row", first, consumer, next)
				v.add(f)
			case ok && next > first.offset: // skipped on purpose, recorded in projector_skips
			case first.time.Before(bound):
				if !ok {
					next = -1
				}
				f.Kind, f.LastSeen = Pending, fmt.Sprintf("%s; %s at offset %d", first, consumer, next)
				v.add(f)
			}
		}
	}
}

// skipped reports whether an operator skipped the record at p for
// consumer (onceflow projections skip).
func (v *run) skipped(consumer string, p position) bool {
	for _, s := range v.skips {
		if s.consumer == consumer && s.topic == p.topic && s.partition == p.partition && p.offset >= s.from && p.offset < s.to {
			return true
		}
	}
	return false
}

func (v *run) anyTruncated(topics []string) bool {
	for _, t := range topics {
		if v.truncated[t] {
			return true
		}
	}
	return false
}

func (c Config) commandsTopics() []string {
	var out []string
	for _, t := range c.Commands {
		out = append(out, t.Topic)
	}
	return out
}
