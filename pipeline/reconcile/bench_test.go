package reconcile_test

import (
	"context"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/onceflow/onceflow/pipeline/pipelinetest"
	"github.com/onceflow/onceflow/pipeline/postgres"
	"github.com/onceflow/onceflow/pipeline/reconcile"
)

// BenchmarkReconcile measures a dry run (find every kind, ask, report)
// over a database with ONCEFLOW_BENCH_STUCK stuck commands (default 1000:
// the most a run reports per kind) among 100 times as many settled ones,
// half pending too long (with their Idempotency-Keys, among the keys of
// every settled command), half in outbox_dead; next to the
// baseline of the same run, the one query an operator would write to count
// the pending ones. Figures per run: its time, findings per second, and
// the run over the baseline.
func BenchmarkReconcile(b *testing.B) {
	n := 1000
	if v, err := strconv.Atoi(os.Getenv("ONCEFLOW_BENCH_STUCK")); err == nil && v > 0 {
		n = v
	}
	ctx := context.Background()
	pool, _ := pipelinetest.Pool(b)
	if _, err := postgres.EnsureDailyPartitions(ctx, pool, "idempotency_keys", 2); err != nil {
		b.Fatal(err)
	}
	for _, q := range []string{
		`INSERT INTO command_status (command_id, tenant, aggregate_id, command_type, status, ingested, created_at)
			SELECT gen_random_uuid(), 'acme', 'acme/acc-' || (i % 500), 'Deposit', 'accepted', true, now() - interval '1 hour'
			FROM generate_series(1, $1 * 100) AS i`,
		`INSERT INTO command_status (command_id, tenant, aggregate_id, command_type, status, ingested, created_at)
			SELECT gen_random_uuid(), 'acme', 'acme/acc-' || (i % 500), 'Deposit', 'pending', true, now() - interval '1 hour'
			FROM generate_series(1, $1 / 2) AS i`,
		`INSERT INTO outbox_dead (id, shard, topic, key, value, headers, created_at, reason, detail)
			SELECT i, i % 16, 'ledger.commands', convert_to('acme/acc-' || (i % 500), 'UTF8'), '\x00',
				jsonb_build_object('command-id', gen_random_uuid()::text, 'tenant', 'acme', 'command-type', 'Deposit'), now(), 'MESSAGE_TOO_LARGE', 'x'
			FROM generate_series(1, $1 / 2) AS i`,
		`INSERT INTO idempotency_keys (tenant, key, route, request_hash, command_id, response_status, response_headers, response_body)
			SELECT tenant, 'k-' || command_id, 'POST /v1/accounts/{id}/deposits', '\x00', command_id, 202, '{}', '' FROM command_status`,
		`ANALYZE`,
	} {
		var args []any
		if strings.Contains(q, "$1") {
			args = append(args, n)
		}
		if _, err := pool.Exec(ctx, q, args...); err != nil {
			b.Fatalf("%s: %v", q, err)
		}
	}
	r, err := reconcile.New(reconcile.Config{DryRun: true}, pool, slog.New(slog.DiscardHandler), nil)
	if err != nil {
		b.Fatal(err)
	}
	var run, base time.Duration
	for range b.N {
		start := time.Now()
		var c int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM command_status WHERE status = 'pending' AND created_at < now() - interval '15 minutes'`).Scan(&c); err != nil {
			b.Fatal(err)
		}
		base += time.Since(start)
		start = time.Now()
		rep, err := r.Reconcile(ctx)
		if err != nil {
			b.Fatal(err)
		}
		run += time.Since(start)
		if len(rep.Findings) != n/2*2 {
			b.Fatalf("%d findings, want %d", len(rep.Findings), n/2*2)
		}
	}
	per := run / time.Duration(b.N)
	b.ReportMetric(float64(per.Microseconds())/1000, "run_ms")
	b.ReportMetric(float64(n/2*2)/per.Seconds(), "findings/s")
	b.ReportMetric(float64((base/time.Duration(b.N)).Microseconds())/1000, "baseline_count_ms")
	b.ReportMetric(float64(run)/float64(base), "ratio")
	b.ReportMetric(0, "ns/op")
}
