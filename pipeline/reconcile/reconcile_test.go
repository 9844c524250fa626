package reconcile_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/onceflow/onceflow/pipeline"
	"github.com/onceflow/onceflow/pipeline/pipelinetest"
	"github.com/onceflow/onceflow/pipeline/postgres"
	"github.com/onceflow/onceflow/pipeline/processor"
	"github.com/onceflow/onceflow/pipeline/reconcile"
)

// stuck makes one of each kind on purpose, as the pipeline leaves them:
// a command pending for an hour (shipped, no outcome), an outbox row the
// broker refused for good, a DLQ record with no later outcome, a provider
// event whose command failed, and a webhook delivery's job that ran out of
// attempts with no answer (its call may have been applied).
type stuck struct {
	pending, dead, dlq, inbound, delivered pipeline.ID
	deadID, jobID                          int64
	dlqRecord                              reconcile.DeadLetter
}

func makeStuck(t *testing.T, pool *pgxpool.Pool) stuck {
	t.Helper()
	ctx := context.Background()
	if _, err := postgres.EnsureDailyPartitions(ctx, pool, "idempotency_keys", 2); err != nil {
		t.Fatal(err)
	}
	s := stuck{pending: pipeline.NewCommandID(), dead: pipeline.NewCommandID(), dlq: pipeline.NewCommandID(), inbound: pipeline.NewCommandID(),
		delivered: pipeline.NewCommandID()}
	event, subscription := pipeline.NewCommandID(), pipeline.NewCommandID()
	headers := func(id pipeline.ID, typ string) string {
		b, _ := json.Marshal(map[string]string{"command-id": id.String(), "tenant": "acme", "command-type": typ})
		return string(b)
	}
	for _, q := range []struct {
		sql  string
		args []any
	}{
		{`INSERT INTO command_status (command_id, tenant, aggregate_id, command_type, status, ingested, created_at)
			VALUES ($1, 'acme', 'acme/acc-1', 'Deposit', 'pending', true, now() - interval '1 hour')`, []any{s.pending.String()}},
		{`INSERT INTO idempotency_keys (tenant, key, route, request_hash, command_id, response_status, response_headers, response_body)
			VALUES ('acme', 'dep-1', 'POST /v1/accounts/{id}/deposits', '\x00', $1, 202, '{}', '')`, []any{s.pending.String()}},
		{`INSERT INTO outbox_dead (id, shard, topic, key, value, headers, created_at, reason, detail)
			VALUES (7, 3, 'ledger.commands', 'acme/acc-2', '\x0102', $1::jsonb, now() - interval '2 hours', 'MESSAGE_TOO_LARGE', 'too large')`, []any{headers(s.dead, "Deposit")}},
		{`INSERT INTO command_status (command_id, tenant, aggregate_id, command_type, status, ingested, reason)
			VALUES ($1, 'acme', 'acme/acc-2', 'Deposit', 'failed', true, 'MESSAGE_TOO_LARGE')`, []any{s.dead.String()}},
		{`INSERT INTO command_status (command_id, tenant, aggregate_id, command_type, status, ingested, reason)
			VALUES ($1, 'acme', 'acme/acc-3', 'Withdraw', 'failed', false, 'undecodable')`, []any{s.dlq.String()}},
		{`INSERT INTO inbound_events (provider, event_id, event_type, tenant, aggregate_id, status, command_id, command_type, payload)
			VALUES ('payments', 'evt_9', 'payment.succeeded', 'acme', 'acme/acc-4', 'enqueued', $1, 'Deposit', '{}')`, []any{s.inbound.String()}},
		{`INSERT INTO command_status (command_id, tenant, aggregate_id, command_type, status, ingested, reason)
			VALUES ($1, 'acme', 'acme/acc-4', 'Deposit', 'failed', true, 'undecodable')`, []any{s.inbound.String()}},
		{`INSERT INTO audit_log (event_id, tenant, aggregate_id, version, event_type, command_id, payload, occurred_at)
			VALUES ($1, 'acme', 'acme/acc-5', 3, 'Deposited', $2, '{}', now())`, []any{event.String(), s.delivered.String()}},
	} {
		if _, err := pool.Exec(ctx, q.sql, q.args...); err != nil {
			t.Fatalf("%s: %v", q.sql, err)
		}
	}
	if err := pool.QueryRow(ctx, `INSERT INTO river_job (state, attempt, max_attempts, attempted_at, finalized_at, args, kind, errors)
		VALUES ('discarded', 3, 3, now(), now(), $1::jsonb, 'webhook_delivery', ARRAY[$2::jsonb]) RETURNING id`,
		fmt.Sprintf(`{"key":"wh-key-1","tenant":"acme","event_id":%q}`, event),
		`{"at":"2026-12-02T00:00:00Z","attempt":3,"error":"no answer: context deadline exceeded"}`).Scan(&s.jobID); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `INSERT INTO webhook_deliveries (tenant, subscription_id, event_id, event_type, job_id, status, attempts)
		VALUES ('acme', $1, $2, 'Deposited', $3, 'dead', 3)`, subscription.String(), event.String(), s.jobID); err != nil {
		t.Fatal(err)
	}
	s.deadID = 7
	s.dlqRecord = reconcile.DeadLetter{
		Topic: "ledger.commands.dlq", CommandsTopic: "ledger.commands",
		DeadLetter: processor.DeadLetter{Partition: 2, Offset: 41, Time: time.Now().Add(-time.Hour), Key: []byte("acme/acc-3"), Value: []byte{0, 9},
			Headers: []kgo.RecordHeader{{Key: "command-id", Value: []byte(s.dlq.String())}, {Key: "tenant", Value: []byte("acme")}, {Key: "command-type", Value: []byte("Withdraw")}},
			Reason:  "undecodable"},
	}
	return s
}

