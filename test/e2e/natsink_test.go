package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/onceflow/onceflow"
	"github.com/onceflow/onceflow/examples/ledger"
	"github.com/onceflow/onceflow/examples/ledger/ledgerapp"
	"github.com/onceflow/onceflow/pipeline"
	"github.com/onceflow/onceflow/pipeline/apiclient"
	"github.com/onceflow/onceflow/pipeline/ingest"
	"github.com/onceflow/onceflow/pipeline/kafka"
	"github.com/onceflow/onceflow/pipeline/natsink"
	"github.com/onceflow/onceflow/pipeline/natsink/natsinktest"
	"github.com/onceflow/onceflow/pipeline/pipelinetest"
)

// sinkRig is a whole deployment, each component a process of its own and
// commands sent to ingest over HTTP, with NATS sink processes
// (bin/natsink) forwarding its events to a nats-server, and a durable
// JetStream consumer reading the stream as a NATS service would.
type sinkRig struct {
	*deployment
	t      *testing.T
	nats   *natsinktest.Server
	js     jetstream.JetStream
	serdes onceflow.Serdes
	hold   string // the sinks' crash-point directory
	sink   *Component
	starts int
	seen   *observed
}

func newSinkRig(t *testing.T, ctx context.Context) *sinkRig {
	t.Helper()
	if testing.Short() {
		t.Skip("multi-process end-to-end test; skipped with -short")
	}
	ns := natsinktest.Start(t) // skips the test without nats-server
	pool, url := pipelinetest.Pool(t)
	pl := newPipeline(t, url)
	// A killed sink's partitions move after its 2 s session timeout.
	pl.BrokerEnv = map[string]string{"ONCEFLOW_DEV_GROUP_MIN_SESSION_TIMEOUT": "500ms"}
	if _, err := pl.StartBroker(ctx); err != nil {
		t.Fatal(err)
	}
	d := &deployment{Pipeline: pl, pool: pool, comps: map[string]*Component{}}
	d.startAll(t, ctx)
	key := ingest.NewAPIKey()
	if err := ingest.CreateAPIKey(ctx, pool, "acme", "e2e", key); err != nil {
		t.Fatal(err)
	}
	d.client = &ledgerapp.Client{Client: &apiclient.Client{BaseURL: d.comps["ingest"].HTTP, APIKey: key}}
	r := &sinkRig{deployment: d, t: t, nats: ns, serdes: registrySerdes(t, ctx, pl), hold: t.TempDir(), seen: &observed{bySeq: map[uint64]observation{}}}
	_, r.js = ns.Connect(t)
	return r
}

// start starts a new sink process (after a kill, the next incarnation)
// and waits until it is ready: the stream exists and it joined its group.
func (r *sinkRig) start(ctx context.Context) {
	r.t.Helper()
	r.starts++
	c, err := r.StartComponent(ctx, "natsink", fmt.Sprintf("natsink-%d", r.starts), map[string]string{
		"ONCEFLOW_NATS_URL":             r.nats.URL,
		natsink.HoldEnv:                 r.hold,
		"ONCEFLOW_NATS_SESSION_TIMEOUT": "2s",
		// One nats-server: a stream of one replica, allowed as on a
		// server that syncs every write.
		"ONCEFLOW_NATS_STREAM_REPLICAS":      "1",
		"ONCEFLOW_NATS_ALLOW_SINGLE_REPLICA": "true",
	})
	if err != nil {
		r.t.Fatal(err)
	}
	r.sink = c
}

// stream is the stream the sink writes the deployment's events to.
func (r *sinkRig) stream() string { return natsink.DefaultStream(r.Prefix + ".events") }

// group is the sink's consumer group (DeployedDomain.NATSinkGroup): on
// Apache Kafka the prefix is the deployment's own.
func (r *sinkRig) group() string { return "onceflow-natsink-" + r.Prefix }

// observation is one message of the stream as the test's consumer got it.
type observation struct {
	subject, eventID, msgID, commandID, eventType, aggregateID string
	payload                                                    any
}

// observed is what the test's JetStream consumer has read, by stream
// sequence: a redelivery (an ack that did not arrive) is the same
// sequence, a message stored twice two of them.
type observed struct {
	mu    sync.Mutex
	bySeq map[uint64]observation
	errs  []string
}

