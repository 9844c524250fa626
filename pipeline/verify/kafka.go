package verify

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"golang.org/x/sync/errgroup"

	"github.com/onceflow/onceflow/pipeline"
	"github.com/onceflow/onceflow/pipeline/kafka"
)

// readKafka reads the processors' committed offsets, then the commands
// topics, their DLQs and the events topics from the window's start on (a
// minute earlier, for the clocks of producers and of the database).
func (v *run) readKafka(ctx context.Context, cl *kgo.Client) error {
	// A command of the window has a record and an event or more, most
	// often: the maps start at the size of the window's command_status.
	n := v.statusCount
	v.commands, v.inDLQ = make(map[cmdKey]position, n), map[cmdKey]bool{}
	v.events, v.decidedOn = make(map[string]event, n), make(map[cmdKey]bool, n)
	// Tenants and aggregate ids repeat: one string each.
	interned := map[string]string{}
	intern := func(b []byte) string {
		if s, ok := interned[string(b)]; ok {
			return s
		}
		s := string(b)
		interned[s] = s
		return s
	}
	v.truncated, v.processed = map[string]bool{}, map[string]map[int32]int64{}
	v.eventTopics = map[string]int{}
	var sources []kafka.LagSource
	for _, c := range v.cfg.Commands {
		sources = append(sources, kafka.LagSource{Group: c.Group, Topics: []string{c.Topic}})
	}
	committed, err := kafka.Committed(ctx, cl, sources)
	if err != nil {
		return fmt.Errorf("the processors' offsets: %w", err)
	}
	for i, c := range v.cfg.Commands {
		v.processed[c.Topic] = committed[i][c.Topic]
	}
	since := v.cfg.From.Add(-time.Minute)
	var commands, events, dlq int
	for i, e := range v.cfg.Events {
		v.eventTopics[e.Topic] = i
		err := v.read(ctx, cl, e.Topic, since, true, func(r *kgo.Record, p position) {
			id := header(r, pipeline.HeaderEventID)
			if id == "" {
				return
			}
			events++
			if ev, seen := v.events[id]; seen {
				ev.more = append(ev.more, p)
				v.events[id] = ev
				return
			}
			ev := event{tenant: intern(headerBytes(r, pipeline.HeaderTenant)), aggregate: intern(r.Key), commandID: header(r, pipeline.HeaderCommandID), first: p}
			v.events[id] = ev
			v.decidedOn[cmdKey{ev.aggregate, ev.commandID}] = true
		})
		if err != nil {
			return err
		}
	}
	for _, c := range v.cfg.Commands {
		err := v.read(ctx, cl, c.Topic, since, true, func(r *kgo.Record, p position) {
			k := cmdKey{intern(r.Key), header(r, pipeline.HeaderCommandID)}
			if _, seen := v.commands[k]; !seen && k.id != "" {
				commands++
				v.commands[k] = p
			}
		})
		if err != nil {
			return err
		}
		if c.DLQ == "" {
			continue
		}
		err = v.read(ctx, cl, c.DLQ, since, false, func(r *kgo.Record, p position) {
			dlq++
			v.inDLQ[cmdKey{string(r.Key), header(r, pipeline.HeaderCommandID)}] = true
		})
		if err != nil {
			return err
		}
	}
	v.rep.Checked = append(v.rep.Checked,
		Check{"commands on the commands topics (read_committed, by aggregate and command id)", commands},
		Check{"records on the DLQ topics", dlq},
		Check{"event records on the events topics (read_committed)", events},
		Check{"event ids on the events topics", len(v.events)})
	return nil
}

// read calls fn for every committed record of topic from the first at or
// after since to the end, in each partition's order, with the decompression
// budget of cl's hand-made reads. A partition whose log starts after the
// window's start (retention deleted its beginning) is noted, and its
// topic marked truncated. A DLQ topic that does not exist (optional)
// is noted.
func (v *run) read(ctx context.Context, cl *kgo.Client, topic string, since time.Time, required bool, fn func(*kgo.Record, position)) error {
	adm := kadm.NewClient(cl)
	at, err := adm.ListOffsetsAfterMilli(ctx, since.UnixMilli(), topic)
	if err == nil {
		err = at.Error()
	}
	if err != nil {
		if !required {
			v.rep.NotChecked = append(v.rep.NotChecked, fmt.Sprintf("%s: %v", topic, err))
			return nil
		}
		return fmt.Errorf("offsets of %s at %s: %w", topic, since.Format(time.RFC3339), err)
	}
	starts, err := adm.ListStartOffsets(ctx, topic)
	if err == nil {
		err = starts.Error()
	}
	if err != nil {
		return fmt.Errorf("start offsets of %s: %w", topic, err)
	}
	// Partitions are read side by side (a few at a time): fetching and
	// decoding are each partition's own; fn, which joins, runs one call
	// at a time.
	var mu sync.Mutex
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(4)
	at.Each(func(o kadm.ListedOffset) {
		if s, ok := starts.Lookup(topic, o.Partition); ok && s.Offset > 0 && o.Offset <= s.Offset {
			// The first record of the window is the log's first: what was
			// before it in the window may have been deleted.
			v.truncated[topic] = true
			v.rep.NotChecked = append(v.rep.NotChecked, fmt.Sprintf(
				"%s partition %d: its log starts at offset %d, inside the window (retention): records of the window before it are not checked", topic, o.Partition, s.Offset))
		}
		g.Go(func() error {
			_, err := kafka.ReadPartitionFrom(gctx, cl, topic, o.Partition, o.Offset, true, func(r *kgo.Record) error {
				mu.Lock()
				fn(r, position{topic: topic, partition: r.Partition, offset: r.Offset, time: r.Timestamp})
				mu.Unlock()
				return nil
			})
			return err
		})
	})
	if err := g.Wait(); err != nil {
		return fmt.Errorf("read %s: %w", topic, err)
	}
	return nil
}

func header(r *kgo.Record, name string) string { return string(headerBytes(r, name)) }

func headerBytes(r *kgo.Record, name string) []byte {
	for _, h := range r.Headers {
		if h.Key == name {
			return h.Value
		}
	}
	return nil
}
