package onceflow_test

import (
	"context"
	"log/slog"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/onceflow/onceflow"
	"github.com/onceflow/onceflow/onceflowtest"
	"github.com/onceflow/onceflow/pipeline/kafka"
	"github.com/onceflow/onceflow/pipeline/pipelinetest"
)

// lagSeries returns the committed offset of each group's lag series on
// partition 0 of topic in reg.
func lagSeries(t *testing.T, reg prometheus.Gatherer, topic string) map[string]float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, mf := range mfs {
		if mf.GetName() != "kafka_consumergroup_group_lag" {
			continue
		}
		for _, m := range mf.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if labels["topic"] == topic && labels["partition"] == "0" {
				out[labels["group"]] = m.GetGauge().GetValue()
			}
		}
	}
	return out
}

// A process exports the lag of the consumers it runs (own, the components'
// default), or of every consumer group on the cluster and every consumer
// with offsets in Postgres (cluster, onceflow dev's default), or none.
func TestRunExportsLag(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	brokers := pipelinetest.Broker(t).Addrs()
	topics := pipelinetest.Topics(t, brokers, 1)
	pool, url := pipelinetest.Pool(t, ledgerMigrations)

	// A foreign group, two records behind on the events topic; a consumer
	// with its offsets in Postgres (a projector, here none running) three
	// behind, whose stale Kafka copy must not be what is shown.
	prod := pipelinetest.Client(t, brokers, kgo.DefaultProduceTopic(topics.Events()))
	for i := 0; i < 5; i++ {
		if err := prod.ProduceSync(ctx, &kgo.Record{Value: []byte("e")}).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	adm := kadm.NewClient(pipelinetest.Client(t, brokers))
	commit := func(group string, at int64) {
		o := kadm.Offsets{}
		o.Add(kadm.Offset{Topic: topics.Events(), Partition: 0, At: at, LeaderEpoch: -1})
		if _, err := adm.CommitOffsets(ctx, group, o); err != nil {
			t.Fatal(err)
		}
	}
	commit("billing", 3)
	commit("proj-x", 0) // the monitoring copy, behind
	if _, err := pool.Exec(ctx, `INSERT INTO consumer_offsets (consumer, topic, partition, next_offset) VALUES ('proj-x', $1, 0, 2)`, topics.Events()); err != nil {
		t.Fatal(err)
	}

	for _, tc := range []struct {
		export string
		want   map[string]float64 // lag on the events topic by group; absent: not exported
	}{
		{onceflow.LagExportCluster, map[string]float64{"billing": 2, "proj-x": 3}},
		{onceflow.LagExportOwn, map[string]float64{}},
		{onceflow.LagExportOff, map[string]float64{}},
	} {
		t.Run(tc.export, func(t *testing.T) {
			reg := prometheus.NewRegistry()
			_, stop := onceflowtest.Components(t, onceflow.RunConfig{
				Config: onceflow.Config{
					Domains: []*onceflow.Domain{ledgerWithGroup("proc-" + tc.export)},
					Kafka:   kafka.Config{Brokers: brokers}, Topics: topics, DatabaseURL: url,
					Logger: slog.New(slog.DiscardHandler), InstanceID: "lag-" + tc.export,
				},
				Components: onceflow.Components{Processor: true},
				Metrics:    reg,
				LagExport:  tc.export,
			})
			defer stop()
			got := lagSeries(t, reg, topics.Events())
			for g, want := range tc.want {
				if got[g] != want {
					t.Errorf("group %s: lag %v, want %v (all: %v)", g, got[g], want, got)
				}
			}
			for g := range got {
				if _, ok := tc.want[g]; !ok {
					t.Errorf("group %s exported, want only %v", g, tc.want)
				}
			}
			// own: the processor's group on the commands topic, from the
			// start (cluster finds it once it has joined).
			if tc.export != onceflow.LagExportCluster {
				procGroup := "proc-" + tc.export
				commands := lagSeries(t, reg, topics.Commands())
				_, has := commands[procGroup]
				if wantProc := tc.export == onceflow.LagExportOwn; has != wantProc {
					t.Errorf("processor group %s exported: %v, want %v (%v)", procGroup, has, wantProc, commands)
				}
			}
		})
	}
}
