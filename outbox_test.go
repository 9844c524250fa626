package onceflow_test

import (
	"context"
	"log/slog"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/onceflow/onceflow"
	"github.com/onceflow/onceflow/pipeline"
	"github.com/onceflow/onceflow/pipeline/ingest"
	"github.com/onceflow/onceflow/pipeline/kafka"
	"github.com/onceflow/onceflow/pipeline/relay"
)

// Ingest computes each outbox row's shard and the relay leases the
// shards: a count one of them takes, the other takes too, so that no
// ingest starts with a count its relay then refuses (5000 once did).
func TestIngestAndRelayAgreeOnOutboxShards(t *testing.T) {
	t.Parallel()
	logger := slog.New(slog.DiscardHandler)
	for _, n := range []int{-1, 1, 16, pipeline.MaxOutboxShards, pipeline.MaxOutboxShards + 1, 5000} {
		_, ierr := ingest.New(ingest.Config{Shards: n, Committers: 1, MaxKeyLookups: 2}, nil, nil, nil, logger, prometheus.NewRegistry())
		_, rerr := relay.New(relay.Config{Shards: n}, nil, kafka.Config{}, logger, prometheus.NewRegistry())
		want := n >= 1 && n <= pipeline.MaxOutboxShards
		if (ierr == nil) != want || (rerr == nil) != want {
			t.Errorf("%d shards: ingest says %v, the relay %v; want both to %s", n, ierr, rerr, map[bool]string{true: "accept", false: "refuse"}[want])
		}
	}
}

// The shard count has one home, Config.OutboxShards: a deployment that
// also gives it to one role is refused before anything starts, rather
// than running ingest and the relay on two counts.
func TestOutboxShardsHaveOneHome(t *testing.T) {
	t.Parallel()
	for _, rc := range []onceflow.RunConfig{
		{Config: onceflow.Config{OutboxShards: 8}, Ingest: ingest.Config{Shards: 8}},
		{Relay: relay.Config{Shards: 32}},
		{Config: onceflow.Config{OutboxShards: 5000}},
	} {
		rc.Components = onceflow.Components{Ingest: true, Relay: true}
		rc.Logger = slog.New(slog.DiscardHandler)
		err := onceflow.RunComponents(context.Background(), rc)
		if err == nil || !strings.Contains(err.Error(), "ONCEFLOW_OUTBOX_SHARDS") {
			t.Errorf("Config.OutboxShards %d, Ingest.Shards %d, Relay.Shards %d: %v, want a refusal naming ONCEFLOW_OUTBOX_SHARDS",
				rc.OutboxShards, rc.Ingest.Shards, rc.Relay.Shards, err)
		}
	}
}