// consume reads the stream with a durable consumer (explicit acks, from
// the first message) until the test ends, as a NATS service would.
func (r *sinkRig) consume(ctx context.Context) {
	r.t.Helper()
	cons, err := r.js.CreateOrUpdateConsumer(ctx, r.stream(), jetstream.ConsumerConfig{
		Durable: "e2e", AckPolicy: jetstream.AckExplicitPolicy, DeliverPolicy: jetstream.DeliverAllPolicy,
		FilterSubject: r.Prefix + ".events.acme.>",
	})
	if err != nil {
		r.t.Fatal(err)
	}
	cc, err := cons.Consume(func(m jetstream.Msg) {
		meta, err := m.Metadata()
		if err != nil {
			r.seen.fail("metadata: %v", err)
			return
		}
		h := m.Headers()
		o := observation{subject: m.Subject(), eventID: h.Get(pipeline.HeaderEventID), msgID: h.Get(jetstream.MsgIDHeader),
			commandID: h.Get(pipeline.HeaderCommandID), eventType: h.Get(pipeline.HeaderEventType), aggregateID: h.Get("aggregate-id")}
		if o.payload, err = r.serdes.Events.Decode(ctx, m.Data()); err != nil {
			r.seen.fail("stream sequence %d: decode: %v", meta.Sequence.Stream, err)
		}
		r.seen.mu.Lock()
		r.seen.bySeq[meta.Sequence.Stream] = o
		r.seen.mu.Unlock()
		if err := m.Ack(); err != nil {
			r.seen.fail("ack: %v", err)
		}
	})
	if err != nil {
		r.t.Fatal(err)
	}
	r.t.Cleanup(cc.Stop)
}

func (o *observed) fail(format string, a ...any) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.errs = append(o.errs, fmt.Sprintf(format, a...))
}

// arm makes the next batch stop once JetStream acknowledged it, before
// its commit; held waits until one has; release lets it go on.
func (r *sinkRig) arm() {
	r.t.Helper()
	if err := os.WriteFile(filepath.Join(r.hold, natsink.HoldAcked+".arm"), nil, 0o644); err != nil {
		r.t.Fatal(err)
	}
}

func (r *sinkRig) held() {
	r.t.Helper()
	pipelinetest.Eventually(r.t, 60*time.Second, func() error {
		_, err := os.Stat(filepath.Join(r.hold, natsink.HoldAcked+".held"))
		return err
	})
}

func (r *sinkRig) release() {
	r.t.Helper()
	if err := os.Remove(filepath.Join(r.hold, natsink.HoldAcked+".held")); err != nil {
		r.t.Fatal(err)
	}
}

// caughtUp waits until every accepted command has its event, the running
// sink's group has committed every event (its lag, as `onceflow lag`
// measures it, is 0), and the test's consumer has read every message of
// the stream.
func (r *sinkRig) caughtUp(ctx context.Context, m *ledgerModel) {
	r.t.Helper()
	r.checkExact(r.t, ctx, m)
	cl := pipelinetest.Client(r.t, []string{r.BrokerAddr})
	pipelinetest.Eventually(r.t, 90*time.Second, func() error {
		lags, err := kafka.Lag(ctx, cl, []kafka.LagSource{{Group: r.group(), Topics: []string{r.Prefix + ".events"}}})
		if err != nil {
			return err
		}
		for _, l := range lags {
			if l.Lag != 0 {
				return fmt.Errorf("partition %d: lag %d", l.Partition, l.Lag)
			}
		}
		s, err := r.js.Stream(ctx, r.stream())
		if err != nil {
			return err
		}
		info, err := s.Info(ctx)
		if err != nil {
			return err
		}
		r.seen.mu.Lock()
		defer r.seen.mu.Unlock()
		if uint64(len(r.seen.bySeq)) != info.State.Msgs {
			return fmt.Errorf("the consumer read %d of the stream's %d messages", len(r.seen.bySeq), info.State.Msgs)
		}
		return nil
	})
}

