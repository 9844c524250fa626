package natsink_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/onceflow/onceflow/examples/ledger"
	"github.com/onceflow/onceflow/pipeline"
	"github.com/onceflow/onceflow/pipeline/kafka"
	"github.com/onceflow/onceflow/pipeline/natsink"
	"github.com/onceflow/onceflow/pipeline/pipelinetest"
)

// Every event reaches the stream once, as docs/consumers.md#nats-jetstream
// says a NATS consumer finds it: on {topic}.{tenant}.{event-type}, its
// event id as Nats-Msg-Id, the event's headers, its key, time and
// position, the record's value byte for byte (decodable by its writer
// schema), each aggregate's events in version order; the group's lag
// reaches 0.
func TestForwardsEachEventOnce(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 4)
	recs := e.deposits(60, 7)
	// Another tenant, with a name that is no plain subject token, and
	// another event type.
	recs = append(recs, e.event("globex.eu", "acc-1", ledger.AccountOpened{Currency: "USD"}),
		e.event("globex.eu", "acc-1", ledger.Withdrawn{Amount: 3}))
	e.produce(recs...)
	s := e.start(e.config())
	e.caughtUp(s.Sink)

	msgs := e.messages(stream(s.cfg))
	if len(msgs) != len(recs) {
		t.Fatalf("stream holds %d messages, want %d", len(msgs), len(recs))
	}
	byID := map[string]*kgo.Record{}
	for _, r := range recs {
		ev, err := kafka.EventOf(r)
		if err != nil {
			t.Fatal(err)
		}
		byID[ev.ID.String()] = r
	}
	lastVersion := map[string]int64{}
	for _, m := range msgs {
		h := m.Headers()
		id := h.Get(jetstream.MsgIDHeader)
		r, ok := byID[id]
		if !ok {
			t.Fatalf("message %q: no such event (or twice)", id)
		}
		delete(byID, id)
		ev, _ := kafka.EventOf(r)
		eventType := ""
		for _, rh := range r.Headers {
			if rh.Key == pipeline.HeaderEventType {
				eventType = string(rh.Value)
			}
			if got := h.Get(rh.Key); got != string(rh.Value) {
				t.Errorf("%s: header %s %q, want %q", id, rh.Key, got, rh.Value)
			}
		}
		wantSubject := e.topics.Events() + "." + strings.ReplaceAll(ev.Tenant, ".", "%2E") + "." + eventType
		if m.Subject() != wantSubject {
			t.Errorf("%s: subject %q, want %q", id, m.Subject(), wantSubject)
		}
		for k, want := range map[string]string{
			natsink.HeaderAggregateID:    string(r.Key),
			natsink.HeaderEventTime:      r.Timestamp.UTC().Format(time.RFC3339Nano),
			natsink.HeaderKafkaPartition: strconv.Itoa(int(r.Partition)),
			natsink.HeaderKafkaOffset:    strconv.FormatInt(r.Offset, 10),
		} {
			if got := h.Get(k); got != want {
				t.Errorf("%s: header %s %q, want %q", id, k, got, want)
			}
		}
		if !bytes.Equal(m.Data(), r.Value) {
			t.Errorf("%s: payload differs from the record's value", id)
		}
		decoded, err := e.serde.Decode(context.Background(), m.Data())
		if err != nil || decoded.(pipeline.Message).MessageType() != eventType {
			t.Errorf("%s: payload decodes to %v (%v), want a %s", id, decoded, err, eventType)
		}
		v, _ := strconv.ParseInt(h.Get(pipeline.HeaderAggregateVersion), 10, 64)
		if v != lastVersion[ev.AggregateID]+1 {
			t.Errorf("%s: %s version %d after %d: out of order in the stream", id, ev.AggregateID, v, lastVersion[ev.AggregateID])
		}
		lastVersion[ev.AggregateID] = v
	}
	if got := s.metric(t, "onceflow_natsink_events_published_total"); got != float64(len(recs)) {
		t.Errorf("published %v, want %d", got, len(recs))
	}
	for _, name := range []string{"onceflow_natsink_duplicates_total", "onceflow_natsink_out_of_order_total", "onceflow_natsink_publish_errors_total"} {
		if got := s.metric(t, name); got != 0 {
			t.Errorf("%s %v, want 0", name, got)
		}
	}
	if got := s.metric(t, "onceflow_natsink_connected"); got != 1 {
		t.Errorf("connected %v, want 1", got)
	}
}

