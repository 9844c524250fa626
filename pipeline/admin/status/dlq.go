package status

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/onceflow/onceflow/pipeline"
	"github.com/onceflow/onceflow/pipeline/kafka"
	"github.com/onceflow/onceflow/pipeline/processor"
)

// newestListed is how many of a DLQ topic's newest records the page lists.
const newestListed = 20

// dlqReader keeps count of what the DLQ topics hold: each reading goes on
// from where the last one stopped, so a page polling an idle DLQ costs a
// fetch that returns nothing. It holds counts and the newest records'
// coordinates, never the records.
type dlqReader struct {
	cl    *kgo.Client
	every time.Duration

	mu     sync.Mutex // one reading at a time; the others wait for it
	topics []*dlqTopicState
	readAt time.Time
	err    error
}

type dlqTopicState struct {
	cfg   DLQTopicConfig
	parts map[int32]*dlqPartition
}

// dlqPartition is what one partition holds: counts by reason of the
// records from first (the first offset counted) to next.
type dlqPartition struct {
	first    int64
	next     int64
	byReason map[string]int64
	newest   []DeadLetter // the partition's last newestListed, oldest first
}

func newDLQReader(cl *kgo.Client, topics []DLQTopicConfig, every time.Duration) *dlqReader {
	r := &dlqReader{cl: cl, every: every}
	for _, t := range topics {
		r.topics = append(r.topics, &dlqTopicState{cfg: t, parts: map[int32]*dlqPartition{}})
	}
	return r
}

// read returns what each DLQ topic holds, reading on at most once per
// r.every.
func (r *dlqReader) read(ctx context.Context) ([]DLQTopic, error) {
	if r.cl == nil {
		return []DLQTopic{}, nil
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.readAt.IsZero() || time.Since(r.readAt) >= r.every {
		ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		r.err = r.readOn(ctx)
		cancel()
		r.readAt = time.Now()
	}
	out := make([]DLQTopic, 0, len(r.topics))
	for _, t := range r.topics {
		dt := DLQTopic{Topic: t.cfg.Topic, Commands: t.cfg.Commands, ByReason: []ReasonCount{}, Newest: []DeadLetter{}, ReadAt: r.readAt}
		reasons := map[string]int64{}
		for _, p := range t.parts {
			for reason, n := range p.byReason {
				reasons[reason] += n
				dt.Records += n
			}
			dt.Newest = append(dt.Newest, p.newest...)
		}
		for reason, n := range reasons {
			dt.ByReason = append(dt.ByReason, ReasonCount{Reason: reason, Records: float64(n)})
		}
		slices.SortFunc(dt.ByReason, func(a, b ReasonCount) int { return strings.Compare(a.Reason, b.Reason) })
		slices.SortFunc(dt.Newest, func(a, b DeadLetter) int {
			if c := b.Time.Compare(a.Time); c != 0 {
				return c
			}
			return strings.Compare(b.Record, a.Record)
		})
		if len(dt.Newest) > newestListed {
			dt.Newest = dt.Newest[:newestListed]
		}
		out = append(out, dt)
	}
	return out, r.err
}

// readOn reads every partition of every DLQ topic on from where it
// stopped. A partition whose log start has passed its first counted
// record (retention deleted records) is counted again from its start.
func (r *dlqReader) readOn(ctx context.Context) error {
	names := make([]string, 0, len(r.topics))
	for _, t := range r.topics {
		names = append(names, t.cfg.Topic)
	}
	starts, err := kadm.NewClient(r.cl).ListStartOffsets(ctx, names...)
	if err != nil {
		return fmt.Errorf("list DLQ start offsets: %w", err)
	}
	var errs []error
	for _, t := range r.topics {
		starts.Each(func(o kadm.ListedOffset) {
			if o.Topic != t.cfg.Topic || o.Err != nil {
				return
			}
			p := t.parts[o.Partition]
			if p == nil || p.first < o.Offset && len(p.byReason) > 0 {
				p = &dlqPartition{first: o.Offset, next: o.Offset, byReason: map[string]int64{}}
				t.parts[o.Partition] = p
			}
			next, err := kafka.ReadPartitionFrom(ctx, r.cl, t.cfg.Topic, o.Partition, p.next, true, func(rec *kgo.Record) error {
				d := summaryOf(rec)
				p.byReason[d.Reason]++
				p.newest = append(p.newest, d)
				if len(p.newest) > newestListed {
					p.newest = p.newest[1:]
				}
				return nil
			})
			if err != nil {
				errs = append(errs, err)
			}
			p.next = max(p.next, next)
		})
	}
	return errors.Join(errs...)
}

// summaryOf is a DLQ record as the page lists it.
func summaryOf(rec *kgo.Record) DeadLetter {
	d := processor.DeadLetterOf(rec)
	return DeadLetter{
		Record:      d.Coordinates(),
		Time:        d.Time,
		Reason:      d.Reason,
		CommandType: commandType(d.Header(pipeline.HeaderCommandType)),
		Source:      fmt.Sprintf("%s/%d@%d", d.SourceTopic, d.SourcePartition, d.SourceOffset),
		Redrivable:  len(d.Omitted) == 0,
	}
}

// commandType is a poison record's command-type header if it reads as a
// type name: a producer may have put anything there, and the page shows
// no producer's text but names.
func commandType(s string) string {
	if commandTypeName.MatchString(s) {
		return s
	}
	if s == "" {
		return ""
	}
	return "(not a type name)"
}

var commandTypeName = regexp.MustCompile(`^[A-Za-z][A-Za-z0-9_.-]{0,63}$`)
