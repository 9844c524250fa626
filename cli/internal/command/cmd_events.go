package command

// `onceflow events tail`: the events topics' records decoded, so that a
// team downstream can see what an event says without writing a consumer
// (Debian's kcat has no Avro).

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/onceflow/onceflow"
	"github.com/onceflow/onceflow/pipeline"
	"github.com/onceflow/onceflow/pipeline/avro"
	"github.com/onceflow/onceflow/pipeline/kafka"
)

const eventsTailUsage = `Reads every events topic of the deployment (read_committed: what consumers see),
prints each event decoded, and follows new ones until interrupted.
-from: end (default: only new events), start, an offset of every partition,
a time (RFC 3339) or how long ago (10m). -follow=false stops at the end
the topics had when it started.`

// eventLine is one event as events tail prints it; -json prints it as is.
type eventLine struct {
	Topic     string          `json:"topic"`
	Partition int32           `json:"partition"`
	Offset    int64           `json:"offset"`
	Time      time.Time       `json:"time"`
	Key       string          `json:"key"`
	Type      string          `json:"type"`
	EventID   string          `json:"event_id"`
	CommandID string          `json:"command_id,omitempty"`
	Value     json.RawMessage `json:"value"`
}

func runEventsTail(ctx context.Context, domains []*onceflow.Domain, args []string, getenv func(string) string, stdout io.Writer) error {
	var from, key, typ string
	var asJSON, follow bool
	var n int
	c, _, err := parse("events tail", domains, args, getenv, stdout, func(fs *flag.FlagSet) {
		fs.StringVar(&from, "from", "end", "where to start: end, start, OFFSET, a time (RFC 3339) or how long ago (10m)")
		fs.StringVar(&key, "key", "", "only the events of this aggregate, TENANT/ID (the record key)")
		fs.StringVar(&typ, "type", "", "only events of this type")
		fs.BoolVar(&asJSON, "json", false, "one JSON object per event")
		fs.BoolVar(&follow, "follow", true, "go on printing new events; false stops at the end the topics had at the start")
		fs.IntVar(&n, "n", 0, "stop after this many events (0: no limit)")
	})
	if err != nil {
		return err
	}
	start, err := startOffset(from, time.Now())
	if err != nil {
		return fmt.Errorf("-from %q: %w", from, err)
	}
	cfg := c.Config
	dep, serdes, err := deploymentSerdes(ctx, cfg)
	if err != nil {
		return err
	}
	var topics []string
	for _, d := range dep.Domains {
		if t := d.EventsTopic(); !slices.Contains(topics, t) {
			topics = append(topics, t)
		}
	}
	out := eventPrinter{asJSON: asJSON, key: key, typ: typ, n: n, serdes: serdes, enc: json.NewEncoder(stdout)}
	if !asJSON {
		out.tw = table(stdout, "TIME\tTOPIC\tPARTITION\tOFFSET\tKEY\tTYPE\tEVENT-ID\tVALUE")
		defer out.tw.Flush()
	}
	if !follow {
		return readEvents(ctx, c, topics, start, &out)
	}
	cl, err := cfg.Kafka.NewClient(kgo.ConsumeTopics(topics...), kgo.ConsumeResetOffset(start.kgo()),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()))
	if err != nil {
		return err
	}
	defer cl.Close()
	for {
		fetches := cl.PollFetches(ctx)
		if ctx.Err() != nil || fetches.IsClientClosed() {
			return nil
		}
		var fetchErr error
		fetches.EachError(func(topic string, part int32, err error) {
			if !kafka.OverBudget(err) && !errors.Is(err, context.Canceled) {
				fetchErr = fmt.Errorf("read %s/%d: %w", topic, part, err)
			}
		})
		if fetchErr != nil {
			return fetchErr
		}
		for _, r := range fetches.Records() {
			if err := out.print(ctx, r); err != nil {
				return ignoreEnough(err)
			}
		}
	}
}

