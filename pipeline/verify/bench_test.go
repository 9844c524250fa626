package verify_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/onceflow/onceflow/pipeline"
	"github.com/onceflow/onceflow/pipeline/kafka"
	"github.com/onceflow/onceflow/pipeline/pipelinetest"
	"github.com/onceflow/onceflow/pipeline/postgres"
	"github.com/onceflow/onceflow/pipeline/verify"
)

const benchCommands = 100_000

// BenchmarkVerify measures verify.Run over 100,000 commands of 10,000
// aggregates, each decided into one event and applied by the projector
// (on the embedded broker: the commands and the events topics of 8
// partitions, the processor's offsets committed; on a real Postgres:
// command_status, idempotency_keys, the inbox and the projector's
// offsets), next to the baseline of the same run: a plain read of the same
// two topics (read_committed, the same reader) and of the same rows
// (SELECTs of command_status, idempotency_keys and the inbox over the
// window), what any audit of the window must read at least. Figures in
// seconds per 100,000 commands.
func BenchmarkVerify(b *testing.B) {
	ctx := context.Background()
	brokers := pipelinetest.Broker(b).Addrs()
	topics := pipelinetest.Topics(b, brokers, 8)
	cl := pipelinetest.Client(b, brokers)
	pool, _ := pipelinetest.Pool(b)
	for _, t := range []string{"idempotency_keys", "inbox"} {
		if _, err := postgres.EnsureDailyPartitions(ctx, pool, t, 2); err != nil {
			b.Fatal(err)
		}
	}
	from := time.Now().Add(-time.Minute)
	var cmds, evs []*kgo.Record
	var statusRows, keyRows, inboxRows [][]any
	value := make([]byte, 120)
	for i := range benchCommands {
		agg := fmt.Sprintf("acme/acc-%d", i%10_000)
		id, ev := pipeline.NewCommandID().String(), pipeline.NewCommandID().String()
		cmds = append(cmds, &kgo.Record{Topic: topics.Commands(), Key: []byte(agg), Value: value, Headers: []kgo.RecordHeader{
			{Key: pipeline.HeaderCommandID, Value: []byte(id)}, {Key: pipeline.HeaderTenant, Value: []byte("acme")}, {Key: pipeline.HeaderCommandType, Value: []byte("Deposit")}}})
		evs = append(evs, &kgo.Record{Topic: topics.Events(), Key: []byte(agg), Value: value, Headers: []kgo.RecordHeader{
			{Key: pipeline.HeaderEventID, Value: []byte(ev)}, {Key: pipeline.HeaderCommandID, Value: []byte(id)}, {Key: pipeline.HeaderTenant, Value: []byte("acme")},
			{Key: pipeline.HeaderEventType, Value: []byte("Deposited")}}})
		statusRows = append(statusRows, []any{id, "acme", agg, "Deposit", "accepted", true})
		keyRows = append(keyRows, []any{"acme", "k-" + id, "POST /v1/accounts/{id}/deposits", []byte{0}, id, 202, []byte("{}"), []byte{}})
		inboxRows = append(inboxRows, []any{"onceflow-projector", ev})
	}
	for _, recs := range [][]*kgo.Record{cmds, evs} {
		if err := cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
			b.Fatal(err)
		}
	}
	for _, c := range []struct {
		table string
		cols  []string
		rows  [][]any
	}{
		{"command_status", []string{"command_id", "tenant", "aggregate_id", "command_type", "status", "ingested"}, statusRows},
		{"idempotency_keys", []string{"tenant", "key", "route", "request_hash", "command_id", "response_status", "response_headers", "response_body"}, keyRows},
		{"inbox", []string{"consumer", "event_id"}, inboxRows},
	} {
		if _, err := pool.CopyFrom(ctx, pgx.Identifier{c.table}, c.cols, pgx.CopyFromRows(c.rows)); err != nil {
			b.Fatalf("copy %s: %v", c.table, err)
		}
	}
	// The processor and the projector are past every record.
	adm := kadm.NewClient(cl)
	ends, err := adm.ListEndOffsets(ctx, topics.Commands(), topics.Events())
	if err != nil {
		b.Fatal(err)
	}
	offs := kadm.Offsets{}
	ends.Each(func(o kadm.ListedOffset) {
		if o.Topic == topics.Commands() {
			offs.AddOffset(o.Topic, o.Partition, o.Offset, -1)
			return
		}
		if _, err := pool.Exec(ctx, `INSERT INTO consumer_offsets (consumer, topic, partition, next_offset) VALUES ('onceflow-projector', $1, $2, $3)`,
			o.Topic, o.Partition, o.Offset); err != nil {
			b.Fatal(err)
		}
	})
	if err := adm.CommitAllOffsets(ctx, "onceflow-processor", offs); err != nil {
		b.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `ANALYZE`); err != nil {
		b.Fatal(err)
	}
	cfg := verify.Config{From: from, Commands: []verify.CommandsTopic{{Topic: topics.Commands(), Group: "onceflow-processor"}},
		Events: []verify.EventsTopic{{Topic: topics.Events(), Projectors: []string{"onceflow-projector"}}}}
	var took, base time.Duration
	for range b.N {
		start := time.Now()
		n := 0
		for _, topic := range []string{topics.Commands(), topics.Events()} {
			recs, err := kafka.ReadTopic(ctx, cl, topic, true)
			if err != nil {
				b.Fatal(err)
			}
			n += len(recs)
		}
		for _, q := range []string{
			`SELECT command_id::text, tenant, aggregate_id, status, created_at FROM command_status WHERE created_at >= $1`,
			`SELECT tenant, key, command_id::text FROM idempotency_keys WHERE created_at >= $1`,
			`SELECT consumer, event_id::text FROM inbox WHERE received_at >= $1`,
		} {
			rows, _ := pool.Query(ctx, q, from)
			got, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (int, error) { return 1, nil })
			if err != nil {
				b.Fatal(err)
			}
			n += len(got)
		}
		if n != 5*benchCommands {
			b.Fatalf("the baseline read %d records and rows, want %d", n, 5*benchCommands)
		}
		base += time.Since(start)
		start = time.Now()
		cfg.To = time.Time{}
		rep, err := verify.Run(ctx, cfg, pool, cl)
		if err != nil {
			b.Fatal(err)
		}
		took += time.Since(start)
		if len(rep.Findings) != 0 || len(rep.NotChecked) != 0 {
			b.Fatalf("findings %+v, not checked %v", rep.Findings, rep.NotChecked)
		}
	}
	per100k := func(d time.Duration) float64 { return (d / time.Duration(b.N)).Seconds() * 100_000 / benchCommands }
	b.ReportMetric(per100k(took), "verify_s/100k_commands")
	b.ReportMetric(per100k(base), "baseline_read_s/100k_commands")
	b.ReportMetric(0, "ns/op")
}