// The sink reads read_committed: a transaction's events reach the stream
// once it commits, an aborted transaction's never.
func TestAbortedEventsAreNotForwarded(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 2)
	tx := pipelinetest.Client(t, e.brokers, kgo.TransactionalID("natsink-test-tx"))
	ctx := context.Background()
	write := func(commit bool, recs ...*kgo.Record) {
		t.Helper()
		if err := tx.BeginTransaction(); err != nil {
			t.Fatal(err)
		}
		if err := tx.ProduceSync(ctx, recs...).FirstErr(); err != nil {
			t.Fatal(err)
		}
		if err := tx.EndTransaction(ctx, kgo.TransactionEndTry(commit)); err != nil {
			t.Fatal(err)
		}
	}
	committed := e.deposits(10, 3)
	write(true, committed[:5]...)
	aborted := e.event("acme", "zombie", ledger.AccountOpened{Currency: "EUR"})
	write(false, aborted)
	write(true, committed[5:]...)

	s := e.start(e.config())
	e.caughtUp(s.Sink)
	msgs := e.messages(stream(s.cfg))
	if len(msgs) != len(committed) {
		t.Fatalf("stream holds %d messages, want the %d committed", len(msgs), len(committed))
	}
	for _, m := range msgs {
		if m.Headers().Get(natsink.HeaderAggregateID) == "acme/zombie" {
			t.Errorf("the aborted transaction's event is in the stream")
		}
	}
}

// A crash after JetStream's acknowledgements and before the offsets'
// commit (here: the offsets moved back to the start, as a crash leaves
// them) publishes the events again with the same ids within the duplicate
// window: JetStream drops every one (PubAck.Duplicate) and the stream
// keeps one message per event.
func TestRepublishWithinTheWindowIsDropped(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 3)
	recs := e.produce(e.deposits(40, 5)...)
	cfg := e.config()
	first := e.start(cfg)
	e.caughtUp(first.Sink)
	first.stop(t)

	e.resetGroup(cfg.Group)
	more := e.produce(e.deposits(5, 5)...)
	again := e.start(cfg)
	e.caughtUp(again.Sink)
	if got := again.metric(t, "onceflow_natsink_duplicates_total"); got != float64(len(recs)) {
		t.Errorf("duplicates %v, want the %d events published again", got, len(recs))
	}
	if got := again.metric(t, "onceflow_natsink_events_published_total"); got != float64(len(more)) {
		t.Errorf("published %v, want the %d new events", got, len(more))
	}
	if msgs := e.messages(stream(cfg)); len(msgs) != len(recs)+len(more) {
		t.Errorf("stream holds %d messages, want %d", len(msgs), len(recs)+len(more))
	}
}

// The limit of the guarantee: JetStream remembers a message id for its
// duplicate window only. A re-publish after the window (a sink down longer
// than the window between its acknowledgements and its commit) is stored
// again, as a new message with the same Nats-Msg-Id; a NATS consumer
// still deduplicates by event-id (docs/consumers.md).
func TestRepublishPastTheWindowIsStoredAgain(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 2)
	recs := e.produce(e.deposits(10, 3)...)
	cfg := e.config()
	cfg.DuplicateWindow = 500 * time.Millisecond
	first := e.start(cfg)
	e.caughtUp(first.Sink)
	first.stop(t)

	// Waiting out the window is what this test is about: JetStream's clock
	// decides, and nothing outside it tells when an id is forgotten.
	time.Sleep(2 * cfg.DuplicateWindow)
	e.resetGroup(cfg.Group)
	again := e.start(cfg)
	e.caughtUp(again.Sink)
	if got := again.metric(t, "onceflow_natsink_duplicates_total"); got != 0 {
		t.Errorf("duplicates %v, want 0: the window was over", got)
	}
	msgs := e.messages(stream(cfg))
	if len(msgs) != 2*len(recs) {
		t.Fatalf("stream holds %d messages, want %d: each event twice", len(msgs), 2*len(recs))
	}
	ids := map[string]int{}
	for _, m := range msgs {
		ids[m.Headers().Get(jetstream.MsgIDHeader)]++
	}
	for id, n := range ids {
		if n != 2 {
			t.Errorf("%s stored %d times, want 2", id, n)
		}
	}
}

