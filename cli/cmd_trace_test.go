package cli_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/onceflow/onceflow"
	"github.com/onceflow/onceflow/examples/ledger/ledgerapp"
	"github.com/onceflow/onceflow/onceflowtest"
	"github.com/onceflow/onceflow/pipeline/apiclient"
	"github.com/onceflow/onceflow/pipeline/ingest"
	"github.com/onceflow/onceflow/pipeline/jobs"
	"github.com/onceflow/onceflow/pipeline/kafka"
	"github.com/onceflow/onceflow/pipeline/pipelinetest"
	"github.com/onceflow/onceflow/pipeline/trace"
	"github.com/onceflow/onceflow/pipeline/webhooks"
	"github.com/onceflow/onceflow/pipeline/webhooks/webhookstest"
)

// One HTTP command followed through the whole pipeline (every component in
// one process, the embedded broker, a real Postgres): `onceflow trace`
// from its Idempotency-Key shows the key record, where the relay shipped
// the command (and the record there is that command), its accepted
// status, its event on the events topic, the projector's inbox row, and
// the event's webhook delivery with its job, each with its time; the
// command id and the event id lead to the same trace.
func TestTraceFollowsOneCommand(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	brokers := pipelinetest.Broker(t).Addrs()
	pool, url := pipelinetest.Pool(t, ledgerMigrations)
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	// Webhooks: every projector enqueues the fan-out of each batch, and
	// the worker (in onceflow.All) delivers the events to a receiver
	// subscribed to every event type of acme, and AccountOpened again (two
	// subscriptions: the fan-out's way, not the inline one's).
	sub, _, err := webhooks.Create(ctx, pool, "acme", "trace-sub", "http://127.0.0.1:1/placeholder", nil)
	if err != nil {
		t.Fatal(err)
	}
	opens, _, err := webhooks.Create(ctx, pool, "acme", "trace-sub-2", "http://127.0.0.1:1/placeholder", []string{"AccountOpened"})
	if err != nil {
		t.Fatal(err)
	}
	receiver := webhookstest.New([]string{sub.Secret, opens.Secret}, nil)
	defer receiver.Close()
	if _, err := pool.Exec(ctx, `UPDATE webhook_subscriptions SET url = $1`, receiver.URL); err != nil {
		t.Fatal(err)
	}
	a, _ := onceflowtest.Components(t, onceflow.RunConfig{
		Config: onceflow.Config{
			Domains: []*onceflow.Domain{ledgerapp.Domain()}, Kafka: kafka.Config{Brokers: brokers, Logger: logger},
			Topics: kafka.Topics{Partitions: 2}, DatabaseURL: url, Logger: logger,
		},
		Components: onceflow.All,
		Worker:     jobs.Config{FetchPollInterval: 100 * time.Millisecond},
		Webhooks:   webhooks.Config{Allow: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}},
	})
	base := "http://" + a.HTTP
	key := ingest.NewAPIKey()
	if err := ingest.CreateAPIKey(ctx, pool, "acme", "test", key); err != nil {
		t.Fatal(err)
	}
	cl := &ledgerapp.Client{Client: &apiclient.Client{BaseURL: base, APIKey: key}}
	if _, _, err := cl.OpenAccount(ctx, "trace-open", "acc-t", "EUR"); err != nil {
		t.Fatal(err)
	}
	acc, _, err := cl.Deposit(ctx, "trace-dep", "acc-t", 250)
	if err != nil {
		t.Fatal(err)
	}
	wctx, wcancel := context.WithTimeout(ctx, 60*time.Second)
	defer wcancel()
	if cmd, err := cl.WaitCommand(wctx, acc.CommandID); err != nil || cmd.Status != "accepted" {
		t.Fatalf("deposit: %+v, %v", cmd, err)
	}

	env := map[string]string{"DATABASE_URL": url, "KAFKA_BROKERS": brokers[0], "ONCEFLOW_PARTITIONS": "2"}
	traceOf := func(args ...string) (trace.Trace, []trace.Step, string) {
		t.Helper()
		var out bytes.Buffer
		if err := run(ctx, append([]string{"trace"}, args...), func(k string) string { return env[k] }, &out); err != nil {
			t.Fatalf("trace %v: %v\n%s", args, err, out.String())
		}
		var got struct {
			trace.Trace
			Timeline []trace.Step `json:"timeline"`
		}
		if args[0] == "-json" {
			if err := json.Unmarshal(out.Bytes(), &got); err != nil {
				t.Fatalf("%v:\n%s", err, out.String())
			}
		}
		return got.Trace, got.Timeline, out.String()
	}
	var tr trace.Trace
	var steps []trace.Step
	pipelinetest.Eventually(t, 30*time.Second, func() error {
		tr, steps, _ = traceOf("-json", "trace-dep")
		if len(tr.Events) != 1 || len(tr.Events[0].Inbox) == 0 {
			return fmt.Errorf("events %+v: not projected yet", tr.Events)
		}
		if d := tr.Events[0].Deliveries; len(d) != 1 || d[0].Status != "delivered" {
			return fmt.Errorf("webhook deliveries %+v: not delivered yet", d)
		}
		if j := tr.Events[0].Jobs; len(j) != 2 || j[0].State != "completed" || j[1].State != "completed" {
			return fmt.Errorf("jobs %+v: not completed yet (the event's fan-out and its delivery)", j)
		}
		return nil
	})
	c := tr.Command
	if tr.QueryKind != "idempotency-key" || tr.Key == nil || tr.Key.Key != "trace-dep" || tr.Key.ResponseStatus != 202 ||
		c.CommandID != acc.CommandID || c.Status != "accepted" || c.AggregateID != "acme/acc-t" || c.CommandType != "Deposit" {
		t.Errorf("trace: %+v, command %+v", tr, c)
	}
	if tr.Outbox != nil || tr.Dead != nil || tr.Shipped == nil || tr.Shipped.Topic != "ledger.commands" {
		t.Fatalf("shipped %+v (outbox %+v, dead %+v), want a position on ledger.commands", tr.Shipped, tr.Outbox, tr.Dead)
	}
	// The record at that position is the command.
	kc := pipelinetest.Client(t, brokers)
	var header string
	if _, err := kafka.ReadPartitionFrom(ctx, kc, tr.Shipped.Topic, tr.Shipped.Partition, tr.Shipped.Offset, true, func(r *kgo.Record) error {
		if r.Offset == tr.Shipped.Offset {
			for _, h := range r.Headers {
				if h.Key == "command-id" {
					header = string(h.Value)
				}
			}
		}
		return nil
	}); err != nil || header != acc.CommandID {
		t.Errorf("the record at %+v has command-id %q (%v), want %s", tr.Shipped, header, err, acc.CommandID)
	}
	e := tr.Events[0]
	if e.EventType != "Deposited" || e.Position == nil || e.Position.Topic != "ledger.events" || e.Inbox[0].Consumer != "onceflow-projector" {
		t.Errorf("event %+v", e)
	}
	var stages []string
	for _, s := range steps {
		stages = append(stages, s.Stage)
		if s.At.IsZero() {
			t.Errorf("step %+v has no time", s)
		}
	}
	if got := strings.Join(stages, " "); got != "key command shipped event consumers inbox job job webhook status" {
		t.Errorf("timeline %q, want key command shipped event consumers inbox job job webhook status (the fan-out's job and the delivery's)", got)
	}
	// The event's fan-out made the delivery; the delivery's job is the one
	// the receiver saw, once, under its key.
	d, jb := e.Deliveries[0], e.Jobs
	if len(jb) != 2 || jb[0].Kind != "webhook_fanout" || jb[1].Kind != "webhook_delivery" || d.JobID == nil || *d.JobID != jb[1].ID ||
		jb[1].State != "completed" || d.SubscriptionID != sub.ID.String() || receiver.Requests(jb[1].Key) != 1 || receiver.Effects() != 3 {
		t.Errorf("delivery %+v, jobs %+v, receiver saw %d requests under the key and %d effects; want the fan-out and a completed delivery job, 1 and 3 (the open twice and the deposit)",
			d, jb, receiver.Requests(jb[len(jb)-1].Key), receiver.Effects())
	}
	// The command id and the event id lead to the same command; the table
	// says where it went.
	for _, q := range []string{acc.CommandID, e.EventID} {
		if got, _, _ := traceOf("-json", q); got.Command == nil || got.Command.CommandID != acc.CommandID || got.Shipped == nil || *got.Shipped != *tr.Shipped {
			t.Errorf("trace %s: %+v", q, got)
		}
	}
	// Lineage: two consumer groups of ledger.events, billing having read
	// and committed the deposit's event, shipping only the account's
	// opening (the record before it on the partition), are shown as
	// having read past it and not; the projector, by its offsets in
	// Postgres, has.
	var opened string
	if ev, _, _ := traceOf("-json", "trace-open"); len(ev.Events) == 1 {
		opened = ev.Events[0].EventID
	}
	if opened == "" {
		t.Fatal("trace-open: no event")
	}
	readUntil(t, brokers, "billing", e.Position.Topic, e.EventID)
	readUntil(t, brokers, "shipping", e.Position.Topic, opened)
	tr, _, _ = traceOf("-json", "trace-dep")
	got := map[string]trace.Consumer{}
	for _, c := range tr.Events[0].Consumers {
		got[c.Group] = c
	}
	if c := got["billing"]; !c.Seen || c.OffsetsIn != "kafka" || c.Committed != tr.Events[0].Position.Offset+1 {
		t.Errorf("billing %+v, want seen with committed offset %d", c, tr.Events[0].Position.Offset+1)
	}
	if c := got["shipping"]; c.Group == "" || c.Seen || c.Committed < 0 || c.Committed > tr.Events[0].Position.Offset {
		t.Errorf("shipping %+v, want not seen, committed at or before %d", c, tr.Events[0].Position.Offset)
	}
	if c := got["onceflow-projector"]; !c.Seen || c.OffsetsIn != "postgres" {
		t.Errorf("the projector %+v, want seen, its offsets in postgres", c)
	}
	for g := range got {
		if strings.HasPrefix(g, "onceflow-processor") {
			t.Errorf("%s reads the commands topic, not the events: %+v", g, got)
		}
	}
	_, _, text := traceOf("trace-dep")
	for _, want := range []string{"idempotency-key \"trace-dep\"", "shipped", "read past it: billing, onceflow-projector; not yet: shipping (at offset", fmt.Sprintf("partition %d offset %d", tr.Shipped.Partition, tr.Shipped.Offset), "onceflow-projector applied", "accepted"} {
		if !strings.Contains(text, want) {
			t.Errorf("trace output has no %q:\n%s", want, text)
		}
	}
	var out bytes.Buffer
	if err := run(ctx, []string{"trace", "no-such-key"}, func(k string) string { return env[k] }, &out); err == nil || !errors.Is(err, trace.ErrNotFound) {
		t.Errorf("an unknown key: %v", err)
	}
}

// readUntil reads topic as the consumer group group until the record with
// the event id, and commits it: the group has then read past it, and no
// further.
func readUntil(t *testing.T, brokers []string, group, topic, eventID string) {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ConsumerGroup(group), kgo.ConsumeTopics(topic),
		kgo.DisableAutoCommit(), kgo.FetchIsolationLevel(kgo.ReadCommitted()), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for {
		fs := cl.PollFetches(ctx)
		if err := fs.Err0(); err != nil {
			t.Fatalf("%s reading %s: %v", group, topic, err)
		}
		for _, r := range fs.Records() {
			for _, h := range r.Headers {
				if h.Key == "event-id" && string(h.Value) == eventID {
					if err := cl.CommitRecords(ctx, r); err != nil {
						t.Fatalf("%s commits: %v", group, err)
					}
					return
				}
			}
		}
	}
}