// check asserts that the consumer read each accepted command's event once
// (one stream message per command, under its event id as Nats-Msg-Id, on
// its tenant's and type's subject), nothing else, and payloads that add
// up to the balances the commands asked for.
func (r *sinkRig) check(ctx context.Context, m *ledgerModel) {
	r.t.Helper()
	r.caughtUp(ctx, m)
	r.seen.mu.Lock()
	defer r.seen.mu.Unlock()
	for _, e := range r.seen.errs {
		r.t.Error(e)
	}
	byCommand := map[string][]uint64{}
	byEvent := map[string][]uint64{}
	balance := map[string]int64{}
	for seq, o := range r.seen.bySeq {
		byCommand[o.commandID] = append(byCommand[o.commandID], seq)
		byEvent[o.eventID] = append(byEvent[o.eventID], seq)
		if o.msgID != o.eventID {
			r.t.Errorf("sequence %d: Nats-Msg-Id %q, event-id %q", seq, o.msgID, o.eventID)
		}
		if want := r.Prefix + ".events.acme." + o.eventType; o.subject != want {
			r.t.Errorf("sequence %d: subject %q, want %q", seq, o.subject, want)
		}
		if d, ok := o.payload.(ledger.Deposited); ok {
			balance[o.aggregateID] += d.Amount
		}
	}
	for id, seqs := range byEvent {
		if len(seqs) != 1 {
			r.t.Errorf("event %s stored %d times (stream sequences %v)", id, len(seqs), seqs)
		}
	}
	for id := range m.commands {
		if len(byCommand[id]) != 1 {
			r.t.Errorf("command %s: %d events in the stream (sequences %v), want 1", id, len(byCommand[id]), byCommand[id])
		}
	}
	if len(byCommand) != len(m.commands) {
		r.t.Errorf("the stream holds the events of %d commands, the clients had %d accepted", len(byCommand), len(m.commands))
	}
	for acct, want := range m.balance {
		if got := balance["acme/"+acct]; got != want {
			r.t.Errorf("account %s: deposits in the stream add up to %d, want %d", acct, got, want)
		}
	}
}

// metric reads a counter of the running sink.
func (r *sinkRig) metric(ctx context.Context, name string) float64 {
	r.t.Helper()
	v, err := r.sink.Metric(ctx, name)
	if err != nil {
		r.t.Fatal(err)
	}
	return v
}

// Commands sent over HTTP reach a NATS JetStream consumer, each event once,
// through a NATS sink killed with SIGKILL: once after JetStream
// acknowledged a batch and before its offsets were committed (the next
// process publishes that batch again with the same message ids, and
// JetStream drops every one as a duplicate), then three times at whatever
// point while commands keep coming. All within the stream's duplicate
// window (10 minutes); a re-publish past it is pipeline/natsink's
// TestRepublishPastTheWindowIsStoredAgain. `onceflow lag` shows the sink's group like
// any other.
func TestNATSinkKilledBetweenAckAndCommit(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	r := newSinkRig(t, ctx)
	m := newModel()
	client := func() *ledgerapp.Client { return r.client }
	workload(t, ctx, client, m, 3, 5, 0)
	r.start(ctx)
	r.consume(ctx)
	r.check(ctx, m)

	t.Run("sigkill acked", func(t *testing.T) {
		r.t = t
		before := len(m.commands)
		r.arm()
		workload(t, ctx, client, m, 3, 10, 0)
		r.held()
		r.sink.Kill()
		r.release()
		workload(t, ctx, client, m, 1, 5, 0) // and more while it is down
		r.start(ctx)
		r.check(ctx, m)
		dups, published := r.metric(ctx, "onceflow_natsink_duplicates_total"), r.metric(ctx, "onceflow_natsink_events_published_total")
		if want := len(m.commands) - before; dups < 1 || int(dups+published) != want {
			t.Errorf("the new process published %v events and JetStream dropped %v, want the %d after the last commit, the killed batch's (1 or more) dropped",
				published, dups, want)
		}
	})

	t.Run("sigkill under load", func(t *testing.T) {
		r.t = t
		stop, done := make(chan struct{}), make(chan struct{})
		var once sync.Once
		halt := func() { once.Do(func() { close(stop) }); <-done }
		defer halt() // a failed wait below ends the test: the load first
		go func() {  // rounds of new accounts until the kills are done
			defer close(done)
			for {
				select {
				case <-stop:
					return
				default:
				}
				workload(t, ctx, client, m, 4, 10, 0)
			}
		}()
		for range 3 {
			// Mid-stream: the sink has published events of this run.
			pipelinetest.Eventually(t, 90*time.Second, func() error {
				n, err := r.sink.Metric(ctx, "onceflow_natsink_events_published_total")
				if err != nil || n < 20 {
					return fmt.Errorf("published %v (%v)", n, err)
				}
				return nil
			})
			r.sink.Kill()
			r.start(ctx)
		}
		halt()
		r.check(ctx, m)
	})

	out, err := runCLI(ctx, r.Pipeline, "lag", "-group", r.group())
	if err != nil {
		t.Fatalf("onceflow lag: %v\n%s", err, out)
	}
	if !strings.Contains(out, r.group()) || !strings.Contains(out, r.Prefix+".events") {
		t.Errorf("onceflow lag does not show the sink's group:\n%s", out)
	}
	t.Logf("%d commands, %d sink processes", len(m.commands), r.starts)
}
