package onceflow_test

import (
	"context"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/onceflow/onceflow"
	"github.com/onceflow/onceflow/examples/ledger/ledgerapp"
	"github.com/onceflow/onceflow/onceflowtest"
	"github.com/onceflow/onceflow/pipeline"
	"github.com/onceflow/onceflow/pipeline/apiclient"
	"github.com/onceflow/onceflow/pipeline/ingest"
	"github.com/onceflow/onceflow/pipeline/kafka"
	"github.com/onceflow/onceflow/pipeline/pipelinetest"
	"github.com/onceflow/onceflow/pipeline/processor"
)

// A command ingest accepted is never failed for the pipeline's own delay:
// commands that waited in the outbox for three days (a relay or broker
// outage), longer than the processor's bound on a record's age, are
// decided when they reach it, and so is the credit a transfer among them
// sends, which carries the transfer's time. The bound still holds for
// what a producer sends: the same command produced three days old is
// failed past-timestamp, and no one's record is taken from before 1970.
// A producer that forges the relay's accepted-by header on a record three
// days old has it decided (docs/security.md: what the forgery buys).
func TestAcceptedCommandsAreNotFailedForTheirAge(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	brokers := pipelinetest.Broker(t).Addrs()
	topics := pipelinetest.Topics(t, brokers, 1)
	pool, url := pipelinetest.Pool(t, ledgerMigrations)
	config := func(instance string) onceflow.Config {
		return onceflow.Config{
			Domains: ledgerDomains(),
			Kafka:   kafka.Config{Brokers: brokers}, Topics: topics, DatabaseURL: url,
			Logger: slog.New(slog.DiscardHandler), InstanceID: instance,
		}
	}
	addrs, _ := onceflowtest.Components(t, onceflow.RunConfig{Config: config("ingest"), Components: onceflow.Components{Ingest: true}})
	const key = "accepted-test-key"
	if err := ingest.CreateAPIKey(ctx, pool, "acme", "test", key); err != nil {
		t.Fatal(err)
	}
	client := &apiclient.Client{BaseURL: "http://" + addrs.HTTP, APIKey: key}
	api := ledgerapp.Client{Client: client}
	var accepted []string
	keep := func(a apiclient.Accepted, _ *apiclient.Response, err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		accepted = append(accepted, a.CommandID)
	}
	// The credit's account is in the debited one's outbox shard, so it is
	// opened before the credit reaches it: shards ship in no order.
	to := ""
	for i := 0; to == ""; i++ {
		if id := fmt.Sprintf("a%d", i+2); pipeline.OutboxShard("acme/"+id, pipeline.DefaultOutboxShards) == pipeline.OutboxShard("acme/a1", pipeline.DefaultOutboxShards) {
			to = id
		}
	}
	keep(api.OpenAccount(ctx, "open-a1", "a1", "EUR"))
	keep(api.OpenAccount(ctx, "open-to", to, "EUR"))
	keep(api.Deposit(ctx, "dep-a1", "a1", 100))
	keep(api.Transfer(ctx, "tr-1", "t1", "a1", to, 30))
	// Three days in the outbox: longer than the bound set below.
	tag, err := pool.Exec(ctx, `UPDATE outbox SET created_at = created_at - interval '72 hours'`)
	if err != nil || tag.RowsAffected() != int64(len(accepted)) {
		t.Fatalf("aging the outbox: %v rows, %v; want %d rows", tag.RowsAffected(), err, len(accepted))
	}

	onceflowtest.Components(t, onceflow.RunConfig{
		Config:     config("pipeline"),
		Components: onceflow.Components{Relay: true, Processor: true, Projector: true},
		Processor:  processor.Config{MaxCommandAge: processor.MinMaxCommandAge},
	})
	wctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	for _, id := range accepted {
		cmd, err := client.WaitCommand(wctx, id)
		if err != nil {
			t.Fatal(err)
		}
		if cmd.Status != "accepted" {
			t.Errorf("command %s (%s): %s %s %s, want accepted (decided): it was accepted, then waited in the outbox", id, cmd.CommandType, cmd.Status, cmd.Reason, cmd.Detail)
		}
	}
	pipelinetest.Eventually(t, 30*time.Second, func() error {
		credited, err := api.Account(ctx, to)
		if err != nil {
			return err
		}
		if credited.Balance != 30 {
			return fmt.Errorf("%s's balance %d, want 30: the transfer's credit was not applied", to, credited.Balance)
		}
		return nil
	})

	// The deposit as ingest shipped it, produced again as a producer would.
	shipped := commandRecord(t, brokers, topics.Commands(), accepted[2])
	old := time.Now().Add(-72 * time.Hour)
	produced := []struct {
		name       string
		acceptedBy string
		at         time.Time
		want       string // status, and past-timestamp when failed
	}{
		{"a producer's record three days old", "", old, "failed past-timestamp"},
		{"a forged accepted-by before 1970", pipeline.AcceptedByRelay, time.Date(1960, 1, 1, 0, 0, 0, 0, time.UTC), "failed past-timestamp"},
		{"a forged accepted-by three days old", pipeline.AcceptedByRelay, old, "accepted "},
	}
	cl := pipelinetest.Client(t, brokers)
	ids := make([]string, len(produced))
	for i, p := range produced {
		id := pipeline.NewCommandID()
		ids[i] = id.String()
		rec := &kgo.Record{Topic: topics.Commands(), Key: shipped.Key, Value: shipped.Value, Timestamp: p.at,
			Headers: kafka.CommandHeaders(id, "acme", "Deposit", "")}
		if p.acceptedBy != "" {
			rec.Headers = append(rec.Headers, kgo.RecordHeader{Key: pipeline.HeaderAcceptedBy, Value: []byte(p.acceptedBy)})
		}
		if err := cl.ProduceSync(ctx, rec).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	for i, p := range produced {
		cmd, err := client.WaitCommand(wctx, ids[i])
		if err != nil {
			t.Fatal(err)
		}
		if got := cmd.Status + " " + cmd.Reason; got != p.want {
			t.Errorf("%s: %q, want %q", p.name, got, p.want)
		}
	}
}

// commandRecord is the record of command id on topic.
func commandRecord(t *testing.T, brokers []string, topic, id string) *kgo.Record {
	t.Helper()
	cl := pipelinetest.Client(t, brokers, kgo.ConsumeTopics(topic),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for ctx.Err() == nil {
		for _, r := range cl.PollFetches(ctx).Records() {
			if header(r, pipeline.HeaderCommandID) == id {
				return r
			}
		}
	}
	t.Fatalf("no record of command %s on %s", id, topic)
	return nil
}

// header is r's header key, or "".
func header(r *kgo.Record, key string) string {
	for _, h := range r.Headers {
		if h.Key == key {
			return string(h.Value)
		}
	}
	return ""
}