// authorities answer as the services that know would: the pending
// deposit's payment is known to the provider under its Idempotency-Key,
// the dead row and the DLQ record can go again as they were (the cause was
// fixed), and the provider says its event's payment succeeded, so the
// deposit is made again as a correcting command.
func authorities(asked *sync.Map) map[string]reconcile.Authority {
	note := func(f reconcile.Finding) { asked.Store(f.Kind+" "+f.Key, true) }
	return map[string]reconcile.Authority{
		reconcile.KindPending: reconcile.AuthorityFunc(func(_ context.Context, f reconcile.Finding) (reconcile.Verdict, error) {
			note(f)
			if f.Key != "dep-1" {
				return reconcile.Verdict{}, fmt.Errorf("unknown key %q", f.Key)
			}
			return reconcile.Verdict{Action: reconcile.Command, Reason: "provider: captured", CommandType: "Deposit", Fields: json.RawMessage(`{"amount":5}`)}, nil
		}),
		reconcile.KindOutboxDead: reconcile.AuthorityFunc(func(_ context.Context, f reconcile.Finding) (reconcile.Verdict, error) {
			note(f)
			return reconcile.Verdict{Action: reconcile.Resend, Reason: "broker limit raised"}, nil
		}),
		reconcile.KindDLQ: reconcile.AuthorityFunc(func(_ context.Context, f reconcile.Finding) (reconcile.Verdict, error) {
			note(f)
			return reconcile.Verdict{Action: reconcile.Resend, Reason: "schema fixed"}, nil
		}),
		reconcile.KindJob: reconcile.AuthorityFunc(func(_ context.Context, f reconcile.Finding) (reconcile.Verdict, error) {
			note(f)
			return reconcile.Verdict{Action: reconcile.Resend, Reason: "receiver: never got wh-key-1"}, nil
		}),
		reconcile.KindInbound: reconcile.AuthorityFunc(func(_ context.Context, f reconcile.Finding) (reconcile.Verdict, error) {
			note(f)
			return reconcile.Verdict{Action: reconcile.Command, Reason: "provider: payment succeeded", CommandType: "Deposit", Fields: json.RawMessage(`{"amount":70}`)}, nil
		}),
	}
}

// encode stands for a route's encoder: the fields as the value.
func encode(_ context.Context, commandType, localID string, fields json.RawMessage) (string, []byte, error) {
	if commandType != "Deposit" {
		return "", nil, fmt.Errorf("no route takes %s", commandType)
	}
	return "ledger.commands", append([]byte(localID+":"), fields...), nil
}

