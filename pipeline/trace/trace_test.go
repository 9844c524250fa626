package trace_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/onceflow/onceflow/pipeline"
	"github.com/onceflow/onceflow/pipeline/pipelinetest"
	"github.com/onceflow/onceflow/pipeline/postgres"
	"github.com/onceflow/onceflow/pipeline/trace"
)

func exec(t *testing.T, pool *pgxpool.Pool, sql string, args ...any) {
	t.Helper()
	if _, err := pool.Exec(context.Background(), sql, args...); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

// What the database holds of commands in other states than the end to
// end test's: a provider event's command still in the outbox, one in
// outbox_dead and reconciled, an Idempotency-Key two tenants used, and
// queries that match nothing.
func TestFind(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, _ := pipelinetest.Pool(t)
	if _, err := postgres.EnsureDailyPartitions(ctx, pool, "idempotency_keys", 2); err != nil {
		t.Fatal(err)
	}
	waiting, dead, other := pipeline.NewCommandID(), pipeline.NewCommandID(), pipeline.NewCommandID()
	exec(t, pool, `INSERT INTO inbound_events (provider, event_id, event_type, tenant, aggregate_id, status, command_id, command_type, payload, deliveries)
		VALUES ('payments', 'evt_7', 'payment.succeeded', 'acme', 'acme/acc-1', 'enqueued', $1, 'Deposit', '{}', 3)`, waiting.String())
	for _, c := range []struct {
		id     pipeline.ID
		tenant string
		status string
	}{{waiting, "acme", "pending"}, {dead, "acme", "failed"}, {other, "beta", "accepted"}} {
		exec(t, pool, `INSERT INTO command_status (command_id, tenant, aggregate_id, command_type, status, ingested)
			VALUES ($1, $2, $2 || '/acc-1', 'Deposit', $3, true)`, c.id.String(), c.tenant, c.status)
	}
	exec(t, pool, `INSERT INTO outbox (shard, topic, key, value, headers) VALUES (2, 'ledger.commands', 'acme/acc-1', '\x00', $1::jsonb)`,
		`{"command-id":"`+waiting.String()+`"}`)
	exec(t, pool, `INSERT INTO outbox_dead (id, shard, topic, key, value, headers, created_at, reason, detail)
		VALUES (5, 2, 'ledger.commands', 'acme/acc-1', '\x00', $1::jsonb, now(), 'MESSAGE_TOO_LARGE', 'x')`, `{"command-id":"`+dead.String()+`"}`)
	exec(t, pool, `INSERT INTO reconcile_corrections (kind, subject, action, tenant, aggregate_id, command_id, reason)
		VALUES ('outbox-dead', '5', 'resend', 'acme', 'acme/acc-1', $1, 'operator')`, dead.String())
	for _, k := range []struct {
		tenant string
		id     pipeline.ID
	}{{"acme", dead}, {"beta", other}} {
		exec(t, pool, `INSERT INTO idempotency_keys (tenant, key, route, request_hash, command_id, response_status, response_headers, response_body)
			VALUES ($1, 'shared-key', 'POST /v1/accounts/{id}/deposits', '\x00', $2, 202, '{}', '')`, k.tenant, k.id.String())
	}

	tr, err := trace.Find(ctx, pool, "payments/evt_7", "")
	if err != nil {
		t.Fatal(err)
	}
	if tr.QueryKind != "provider-event" || tr.Inbound == nil || tr.Inbound.Deliveries != 3 || tr.Command.CommandID != waiting.String() ||
		tr.Outbox == nil || tr.Outbox.Shard != 2 || tr.Dead != nil || tr.Key != nil {
		t.Errorf("provider event: %+v", tr)
	}
	if steps := tr.Timeline(); len(steps) != 4 || steps[0].Stage != "inbound" || !strings.Contains(steps[2].What, "waiting for a relay") {
		t.Errorf("timeline %+v", steps)
	}

	var amb *trace.AmbiguousError
	if _, err := trace.Find(ctx, pool, "shared-key", ""); !errors.As(err, &amb) || strings.Join(amb.Tenants, ",") != "acme,beta" {
		t.Errorf("a key two tenants used: %v", err)
	}
	tr, err = trace.Find(ctx, pool, "shared-key", "acme")
	if err != nil {
		t.Fatal(err)
	}
	if tr.QueryKind != "idempotency-key" || tr.Command.CommandID != dead.String() || tr.Dead == nil || tr.Dead.Reason != "MESSAGE_TOO_LARGE" ||
		len(tr.Corrections) != 1 || tr.Corrections[0].Action != "resend" {
		t.Errorf("acme's key: %+v", tr)
	}
	for _, q := range []string{"no-such-key", pipeline.NewCommandID().String(), "payments/nothing"} {
		if _, err := trace.Find(ctx, pool, q, ""); !errors.Is(err, trace.ErrNotFound) {
			t.Errorf("%s: %v, want ErrNotFound", q, err)
		}
	}
}
