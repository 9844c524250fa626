package trace_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/onceflow/onceflow/pipeline"
	"github.com/onceflow/onceflow/pipeline/kafka"
	"github.com/onceflow/onceflow/pipeline/pipelinetest"
	"github.com/onceflow/onceflow/pipeline/postgres"
	"github.com/onceflow/onceflow/pipeline/trace"
)

// BenchmarkFind measures trace.Find (the database part of `onceflow
// trace`) from an Idempotency-Key and from a command id, among 100,000
// commands with their keys, events in audit_log and inbox rows, next to
// the baseline of the same run: reading the one command_status row by its
// id, as GET /v1/commands/{id} does.
func BenchmarkFind(b *testing.B) {
	ctx := context.Background()
	pool, _ := pipelinetest.Pool(b)
	if _, err := postgres.EnsureDailyPartitions(ctx, pool, "idempotency_keys", 2); err != nil {
		b.Fatal(err)
	}
	if _, err := postgres.EnsureDailyPartitions(ctx, pool, "inbox", 2); err != nil {
		b.Fatal(err)
	}
	for _, q := range []string{
		`INSERT INTO command_status (command_id, tenant, aggregate_id, command_type, status, ingested, event_ids)
			SELECT gen_random_uuid(), 'acme', 'acme/acc-' || i, 'Deposit', 'accepted', true, '{}' FROM generate_series(1, 100000) AS i`,
		`INSERT INTO idempotency_keys (tenant, key, route, request_hash, command_id, response_status, response_headers, response_body)
			SELECT tenant, 'k-' || aggregate_id, 'POST /v1/accounts/{id}/deposits', '\x00', command_id, 202, '{}', '' FROM command_status`,
		`INSERT INTO audit_log (event_id, tenant, aggregate_id, version, event_type, command_id, payload, occurred_at)
			SELECT gen_random_uuid(), tenant, aggregate_id, 1, 'Deposited', command_id, '{}', now() FROM command_status`,
		`INSERT INTO inbox (consumer, event_id) SELECT 'onceflow-projector', event_id FROM audit_log`,
		`ANALYZE`,
	} {
		if _, err := pool.Exec(ctx, q); err != nil {
			b.Fatalf("%s: %v", q, err)
		}
	}
	var id string
	if err := pool.QueryRow(ctx, `SELECT command_id::text FROM command_status WHERE aggregate_id = 'acme/acc-50000'`).Scan(&id); err != nil {
		b.Fatal(err)
	}
	var byKey, byID, base time.Duration
	for range b.N {
		start := time.Now()
		var status string
		if err := pool.QueryRow(ctx, `SELECT status FROM command_status WHERE command_id = $1 AND tenant = 'acme'`, id).Scan(&status); err != nil {
			b.Fatal(err)
		}
		base += time.Since(start)
		start = time.Now()
		t, err := trace.Find(ctx, pool, "k-acme/acc-50000", "")
		if err != nil || t.Command.CommandID != id || len(t.Events) != 1 || len(t.Events[0].Inbox) != 1 {
			b.Fatalf("by key: %+v, %v", t, err)
		}
		byKey += time.Since(start)
		start = time.Now()
		if t, err = trace.Find(ctx, pool, id, ""); err != nil || t.Key == nil {
			b.Fatalf("by id: %+v, %v", t, err)
		}
		byID += time.Since(start)
	}
	ms := func(d time.Duration) float64 { return float64((d / time.Duration(b.N)).Microseconds()) / 1000 }
	b.ReportMetric(ms(byKey), "by_key_ms")
	b.ReportMetric(ms(byID), "by_command_id_ms")
	b.ReportMetric(ms(base), "baseline_status_ms")
	b.ReportMetric(0, "ns/op")
}

// BenchmarkConsumers measures trace.Consumers (`onceflow trace`'s answer
// to "which consumers have read past each event") for a command's two
// events among 100 consumer groups with offsets committed on an events
// topic of 8 partitions, 20 of them on another topic, on the embedded
// broker, next to the baseline of the same run: trace.Locate of the same
// events, the Kafka part every trace already pays (10,000 records, from
// the command's time on).
func BenchmarkConsumers(b *testing.B) {
	ctx := context.Background()
	brokers := pipelinetest.Broker(b).Addrs()
	topics := pipelinetest.Topics(b, brokers, 8)
	events := topics.Events()
	cl := pipelinetest.Client(b, brokers)
	since := time.Now()
	var recs []*kgo.Record
	for i := range 10_000 {
		recs = append(recs, &kgo.Record{Topic: events, Partition: int32(i % 8), Value: []byte("x"),
			Headers: []kgo.RecordHeader{{Key: pipeline.HeaderEventID, Value: fmt.Appendf(nil, "ev-%d", i)}}})
	}
	if err := cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		b.Fatal(err)
	}
	adm := kadm.NewClient(cl)
	for g := range 100 {
		offs := kadm.Offsets{}
		topic := events
		if g%5 == 0 {
			topic = topics.Commands()
		}
		for p := range int32(8) {
			offs.AddOffset(topic, p, int64(g*12), -1)
		}
		if err := adm.CommitAllOffsets(ctx, fmt.Sprintf("group-%03d", g), offs); err != nil {
			b.Fatal(err)
		}
	}
	want := []string{"ev-4000", "ev-9001"}
	var located, seen time.Duration
	for range b.N {
		start := time.Now()
		found, err := trace.Locate(ctx, cl, events, since, pipeline.HeaderEventID, want)
		if err != nil || len(found) != 2 {
			b.Fatalf("locate: %v, %v", found, err)
		}
		located += time.Since(start)
		t := &trace.Trace{Events: []trace.Event{{EventID: want[0]}, {EventID: want[1]}}}
		for i := range t.Events {
			p := found[want[i]]
			t.Events[i].Position = &p
		}
		start = time.Now()
		sources, err := kafka.Groups(ctx, cl)
		if err != nil {
			b.Fatal(err)
		}
		if err := trace.Consumers(ctx, cl, events, sources, t); err != nil || len(t.Events[0].Consumers) != 80 {
			b.Fatalf("consumers: %d, %v", len(t.Events[0].Consumers), err)
		}
		seen += time.Since(start)
	}
	ms := func(d time.Duration) float64 { return float64((d / time.Duration(b.N)).Microseconds()) / 1000 }
	b.ReportMetric(ms(seen), "consumers_ms")
	b.ReportMetric(ms(located), "baseline_locate_ms")
	b.ReportMetric(0, "ns/op")
}