// Each stuck kind is found, its authority asked by its key, corrected once
// through a command (the outbox; never a read model), and audited; a
// second run finds nothing. Two reconcilers at once correct nothing twice.
func TestReconcileFindsCorrectsOnceAndAudits(t *testing.T) {
	t.Parallel()
	pool, _ := pipelinetest.Pool(t)
	ctx := context.Background()
	s := makeStuck(t, pool)
	var asked sync.Map
	cfg := reconcile.Config{
		Authorities: authorities(&asked), Encode: encode,
		DeadLetters: func(context.Context) ([]reconcile.DeadLetter, error) {
			return []reconcile.DeadLetter{s.dlqRecord}, nil
		},
	}
	reports := make([]reconcile.Report, 2)
	regs := []*prometheus.Registry{prometheus.NewRegistry(), prometheus.NewRegistry()}
	var wg sync.WaitGroup
	for i := range reports {
		r, err := reconcile.New(cfg, pool, slog.New(slog.DiscardHandler), regs[i])
		if err != nil {
			t.Fatal(err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			var err error
			if reports[i], err = r.Reconcile(ctx); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	if t.Failed() {
		return
	}
	corrected := map[string]reconcile.Finding{}
	for _, rep := range reports {
		if rep.Failed != 0 {
			t.Errorf("report %+v has failures", rep)
		}
		for _, f := range rep.Findings {
			if f.CorrectionID != "" {
				if _, twice := corrected[f.Kind]; twice {
					t.Errorf("%s corrected by both reconcilers", f.Kind)
				}
				corrected[f.Kind] = f
			}
		}
	}
	for _, k := range reconcile.Kinds {
		if _, ok := corrected[k]; !ok {
			t.Errorf("%s: not corrected; reports %+v", k, reports)
		}
	}
	for _, k := range []string{"pending dep-1", "outbox-dead ", "dlq ", "inbound payments/evt_9", "job wh-key-1"} {
		if _, ok := asked.Load(k); !ok {
			t.Errorf("the authority was not asked about %q", k)
		}
	}
	// Resent commands keep their command ids; correcting commands get ids
	// derived from what they correct.
	if corrected[reconcile.KindOutboxDead].CorrectionID != s.dead.String() || corrected[reconcile.KindDLQ].CorrectionID != s.dlq.String() {
		t.Errorf("resends sent %s and %s, want the stuck commands' ids %s and %s",
			corrected[reconcile.KindOutboxDead].CorrectionID, corrected[reconcile.KindDLQ].CorrectionID, s.dead, s.dlq)
	}

	// The outbox has the four commands, once each.
	rows, err := pool.Query(ctx, `SELECT headers->>'command-id', key, value FROM outbox ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for rows.Next() {
		var id string
		var key, value []byte
		if err := rows.Scan(&id, &key, &value); err != nil {
			t.Fatal(err)
		}
		if _, twice := got[id]; twice {
			t.Errorf("command %s in the outbox twice", id)
		}
		got[id] = string(key) + " " + string(value)
	}
	rows.Close()
	want := map[string]string{
		corrected[reconcile.KindPending].CorrectionID: "acme/acc-1 acc-1:{\"amount\":5}",
		s.dead.String(): "acme/acc-2 \x01\x02",
		s.dlq.String():  "acme/acc-3 \x00\x09",
		corrected[reconcile.KindInbound].CorrectionID: "acme/acc-4 acc-4:{\"amount\":70}",
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("outbox %q, want %q", got, want)
	}
	var dead, audits, corrections, pendingCorrections int
	var stuckStatus string
	if err := pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM outbox_dead), (SELECT count(*) FROM audit_log WHERE event_type = 'onceflow.Reconciled'),
		(SELECT count(*) FROM reconcile_corrections),
		(SELECT count(*) FROM command_status WHERE command_id = ANY($1::uuid[]) AND status = 'pending'),
		(SELECT status FROM command_status WHERE command_id = $2)`,
		[]string{corrected[reconcile.KindPending].CorrectionID, corrected[reconcile.KindInbound].CorrectionID}, s.pending.String()).
		Scan(&dead, &audits, &corrections, &pendingCorrections, &stuckStatus); err != nil {
		t.Fatal(err)
	}
	if dead != 0 || audits != 5 || corrections != 5 || pendingCorrections != 2 || stuckStatus != "pending" {
		t.Errorf("outbox_dead %d, audit rows %d, corrections %d, correcting commands pending %d, the stuck command %s; want 0, 5, 5, 2 and still pending (no read model edited)",
			dead, audits, corrections, pendingCorrections, stuckStatus)
	}
	var payload map[string]string
	if err := pool.QueryRow(ctx, `SELECT payload FROM audit_log WHERE aggregate_id = 'acme/acc-4' AND event_type = 'onceflow.Reconciled'`).Scan(&payload); err != nil {
		t.Fatal(err)
	}
	if payload["kind"] != "inbound" || payload["reason"] != "provider: payment succeeded" || payload["key"] != "payments/evt_9" || payload["stuck_command_id"] != s.inbound.String() {
		t.Errorf("audit payload %v", payload)
	}

	// The job is River's again, and its delivery pending: the call goes out
	// again under its Idempotency-Key.
	var jobState, deliveryStatus, jobAggregate string
	if err := pool.QueryRow(ctx, `SELECT (SELECT state::text FROM river_job WHERE id = $1), (SELECT status FROM webhook_deliveries WHERE job_id = $1),
		(SELECT aggregate_id FROM reconcile_corrections WHERE kind = 'job')`, s.jobID).Scan(&jobState, &deliveryStatus, &jobAggregate); err != nil {
		t.Fatal(err)
	}
	if jobState != "available" || deliveryStatus != "pending" || jobAggregate != "acme/acc-5" || corrected[reconcile.KindJob].CorrectionID != "wh-key-1" {
		t.Errorf("job %s, delivery %s, correction of %s as %q; want available, pending, acme/acc-5, wh-key-1", jobState, deliveryStatus, jobAggregate, corrected[reconcile.KindJob].CorrectionID)
	}

	if got := sum(t, regs[0], "onceflow_reconcile_corrections_total") + sum(t, regs[1], "onceflow_reconcile_corrections_total"); got != 5 {
		t.Errorf("onceflow_reconcile_corrections_total %v over both reconcilers, want 5", got)
	}
	reg := prometheus.NewRegistry()
	r, _ := reconcile.New(cfg, pool, slog.New(slog.DiscardHandler), reg)
	again, err := r.Reconcile(ctx)
	if err != nil || len(again.Findings) != 0 {
		t.Errorf("second run: %+v, %v; want nothing found", again, err)
	}
	if got := sum(t, reg, "onceflow_reconcile_findings"); got != 0 || sum(t, reg, "onceflow_reconcile_last_run_timestamp_seconds") == 0 {
		t.Errorf("after the second run: onceflow_reconcile_findings %v, want 0, and a last run's time", got)
	}
}

// Without an authority a finding is reported and left; a dry run asks and
// corrects nothing; an authority's error is the finding's, not the run's.
func TestReconcileReportsWhatNoAuthorityDecides(t *testing.T) {
	t.Parallel()
	pool, _ := pipelinetest.Pool(t)
	ctx := context.Background()
	s := makeStuck(t, pool)
	dlq := func(context.Context) ([]reconcile.DeadLetter, error) { return []reconcile.DeadLetter{s.dlqRecord}, nil }
	var asked sync.Map
	auth := authorities(&asked)
	auth[reconcile.KindPending] = reconcile.AuthorityFunc(func(context.Context, reconcile.Finding) (reconcile.Verdict, error) {
		return reconcile.Verdict{}, fmt.Errorf("provider unreachable")
	})
	for _, c := range []struct {
		name string
		cfg  reconcile.Config
		want reconcile.Report
	}{
		{"no authorities", reconcile.Config{DeadLetters: dlq}, reconcile.Report{Reported: 5}},
		{"dry run", reconcile.Config{DeadLetters: dlq, Authorities: authorities(&asked), DryRun: true, Encode: encode}, reconcile.Report{Reported: 5}},
		{"an authority fails", reconcile.Config{DeadLetters: dlq, Authorities: auth, DryRun: true, Encode: encode}, reconcile.Report{Reported: 4, Failed: 1}},
	} {
		r, err := reconcile.New(c.cfg, pool, slog.New(slog.DiscardHandler), nil)
		if err != nil {
			t.Fatal(err)
		}
		rep, err := r.Reconcile(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if rep.Reported != c.want.Reported || rep.Failed != c.want.Failed || rep.Corrected != 0 || len(rep.Findings) != 5 {
			t.Errorf("%s: %d findings, %d reported, %d failed, %d corrected; want 5, %d, %d, 0", c.name, len(rep.Findings),
				rep.Reported, rep.Failed, rep.Corrected, c.want.Reported, c.want.Failed)
		}
	}
	var outbox, corrections int
	pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM outbox), (SELECT count(*) FROM reconcile_corrections)`).Scan(&outbox, &corrections)
	if outbox != 0 || corrections != 0 {
		t.Errorf("reports wrote %d outbox rows and %d corrections, want none", outbox, corrections)
	}
}

// sum adds up every series of a metric in reg.
func sum(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var total float64
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			total += m.GetCounter().GetValue() + m.GetGauge().GetValue()
		}
	}
	return total
}
