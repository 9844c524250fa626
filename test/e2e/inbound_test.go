package e2e

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/onceflow/onceflow/pipeline/ingest"
	"github.com/onceflow/onceflow/pipeline/pipelinetest"
)

var inboundSecret = "whsec_" + base64.StdEncoding.EncodeToString([]byte("e2e-inbound-secret-0123456789abc"))

const inboundProviders = `{"providers": [{"name": "payments", "scheme": "standard-webhooks", "secrets_env": "PAYMENTS_SECRETS",
	"tenant": "acme", "aggregate_id": "/data/account_id",
	"events": {
		"account.opened":    {"command": "OpenAccount", "fields": {"currency": "/data/currency"}},
		"payment.succeeded": {"command": "Deposit", "fields": {"amount": "/data/amount"}, "precedence": 2},
		"payment.failed":    {"command": "Withdraw", "fields": {"amount": "/data/amount"}, "precedence": 1}}}]}`

// deliverInbound sends one signed delivery (signed now, as a provider signs
// every attempt) and returns its status and answer.
func deliverInbound(ctx context.Context, base, id, typ string, data map[string]any) (int, ingest.InboundAnswer, error) {
	body, _ := json.Marshal(map[string]any{"type": typ, "data": data})
	h, err := ingest.SignStandardWebhooks(inboundSecret, id, time.Now(), body)
	if err != nil {
		return 0, ingest.InboundAnswer{}, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/inbound/payments", bytes.NewReader(body))
	if err != nil {
		return 0, ingest.InboundAnswer{}, err
	}
	req.Header = h
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, ingest.InboundAnswer{}, err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var a ingest.InboundAnswer
	if resp.StatusCode == http.StatusOK {
		if err := json.Unmarshal(b, &a); err != nil {
			return resp.StatusCode, a, err
		}
	}
	return resp.StatusCode, a, nil
}

// An ingest process killed (SIGKILL) after it stored events and before it
// answered their deliveries: the provider delivers them again, to another
// ingest process, and each event is one command, one deposit in the
// balance. The events held at the crash point were committed (their rows
// are there before the kill) and never answered.
func TestInboundCrashBetweenStoringAndAnswering(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	dir := t.TempDir()
	cfgPath := filepath.Join(dir, "providers.json")
	if err := os.WriteFile(cfgPath, []byte(inboundProviders), 0o600); err != nil {
		t.Fatal(err)
	}
	d := deployWith(t, ctx, map[string]string{"ONCEFLOW_INBOUND_CONFIG": cfgPath, "PAYMENTS_SECRETS": inboundSecret})
	held, err := d.StartComponent(ctx, "ingest", "ingest-held", map[string]string{ingest.InboundHoldEnv: "held-"})
	if err != nil {
		t.Fatal(err)
	}
	main := d.comps["ingest"].HTTP
	if status, a, err := deliverInbound(ctx, main, "open-1", "account.opened", map[string]any{"account_id": "in-1", "currency": "EUR"}); err != nil || status != 200 || a.Status != "enqueued" {
		t.Fatalf("account.opened: %d %+v %v", status, a, err)
	}

	// Five events answered by the process that will die, five held after
	// their commit; the held deliveries are in flight when it is killed.
	amounts := map[string]int64{}
	for i := range 5 {
		id := fmt.Sprintf("ok-%d", i)
		amounts[id] = int64(10 + i)
		if status, a, err := deliverInbound(ctx, held.HTTP, id, "payment.succeeded", map[string]any{"account_id": "in-1", "amount": amounts[id]}); err != nil || status != 200 || a.Status != "enqueued" {
			t.Fatalf("%s: %d %+v %v", id, status, a, err)
		}
	}
	var wg sync.WaitGroup
	for i := range 5 {
		id := fmt.Sprintf("held-%d", i)
		amount := int64(100 * (i + 1))
		amounts[id] = amount // written here only: the goroutines do not read the map
		wg.Add(1)
		go func() {
			defer wg.Done()
			status, _, err := deliverInbound(ctx, held.HTTP, id, "payment.succeeded", map[string]any{"account_id": "in-1", "amount": amount})
			if err == nil {
				t.Errorf("%s: answered %d by a process that should have died first", id, status)
			}
		}()
	}
	pipelinetest.Eventually(t, 30*time.Second, func() error {
		var n int
		d.pool.QueryRow(ctx, `SELECT count(*) FROM inbound_events WHERE event_id LIKE 'held-%' AND status = 'enqueued'`).Scan(&n)
		if n < 5 {
			return fmt.Errorf("%d of 5 held events committed", n)
		}
		return nil
	})
	held.Kill()
	wg.Wait()

	// The provider delivers everything again (ok-* too: their answers
	// could have been lost as well), twice, to the surviving process.
	for range 2 {
		for id, amount := range amounts {
			status, a, err := deliverInbound(ctx, main, id, "payment.succeeded", map[string]any{"account_id": "in-1", "amount": amount})
			if err != nil || status != 200 || !a.Duplicate || a.Status != "enqueued" || a.CommandID != ingest.InboundCommandID("payments", id).String() {
				t.Errorf("%s again: %d %+v %v; want a duplicate of the enqueued event", id, status, a, err)
			}
		}
	}
	var commands, deliveries int
	if err := d.pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM command_status WHERE command_type = 'Deposit'),
		(SELECT sum(deliveries) FROM inbound_events WHERE event_type = 'payment.succeeded')`).Scan(&commands, &deliveries); err != nil {
		t.Fatal(err)
	}
	if commands != len(amounts) || deliveries != 3*len(amounts) {
		t.Fatalf("%d deposit commands and %d deliveries counted for %d events, want %d and %d", commands, deliveries, len(amounts), len(amounts), 3*len(amounts))
	}
	var want int64
	for _, a := range amounts {
		want += a
	}
	pipelinetest.Eventually(t, 90*time.Second, func() error {
		acc, err := d.client.Account(ctx, "in-1")
		if err != nil {
			return err
		}
		if acc.Balance != want {
			return fmt.Errorf("balance %d, want %d", acc.Balance, want)
		}
		return nil
	})
	// A late failure of a payment that succeeded changes nothing.
	if status, a, err := deliverInbound(ctx, main, "fail-late", "payment.failed", map[string]any{"account_id": "in-1", "amount": 5}); err != nil || status != 200 || a.Status != "superseded" {
		t.Fatalf("late payment.failed: %d %+v %v; want superseded", status, a, err)
	}
}