// readEvents prints the events of topics from start up to the end each
// partition has now, partition by partition (-follow=false).
func readEvents(ctx context.Context, c *config, topics []string, start eventsFrom, out *eventPrinter) error {
	cl, err := c.Kafka.NewClient()
	if err != nil {
		return err
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	var offs kadm.ListedOffsets
	switch {
	case start.end:
		return nil // nothing before the end is asked for
	case start.start || start.offset >= 0:
		offs, err = adm.ListStartOffsets(ctx, topics...)
	default:
		offs, err = adm.ListOffsetsAfterMilli(ctx, start.milli, topics...)
	}
	if err == nil {
		err = offs.Error()
	}
	if err != nil {
		return fmt.Errorf("where %s start: %w", strings.Join(topics, ", "), err)
	}
	var parts []kadm.ListedOffset
	offs.Each(func(o kadm.ListedOffset) {
		if o.Offset >= 0 { // -1: nothing at or after the time
			o.Offset = max(o.Offset, start.offset) // an offset asked for, past the log start
			parts = append(parts, o)
		}
	})
	slices.SortFunc(parts, func(a, b kadm.ListedOffset) int {
		return cmp.Or(strings.Compare(a.Topic, b.Topic), cmp.Compare(a.Partition, b.Partition))
	})
	for _, o := range parts {
		_, err := kafka.ReadPartitionFrom(ctx, cl, o.Topic, o.Partition, o.Offset, true, func(r *kgo.Record) error { return out.print(ctx, r) })
		if err != nil {
			return ignoreEnough(err)
		}
	}
	return nil
}

// errEnough ends events tail once it printed -n events.
var errEnough = errors.New("enough events")

func ignoreEnough(err error) error {
	if errors.Is(err, errEnough) {
		return nil
	}
	return err
}

// eventPrinter prints the events that pass events tail's filters, as a
// table or as JSON lines, and says when it printed -n of them.
type eventPrinter struct {
	asJSON   bool
	key, typ string
	n        int
	printed  int
	serdes   map[string]*avro.Serde
	enc      *json.Encoder
	tw       *tabwriter.Writer
}

func (p *eventPrinter) print(ctx context.Context, r *kgo.Record) error {
	line := decodeEvent(ctx, p.serdes[r.Topic], r)
	if p.key != "" && line.Key != p.key || p.typ != "" && line.Type != p.typ {
		return nil
	}
	if p.asJSON {
		if err := p.enc.Encode(line); err != nil {
			return err
		}
	} else {
		fmt.Fprintf(p.tw, "%s\t%s\t%d\t%d\t%s\t%s\t%s\t%s\n", line.Time.UTC().Format(time.RFC3339Nano), line.Topic, line.Partition,
			line.Offset, cellText(line.Key), cellText(line.Type), cellText(line.EventID), line.Value)
		p.tw.Flush()
	}
	if p.printed++; p.n > 0 && p.printed >= p.n {
		return errEnough
	}
	return nil
}

// decodeEvent is r as events tail prints it: its value decoded by the
// topic's serde as JSON, or, when it cannot be, why, with the bytes'
// length (a record written straight to the topic by something else).
func decodeEvent(ctx context.Context, serde *avro.Serde, r *kgo.Record) eventLine {
	line := eventLine{Topic: r.Topic, Partition: r.Partition, Offset: r.Offset, Time: r.Timestamp, Key: string(r.Key)}
	for _, h := range r.Headers {
		switch h.Key {
		case pipeline.HeaderEventType:
			line.Type = string(h.Value)
		case pipeline.HeaderEventID:
			line.EventID = string(h.Value)
		case pipeline.HeaderCommandID:
			line.CommandID = string(h.Value)
		}
	}
	undecodable := func(err error) json.RawMessage {
		b, _ := json.Marshal(map[string]string{"undecodable": fmt.Sprintf("%d bytes: %v", len(r.Value), err)})
		return b
	}
	if serde == nil {
		line.Value = undecodable(errors.New("no serde for the topic"))
		return line
	}
	_, v, err := serde.DecodeNative(ctx, r.Value)
	if err == nil {
		var b []byte
		if b, err = json.Marshal(v); err == nil {
			line.Value = b
			return line
		}
	}
	line.Value = undecodable(err)
	return line
}

// eventsFrom is where events tail starts: the end, the start, an offset
// of every partition, or the first event at or after a time.
type eventsFrom struct {
	end, start bool
	offset     int64 // -1 unless an offset
	milli      int64 // 0 unless a time
}

func (f eventsFrom) kgo() kgo.Offset {
	switch {
	case f.end:
		return kgo.NewOffset().AtEnd()
	case f.start:
		return kgo.NewOffset().AtStart()
	case f.offset >= 0:
		return kgo.NewOffset().At(f.offset)
	}
	return kgo.NewOffset().AfterMilli(f.milli)
}

// startOffset reads -from: end, start, an offset, a time or how long ago.
func startOffset(from string, now time.Time) (eventsFrom, error) {
	switch from {
	case "end", "":
		return eventsFrom{end: true, offset: -1}, nil
	case "start":
		return eventsFrom{start: true, offset: -1}, nil
	}
	if o, err := strconv.ParseInt(from, 10, 64); err == nil {
		if o < 0 {
			return eventsFrom{}, errors.New("want an offset of 0 or more")
		}
		return eventsFrom{offset: o}, nil
	}
	if t, err := time.Parse(time.RFC3339Nano, from); err == nil {
		return eventsFrom{offset: -1, milli: t.UnixMilli()}, nil
	}
	if d, err := time.ParseDuration(from); err == nil && d > 0 {
		return eventsFrom{offset: -1, milli: now.Add(-d).UnixMilli()}, nil
	}
	return eventsFrom{}, errors.New("want end, start, an offset, a time (RFC 3339) or how long ago (10m)")
}
