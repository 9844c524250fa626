package onceflow_test

import (
	"context"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/onceflow/onceflow"
	"github.com/onceflow/onceflow/examples/ledger/ledgerapp"
	"github.com/onceflow/onceflow/onceflowtest"
	"github.com/onceflow/onceflow/pipeline"
	"github.com/onceflow/onceflow/pipeline/apiclient"
	"github.com/onceflow/onceflow/pipeline/ingest"
	"github.com/onceflow/onceflow/pipeline/kafka"
	"github.com/onceflow/onceflow/pipeline/pipelinetest"
	"github.com/onceflow/onceflow/pipeline/postgres"
	"github.com/onceflow/onceflow/pipeline/relay"
)

// In a process that runs ingest and the relay, as onceflow dev does, a commit
// wakes the relay directly and notifies no other process of the shards this
// relay holds (docs/decisions/0012-waking-up-without-polling.md): with a poll
// of a minute, the command is on the commands topic within seconds, and the
// relays' channel heard nothing.
func TestIngestWakesItsOwnRelayWithoutNotifying(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	brokers := pipelinetest.Broker(t).Addrs()
	topics := pipelinetest.Topics(t, brokers, 1)
	pool, url := pipelinetest.Pool(t, ledgerMigrations)
	reg := prometheus.NewRegistry()
	addrs, _ := onceflowtest.Components(t, onceflow.RunConfig{
		Config: onceflow.Config{
			Domains: ledgerDomains(),
			Kafka:   kafka.Config{Brokers: brokers}, Topics: topics, DatabaseURL: url,
			Logger: slog.New(slog.DiscardHandler), InstanceID: "wake",
		},
		Components: onceflow.Components{Ingest: true, Relay: true},
		Relay:      relay.Config{PollInterval: time.Minute},
		Metrics:    reg,
	})
	pipelinetest.Eventually(t, 30*time.Second, func() error {
		return gaugeIs(reg, "onceflow_outbox_shards_owned", float64(pipeline.DefaultOutboxShards))
	})

	listener, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer listener.Release()
	if _, err := listener.Exec(ctx, "LISTEN "+postgres.OutboxChannel); err != nil {
		t.Fatal(err)
	}
	const key = "wake-test-key"
	if err := ingest.CreateAPIKey(ctx, pool, "acme", "test", key); err != nil {
		t.Fatal(err)
	}
	api := ledgerapp.Client{Client: &apiclient.Client{BaseURL: "http://" + addrs.HTTP, APIKey: key}}
	if _, _, err := api.OpenAccount(ctx, "open-a1", "a1", "EUR"); err != nil {
		t.Fatal(err)
	}

	cl := pipelinetest.Client(t, brokers, kgo.ConsumeTopics(topics.Commands()),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	fctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	if n := cl.PollFetches(fctx).NumRecords(); n != 1 {
		t.Fatalf("%d commands on the topic within 20 s, want 1: the relay, polling every minute, was not woken by its own ingest", n)
	}
	// A notification would have been sent right after the commit, before
	// the relay shipped the command.
	wctx, wcancel := context.WithTimeout(ctx, 500*time.Millisecond)
	defer wcancel()
	if n, err := listener.Conn().WaitForNotification(wctx); err == nil {
		t.Errorf("ingest notified %q on %s though its own relay holds every shard", n.Payload, postgres.OutboxChannel)
	}
}

// gaugeIs reports whether reg's gauge name (one series) is want.
func gaugeIs(reg prometheus.Gatherer, name string, want float64) error {
	mfs, err := reg.Gather()
	if err != nil {
		return err
	}
	for _, mf := range mfs {
		if mf.GetName() == name && len(mf.GetMetric()) == 1 {
			if got := mf.GetMetric()[0].GetGauge().GetValue(); got != want {
				return fmt.Errorf("%s = %v, want %v", name, got, want)
			}
			return nil
		}
	}
	return fmt.Errorf("no %s", name)
}