// A stream that exists is used as it is when it takes the sink's subjects
// with at least its duplicate window, and refused (Run ends with an error
// saying what to change) when its window is shorter or its subjects are
// others.
func TestExistingStream(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 1)
	ctx := context.Background()
	own := func(cfg natsink.Config) []string { return []string{cfg.Subject + ".>"} }
	cases := []struct {
		name     string
		subjects func(cfg natsink.Config) []string
		window   time.Duration
		storage  jetstream.StorageType
		single   bool   // the sink allows a stream of one replica (its server syncs every write)
		refusal  string // "" accepted
	}{
		{"wider subjects, longer window", func(cfg natsink.Config) []string {
			return []string{strings.Replace(cfg.Subject, ".events.", ".*.", 1) + ".>"}
		}, time.Hour, jetstream.FileStorage, true, ""},
		{"shorter window", own, time.Minute, jetstream.FileStorage, true, "less than the duplicate window 10m0s"},
		{"other subjects", func(cfg natsink.Config) []string { return []string{cfg.Subject + ".acme.*"} }, time.Hour, jetstream.FileStorage, true, "do not include"},
		// What JetStream acknowledged must outlive its servers: the sink
		// commits its offsets on the acknowledgement.
		{"in memory", own, time.Hour, jetstream.MemoryStorage, true, "keeps its messages in memory"},
		{"one replica, not allowed", own, time.Hour, jetstream.FileStorage, false, "has one replica"},
	}
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			cfg := e.config()
			cfg.Stream = fmt.Sprintf("existing_%d", i)
			cfg.Subject = fmt.Sprintf("%s.s%d", cfg.Topic, i)
			if !c.single {
				cfg.Replicas, cfg.AllowSingleReplica = 3, false // for a stream it would create
			}
			if _, err := e.js.CreateStream(ctx, jetstream.StreamConfig{Name: cfg.Stream, Subjects: c.subjects(cfg), Duplicates: c.window, Storage: c.storage}); err != nil {
				t.Fatal(err)
			}
			reg := prometheus.NewRegistry()
			s, err := natsink.New(cfg, kafka.Config{Brokers: e.brokers}, nil, reg)
			if err != nil {
				t.Fatal(err)
			}
			runCtx, cancel := context.WithTimeout(ctx, 20*time.Second)
			defer cancel()
			done := make(chan error, 1)
			go func() { done <- s.Run(runCtx) }()
			select {
			case <-s.Ready():
				if c.refusal != "" {
					t.Fatalf("sink started on a stream it should refuse (%s)", c.refusal)
				}
				// What it writes to, for `onceflow lag` and the status page.
				if got := streamInfo(t, reg); got != fmt.Sprintf("stream=%s storage=file replicas=1", cfg.Stream) {
					t.Errorf("onceflow_natsink_stream_info: %q", got)
				}
				cancel()
				if err := <-done; err != nil {
					t.Fatal(err)
				}
			case err := <-done:
				if c.refusal == "" || err == nil || !strings.Contains(err.Error(), c.refusal) {
					t.Fatalf("Run: %v, want %q", err, c.refusal)
				}
			}
			info, err := e.js.Stream(ctx, cfg.Stream)
			if err != nil {
				t.Fatal(err)
			}
			if got := info.CachedInfo().Config.Duplicates; got != c.window {
				t.Errorf("the stream's window is %s, want it left at %s", got, c.window)
			}
		})
	}
}

// JetStream down: the sink commits nothing past what JetStream
// acknowledged, counts its failed publishes and shows as disconnected; when
// the server is back every event is in the stream once, nothing skipped.
func TestJetStreamDownHoldsTheOffsets(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 3)
	before := e.produce(e.deposits(30, 4)...)
	cfg := e.config()
	cfg.AckTimeout = time.Second
	s := e.start(cfg)
	e.caughtUp(s.Sink)

	e.nats.Kill()
	during := e.produce(e.deposits(20, 4)...)
	pipelinetest.Eventually(t, 30*time.Second, func() error {
		if n := s.metric(t, "onceflow_natsink_publish_errors_total", "unavailable"); n == 0 {
			return errors.New("no failed publish counted yet")
		}
		return nil
	})
	if got := s.metric(t, "onceflow_natsink_connected"); got != 0 {
		t.Errorf("connected %v while the server is down, want 0", got)
	}
	if lag, err := e.lag(s.Sink); err != nil || lag != int64(len(during)) {
		t.Errorf("lag %d (%v) while JetStream is down, want the %d events it did not acknowledge", lag, err, len(during))
	}

	e.nats.Restart()
	e.caughtUp(s.Sink)
	msgs := e.messages(stream(cfg))
	if len(msgs) != len(before)+len(during) {
		t.Fatalf("stream holds %d messages, want %d", len(msgs), len(before)+len(during))
	}
	seen := map[string]bool{}
	for _, m := range msgs {
		id := m.Headers().Get(jetstream.MsgIDHeader)
		if seen[id] {
			t.Errorf("%s twice in the stream", id)
		}
		seen[id] = true
	}
}

