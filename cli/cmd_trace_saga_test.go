package cli_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/onceflow/onceflow"
	"github.com/onceflow/onceflow/examples/ledger"
	"github.com/onceflow/onceflow/examples/ledger/ledgerapp"
	"github.com/onceflow/onceflow/onceflowtest"
	"github.com/onceflow/onceflow/pipeline/apiclient"
	"github.com/onceflow/onceflow/pipeline/ingest"
	"github.com/onceflow/onceflow/pipeline/kafka"
	"github.com/onceflow/onceflow/pipeline/pipelinetest"
	"github.com/onceflow/onceflow/pipeline/trace"
)

// `onceflow trace` of a transfer to an unknown account, from its
// Idempotency-Key, follows the debit to the commands it led to (issue
// #43): the credit, rejected (unknown_account), and the refund, accepted,
// each with its status, its event on the events topic and the projector's
// inbox row, then the outcome of the whole, compensated.
func TestTraceFollowsDerivedCommands(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	brokers := pipelinetest.Broker(t).Addrs()
	pool, url := pipelinetest.Pool(t, ledgerMigrations)
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	a, _ := onceflowtest.Components(t, onceflow.RunConfig{
		Config: onceflow.Config{
			Domains: []*onceflow.Domain{ledgerapp.Domain()}, Kafka: kafka.Config{Brokers: brokers, Logger: logger},
			Topics: kafka.Topics{Partitions: 2}, DatabaseURL: url, Logger: logger,
		},
		Components: onceflow.Components{Ingest: true, Relay: true, Processor: true, Projector: true},
	})
	key := ingest.NewAPIKey()
	if err := ingest.CreateAPIKey(ctx, pool, "acme", "test", key); err != nil {
		t.Fatal(err)
	}
	cl := ledgerapp.Client{Client: &apiclient.Client{BaseURL: "http://" + a.HTTP, APIKey: key}}
	if _, _, err := cl.OpenAccount(ctx, "saga-open", "a", "EUR"); err != nil {
		t.Fatal(err)
	}
	if _, _, err := cl.Deposit(ctx, "saga-dep", "a", 100); err != nil {
		t.Fatal(err)
	}
	tr, _, err := cl.Transfer(ctx, "saga-transfer", "t1", "a", "nobody", 30)
	if err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	if c, err := cl.WaitOutcome(wctx, tr.CommandID); err != nil || c.Outcome.Status != "compensated" {
		t.Fatalf("transfer: %+v, %v; want compensated", c, err)
	}

	env := map[string]string{"DATABASE_URL": url, "KAFKA_BROKERS": brokers[0], "ONCEFLOW_PARTITIONS": "2"}
	var out bytes.Buffer
	if err := run(ctx, []string{"trace", "-json", "saga-transfer"}, func(k string) string { return env[k] }, &out); err != nil {
		t.Fatalf("trace: %v\n%s", err, out.String())
	}
	var got struct {
		trace.Trace
		Timeline []trace.Step `json:"timeline"`
	}
	if err := json.Unmarshal(out.Bytes(), &got); err != nil {
		t.Fatalf("%v:\n%s", err, out.String())
	}
	if got.Command.CommandID != tr.CommandID || got.Command.Status != "accepted" || len(got.Events) != 1 || got.Events[0].EventType != "TransferDebited" {
		t.Errorf("the debit: %+v, events %+v", got.Command, got.Events)
	}
	d := got.Derived
	if len(d) != 2 {
		t.Fatalf("derived %+v, want the credit and the refund", d)
	}
	type want struct{ cmdType, status, reason, cause, event string }
	for i, w := range []want{
		{"CreditTransfer", "rejected", ledger.ReasonUnknownAccount, tr.CommandID, "CommandRejected"},
		{"RefundTransfer", "accepted", "", d[0].CommandID, "TransferRefunded"},
	} {
		c := d[i]
		if c.CommandType != w.cmdType || c.Status != w.status || c.Reason != w.reason || c.CauseCommandID != w.cause ||
			len(c.Events) != 1 || c.Events[0].EventType != w.event || c.Events[0].Position == nil ||
			c.Events[0].Position.Topic != "ledger.events" || len(c.Events[0].Inbox) != 1 {
			t.Errorf("derived %d: %+v, want %+v with its event on ledger.events and applied", i, c, w)
		}
	}
	if o := got.Outcome; o.Status != "compensated" || o.Reason != ledger.ReasonUnknownAccount || o.CommandID != d[0].CommandID {
		t.Errorf("outcome %+v, want compensated by the credit's refusal", o)
	}
	var stages []string
	for _, s := range got.Timeline {
		stages = append(stages, s.Stage)
	}
	const path = "key command shipped event consumers inbox status derived event inbox status derived event inbox status outcome"
	if s := strings.Join(stages, " "); s != path {
		t.Errorf("timeline %q, want %q", s, path)
	}

	out.Reset()
	if err := run(ctx, []string{"trace", "saga-transfer"}, func(k string) string { return env[k] }, &out); err != nil {
		t.Fatalf("trace: %v\n%s", err, out.String())
	}
	for _, w := range []string{"TransferDebited", "CreditTransfer " + d[0].CommandID + " for acme/nobody, sent by " + tr.CommandID,
		"rejected (unknown_account)", "RefundTransfer " + d[1].CommandID + " for acme/a", "TransferRefunded",
		"compensated: CreditTransfer " + d[0].CommandID + " of acme/nobody refused (unknown_account)"} {
		if !strings.Contains(out.String(), w) {
			t.Errorf("trace output has no %q:\n%s", w, out.String())
		}
	}
	t.Logf("trace:\n%s", out.String())
}
