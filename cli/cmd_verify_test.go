package cli_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/onceflow/onceflow"
	"github.com/onceflow/onceflow/examples/ledger/ledgerapp"
	"github.com/onceflow/onceflow/onceflowtest"
	"github.com/onceflow/onceflow/pipeline"
	"github.com/onceflow/onceflow/pipeline/apiclient"
	"github.com/onceflow/onceflow/pipeline/ingest"
	"github.com/onceflow/onceflow/pipeline/jobs"
	"github.com/onceflow/onceflow/pipeline/kafka"
	"github.com/onceflow/onceflow/pipeline/pipelinetest"
	"github.com/onceflow/onceflow/pipeline/verify"
	"github.com/onceflow/onceflow/pipeline/webhooks"
	"github.com/onceflow/onceflow/pipeline/webhooks/webhookstest"
)

// `onceflow verify` over a real pipeline (every component in one process,
// the embedded broker, a real Postgres, a webhook receiver): after
// accounts, deposits and a transfer (a command a decision sends), it finds
// nothing and exits 0. Then the pipeline's records are broken on purpose,
// each on another id, and it names each with its stage and exits
// non-zero: an inbox row deleted (lost at the projector), an inbox row
// written twice (doubled at the projector), an event produced again under
// a new offset (a duplicate record on the events topic, which the
// projector absorbs: not a doubled effect), a command accepted whose
// outbox row is gone before a relay shipped it (lost at the relay), and
// a webhook delivery's job run twice under its key (doubled at the worker).
func TestVerify(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	brokers := pipelinetest.Broker(t).Addrs()
	pool, url := pipelinetest.Pool(t, ledgerMigrations)
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	sub, _, err := webhooks.Create(ctx, pool, "acme", "verify-sub", "http://127.0.0.1:1/placeholder", []string{"Deposited"})
	if err != nil {
		t.Fatal(err)
	}
	receiver := webhookstest.New([]string{sub.Secret}, nil)
	defer receiver.Close()
	if _, err := pool.Exec(ctx, `UPDATE webhook_subscriptions SET url = $1`, receiver.URL); err != nil {
		t.Fatal(err)
	}
	a, _ := onceflowtest.Components(t, onceflow.RunConfig{
		Config: onceflow.Config{
			Domains: []*onceflow.Domain{ledgerapp.Domain()}, Kafka: kafka.Config{Brokers: brokers, Logger: logger},
			Topics: kafka.Topics{Partitions: 2}, DatabaseURL: url, Logger: logger,
		},
		Components: onceflow.All,
		Worker:     jobs.Config{FetchPollInterval: 100 * time.Millisecond},
		Webhooks:   webhooks.Config{Allow: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}},
	})
	key := ingest.NewAPIKey()
	if err := ingest.CreateAPIKey(ctx, pool, "acme", "test", key); err != nil {
		t.Fatal(err)
	}
	cl := &ledgerapp.Client{Client: &apiclient.Client{BaseURL: "http://" + a.HTTP, APIKey: key}}
	var ids []string
	send := func(acc apiclient.Accepted, _ *apiclient.Response, err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, acc.CommandID)
	}
	send(cl.OpenAccount(ctx, "v-open-a", "acc-a", "EUR"))
	send(cl.OpenAccount(ctx, "v-open-b", "acc-b", "EUR"))
	for i := range 4 {
		send(cl.Deposit(ctx, fmt.Sprintf("v-dep-%d", i), "acc-a", 100))
	}
	send(cl.Transfer(ctx, "v-transfer", "tr-1", "acc-a", "acc-b", 50))
	wctx, wcancel := context.WithTimeout(ctx, 60*time.Second)
	defer wcancel()
	for _, id := range ids {
		if cmd, err := cl.WaitOutcome(wctx, id); err != nil || cmd.Status != "accepted" {
			t.Fatalf("command %s: %+v, %v", id, cmd, err)
		}
	}
	// Every deposit's delivery acknowledged (the subscription wants
	// Deposited only).
	pipelinetest.Eventually(t, 30*time.Second, func() error {
		var n int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM webhook_deliveries WHERE status = 'delivered'`).Scan(&n); err != nil || n != 4 {
			return fmt.Errorf("%d deliveries delivered (%v), want 4", n, err)
		}
		return nil
	})

	env := map[string]string{"DATABASE_URL": url, "KAFKA_BROKERS": brokers[0], "ONCEFLOW_PARTITIONS": "2"}
	verifyJSON := func() (verify.Report, error) {
		t.Helper()
		var out bytes.Buffer
		err := run(ctx, []string{"verify", "-since", "10m", "-json"}, func(k string) string { return env[k] }, &out)
		var rep verify.Report
		if jerr := json.Unmarshal(out.Bytes(), &rep); jerr != nil {
			t.Fatalf("verify -json: %v (%v):\n%s", jerr, err, out.String())
		}
		return rep, err
	}
	rep, err := verifyJSON()
	if err != nil || len(rep.Findings) != 0 {
		t.Fatalf("a clean pipeline: %v, findings %+v, not checked %v", err, rep.Findings, rep.NotChecked)
	}
	checked := map[string]int{}
	for _, c := range rep.Checked {
		checked[c.What] = c.Count
	}
	// 7 commands sent, and the transfer's credit its decision sent.
	if n := checked["commands on the commands topics (read_committed, by aggregate and command id)"]; n != 8 {
		t.Errorf("checked %+v, want 8 commands on the commands topic", rep.Checked)
	}

	// Break the records, each on an id of its own.
	var lostEvent, doubledEvent, copiedEvent string
	rows, err := pool.Query(ctx, `SELECT event_id::text FROM audit_log WHERE event_type = 'Deposited' ORDER BY occurred_at, event_id`)
	if err != nil {
		t.Fatal(err)
	}
	var deposited []string
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			t.Fatal(err)
		}
		deposited = append(deposited, id)
	}
	if rows.Err() != nil || len(deposited) < 4 {
		t.Fatalf("Deposited events %v, %v", deposited, rows.Err())
	}
	lostEvent, doubledEvent, copiedEvent = deposited[0], deposited[1], deposited[2]
	exec := func(sql string, args ...any) {
		t.Helper()
		if _, err := pool.Exec(ctx, sql, args...); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	exec(`DELETE FROM inbox WHERE event_id = $1 AND consumer = 'onceflow-projector'`, lostEvent)
	exec(`INSERT INTO inbox (consumer, event_id, received_at) VALUES ('onceflow-projector', $1, now())`, doubledEvent)
	kc := pipelinetest.Client(t, brokers)
	recs, err := kafka.ReadTopic(ctx, kc, "ledger.events", true)
	if err != nil {
		t.Fatal(err)
	}
	var copied *kgo.Record
	for _, r := range recs {
		for _, h := range r.Headers {
			if h.Key == pipeline.HeaderEventID && string(h.Value) == copiedEvent {
				copied = &kgo.Record{Topic: r.Topic, Partition: r.Partition, Key: r.Key, Value: r.Value, Headers: r.Headers}
			}
		}
	}
	if copied == nil {
		t.Fatalf("event %s is not on ledger.events", copiedEvent)
	}
	pc := pipelinetest.Client(t, brokers, kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err := pc.ProduceSync(ctx, copied).FirstErr(); err != nil {
		t.Fatal(err)
	}
	// What ingest commits for a command, without its outbox row: the row
	// deleted before a relay shipped it.
	lostCommand := pipeline.NewCommandID().String()
	exec(`INSERT INTO command_status (command_id, tenant, aggregate_id, command_type, status, ingested) VALUES ($1, 'acme', 'acme/acc-a', 'Deposit', 'pending', true)`, lostCommand)
	exec(`INSERT INTO idempotency_keys (tenant, key, route, request_hash, command_id, response_status, response_headers, response_body)
		VALUES ('acme', 'v-lost', 'POST /v1/accounts/{id}/deposits', '\x00', $1, 202, '{}', '')`, lostCommand)
	// A delivery's job run again under its key, past River's unique key.
	var deliveryKey string
	if err := pool.QueryRow(ctx, `INSERT INTO river_job (args, kind, state, attempt, max_attempts, queue, priority, created_at, scheduled_at, finalized_at)
		SELECT args, kind, 'completed', 1, max_attempts, queue, priority, now(), now(), now() FROM river_job
		WHERE kind = 'webhook_delivery' AND args->>'event_id' = $1 RETURNING args->>'key'`, deposited[3]).Scan(&deliveryKey); err != nil {
		t.Fatal(err)
	}

	rep, err = verifyJSON()
	if err == nil || !strings.Contains(err.Error(), "2 lost, 2 doubled") {
		t.Errorf("verify of the broken records: %v, want 2 lost, 2 doubled", err)
	}
	type found struct{ stage, kind, id string }
	got := map[found]verify.Finding{}
	for _, f := range rep.Findings {
		id := f.EventID
		if f.Kind == verify.Lost && f.Stage == verify.StageRelay {
			id = f.CommandID
		}
		if f.Stage == verify.StageWorker {
			id = f.Key
		}
		got[found{f.Stage, f.Kind, id}] = f
	}
	for _, want := range []found{
		{verify.StageProjector, verify.Lost, lostEvent},
		{verify.StageProjector, verify.Doubled, doubledEvent},
		{verify.StageEvents, verify.DuplicateRecord, copiedEvent},
		{verify.StageRelay, verify.Lost, lostCommand},
		{verify.StageWorker, verify.Doubled, deliveryKey},
	} {
		if _, ok := got[want]; !ok {
			t.Errorf("no finding %+v among %+v", want, rep.Findings)
		}
	}
	if len(rep.Findings) != 5 {
		t.Errorf("%d findings, want 5 (the copied event absorbed by the projector, nothing else): %+v", len(rep.Findings), rep.Findings)
	}
	if f := got[found{verify.StageProjector, verify.Lost, lostEvent}]; f.Consumer != "onceflow-projector" || !strings.Contains(f.LastSeen, "ledger.events partition") {
		t.Errorf("the lost event: %+v, want the projector named and its position", f)
	}

	// The text names the ids; the last run is recorded for the status page.
	var out bytes.Buffer
	if err := run(ctx, []string{"verify", "-since", "10m"}, func(k string) string { return env[k] }, &out); err == nil {
		t.Errorf("verify of the broken records exited 0:\n%s", out.String())
	}
	for _, want := range []string{lostEvent, doubledEvent, copiedEvent, lostCommand, deliveryKey, "2 lost, 2 doubled, 0 pending past 5m0s, 1 duplicate records"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("verify's text has no %q:\n%s", want, out.String())
		}
	}
	last, err := verify.Last(ctx, pool)
	if err != nil || last == nil || last.OK || last.Findings[verify.StageProjector][verify.Lost] != 1 || last.Findings[verify.StageEvents][verify.DuplicateRecord] != 1 {
		t.Errorf("the last recorded run: %+v, %v", last, err)
	}
}