// Shutdown while a batch is in flight: the batch is finished and its
// offsets committed although the context has ended (here: ended by the
// hook that runs once JetStream acknowledged the first batch, before its
// commit), Run returns nil, and the next run starts behind that batch:
// it publishes no event again.
func TestShutdownCommitsTheBatchInFlight(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 4)
	recs := e.produce(e.deposits(3000, 50)...)
	cfg := e.config()
	cfg.MaxPollRecords = 200
	var stopping sync.Once
	var s *sink
	started, stopped := make(chan struct{}), make(chan struct{})
	cfg.Hold = func(point string) {
		if point == natsink.HoldAcked {
			<-started
			stopping.Do(func() { s.cancel(); close(stopped) })
		}
	}
	s = e.start(cfg)
	close(started)
	<-stopped
	s.stop(t)
	published := s.metric(t, "onceflow_natsink_events_published_total")
	if published == 0 || published >= float64(len(recs)) {
		t.Fatalf("published %v before stopping, want one batch of the %d", published, len(recs))
	}
	if lag, err := e.lag(s.Sink); err != nil || lag != int64(len(recs))-int64(published) {
		t.Errorf("lag %d (%v) after stopping, want %d: the %v events JetStream acknowledged committed", lag, err, len(recs)-int(published), published)
	}
	cfg.Hold = nil
	again := e.start(cfg)
	e.caughtUp(again.Sink)
	if got := again.metric(t, "onceflow_natsink_duplicates_total"); got != 0 {
		t.Errorf("duplicates %v after a graceful stop, want 0", got)
	}
	if msgs := e.messages(stream(cfg)); len(msgs) != len(recs) {
		t.Fatalf("stream holds %d messages, want %d", len(msgs), len(recs))
	}
}

// A record of the events topic without a valid event-id (the processor
// writes none, any producer could) is forwarded all the same, with its
// topic position as Nats-Msg-Id, which a re-publish repeats, and counted.
func TestRecordWithoutEventID(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 1)
	bad := &kgo.Record{Topic: e.topics.Events(), Key: []byte("acme/acc-1"), Value: []byte("not avro"),
		Headers: []kgo.RecordHeader{{Key: pipeline.HeaderEventID, Value: []byte("not-a-uuid")}, {Key: pipeline.HeaderTenant, Value: []byte("acme")}}}
	e.produce(bad)
	cfg := e.config()
	s := e.start(cfg)
	e.caughtUp(s.Sink)
	msgs := e.messages(stream(cfg))
	if len(msgs) != 1 {
		t.Fatalf("stream holds %d messages, want 1", len(msgs))
	}
	wantID := fmt.Sprintf("%s/%d/%d", bad.Topic, bad.Partition, bad.Offset)
	if got := msgs[0].Headers().Get(jetstream.MsgIDHeader); got != wantID {
		t.Errorf("Nats-Msg-Id %q, want %q", got, wantID)
	}
	if got, want := msgs[0].Subject(), e.topics.Events()+".acme.%"; got != want {
		t.Errorf("subject %q, want %q", got, want)
	}
	if got := s.metric(t, "onceflow_natsink_records_without_event_id_total"); got != 1 {
		t.Errorf("records without event id %v, want 1", got)
	}
}

// streamInfo is the labels of the sink's onceflow_natsink_stream_info
// series at 1.
func streamInfo(t *testing.T, reg *prometheus.Registry) string {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, mf := range mfs {
		if mf.GetName() != "onceflow_natsink_stream_info" {
			continue
		}
		for _, m := range mf.GetMetric() {
			if m.GetGauge().GetValue() != 1 {
				continue
			}
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			out = append(out, fmt.Sprintf("stream=%s storage=%s replicas=%s", labels["stream"], labels["storage"], labels["replicas"]))
		}
	}
	return strings.Join(out, "; ")
}
