package trace_test

import (
	"context"
	"testing"
	"time"

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
