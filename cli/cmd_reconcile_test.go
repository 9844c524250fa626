package cli_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/onceflow/onceflow/pipeline"
	"github.com/onceflow/onceflow/pipeline/pipelinetest"
	"github.com/onceflow/onceflow/pipeline/reconcile"
)

// `onceflow reconcile` over a real broker and database: a poison command
// in the DLQ and an outbox row the broker refused are found and reported
// (no authority decides them); with -resend the operator decides, and
// both go back into the outbox once, under their command ids, audited; a
// third run finds nothing.
func TestReconcileCommand(t *testing.T) {
	t.Parallel()
	e := newCLIEnv(t)
	pool, url := pipelinetest.Pool(t, ledgerMigrations)
	e.env["DATABASE_URL"] = url
	ctx := context.Background()
	e.processor(buggy())
	out, err := e.run("produce", "-aggregate", "acme/acc-1", "-type", "Deposit", `{"amount":666}`)
	if err != nil {
		t.Fatalf("produce: %v\n%s", err, out)
	}
	poison := producedID.FindStringSubmatch(out)[1]
	dead := pipeline.NewCommandID()
	if _, err := pool.Exec(ctx, `INSERT INTO outbox_dead (id, shard, topic, key, value, headers, created_at, reason, detail)
		VALUES (99, 1, $1, 'acme/acc-2', '\x00', $2::jsonb, now(), 'MESSAGE_TOO_LARGE', 'too large')`, e.topics.Commands(),
		fmt.Sprintf(`{"command-id":%q,"tenant":"acme","command-type":"Deposit"}`, dead)); err != nil {
		t.Fatal(err)
	}
	pipelinetest.Eventually(t, 30*time.Second, func() error {
		out, err = e.run("reconcile")
		if err != nil {
			return err
		}
		if !strings.Contains(out, "2 found: 0 corrected, 2 reported, 0 failed") {
			return fmt.Errorf("reconcile:\n%s", out)
		}
		return nil
	})
	for _, want := range []string{"outbox-dead", "99", "MESSAGE_TOO_LARGE", "dlq", poison, "decider-panic", "no authority"} {
		if !strings.Contains(out, want) {
			t.Errorf("the report does not show %q:\n%s", want, out)
		}
	}

	out, err = e.run("reconcile", "-resend", "outbox-dead,dlq", "-json")
	if err != nil {
		t.Fatalf("reconcile -resend: %v\n%s", err, out)
	}
	var rep reconcile.Report
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("%v:\n%s", err, out)
	}
	sent := map[string]bool{}
	for _, f := range rep.Findings {
		sent[f.CorrectionID] = f.Action == reconcile.Resend
	}
	if rep.Corrected != 2 || !sent[poison] || !sent[dead.String()] {
		t.Errorf("reconcile -resend: %+v, want both resent under their ids", rep)
	}
	var outbox, audits, deadRows int
	if err := pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM outbox WHERE headers->>'command-id' = ANY($1)),
		(SELECT count(*) FROM audit_log WHERE event_type = 'onceflow.Reconciled'), (SELECT count(*) FROM outbox_dead)`,
		[]string{poison, dead.String()}).Scan(&outbox, &audits, &deadRows); err != nil {
		t.Fatal(err)
	}
	if outbox != 2 || audits != 2 || deadRows != 0 {
		t.Errorf("outbox rows %d, audit rows %d, outbox_dead rows %d; want 2, 2, 0", outbox, audits, deadRows)
	}
	if out, err = e.run("reconcile", "-resend", "outbox-dead,dlq"); err != nil || !strings.Contains(out, "0 found") {
		t.Errorf("third run: %v\n%s", err, out)
	}
	if _, err := e.run("reconcile", "-resend", "pending"); err == nil || !strings.Contains(err.Error(), "only outbox-dead and dlq") {
		t.Errorf("-resend pending: %v", err)
	}
}

// With ONCEFLOW_RECONCILE_INTERVAL the relay component reconciles on its
// own: an outbox_dead row shows in its /metrics as a finding.
func TestRelayReconcilesPeriodically(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	brokers := pipelinetest.Broker(t).Addrs()
	pool, url := pipelinetest.Pool(t, ledgerMigrations)
	if _, err := pool.Exec(ctx, `INSERT INTO outbox_dead (id, shard, topic, key, value, headers, created_at, reason, detail)
		VALUES (3, 1, 'ledger.commands', 'acme/acc-9', '\x00', '{"command-id":"01a22a95-9953-700c-9451-6b2b32eab461"}', now(), 'MESSAGE_TOO_LARGE', 'x')`); err != nil {
		t.Fatal(err)
	}
	env := map[string]string{"DATABASE_URL": url, "KAFKA_BROKERS": brokers[0], "ONCEFLOW_PARTITIONS": "2",
		"ONCEFLOW_RECONCILE_INTERVAL": "200ms", "ADMIN_ADDR": fmt.Sprintf("127.0.0.1:%d", pipelinetest.FreePort(t)), "LOG_LEVEL": "error"}
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- run(runCtx, []string{"relay"}, func(k string) string { return env[k] }, io.Discard) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("relay: %v", err)
		}
	}()
	pipelinetest.Eventually(t, 30*time.Second, func() error {
		resp, err := http.Get("http://" + env["ADMIN_ADDR"] + "/metrics")
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		if !strings.Contains(string(b), `onceflow_reconcile_findings{kind="outbox-dead"} 1`) {
			return fmt.Errorf("no outbox-dead finding on /metrics yet")
		}
		return nil
	})
}
