package ledgerapp_test

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/onceflow/onceflow"
	"github.com/onceflow/onceflow/examples/ledger"
	"github.com/onceflow/onceflow/examples/ledger/accounts"
	"github.com/onceflow/onceflow/examples/ledger/ledgerapp"
	"github.com/onceflow/onceflow/onceflowtest"
	"github.com/onceflow/onceflow/pipeline/apiclient"
	"github.com/onceflow/onceflow/pipeline/ingest"
	"github.com/onceflow/onceflow/pipeline/kafka"
	"github.com/onceflow/onceflow/pipeline/pipelinetest"
	"github.com/onceflow/onceflow/pipeline/postgres"
)

// A client reads how the transfer it started ended (issue #43): to an
// unknown account, its debit is accepted, its credit refused and the
// money refunded, so the outcome is compensated with the credit's reason
// and the balances are as they were; to an open account, completed. Both
// list the commands the transfer led to with their own statuses, and the
// transfer's own status stays its debit's, accepted.
func TestTransferOutcome(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	brokers := pipelinetest.Broker(t).Addrs()
	pool, url := pipelinetest.Pool(t, postgres.Migrations{Name: ledgerapp.Name, FS: accounts.Migrations})
	logger := slog.New(slog.DiscardHandler)
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
	// Both accounts open before any transfer: a credit goes to its account
	// on its own way (the processor's), which may overtake a command still
	// in the outbox.
	for _, acc := range []string{"a", "b"} {
		opened, _, err := cl.OpenAccount(ctx, "open-"+acc, acc, "EUR")
		if err != nil {
			t.Fatal(err)
		}
		if c, err := cl.WaitCommand(ctx, opened.CommandID); err != nil || c.Status != "accepted" {
			t.Fatalf("open %s: %+v, %v", acc, c, err)
		}
	}
	dep, _, err := cl.Deposit(ctx, "dep-a", "a", 100)
	if err != nil {
		t.Fatal(err)
	}
	if c, err := cl.WaitOutcome(ctx, dep.CommandID); err != nil || c.Status != "accepted" || c.Outcome.Status != "completed" || len(c.Derived) != 0 {
		t.Fatalf("deposit: %+v, %v; want accepted and completed, nothing derived", c, err)
	}

	tr, _, err := cl.Transfer(ctx, "t-nobody", "t1", "a", "nobody", 30)
	if err != nil {
		t.Fatal(err)
	}
	c, err := cl.WaitOutcome(ctx, tr.CommandID)
	if err != nil {
		t.Fatal(err)
	}
	o := c.Outcome
	if c.Status != "accepted" || o.Status != "compensated" || o.Reason != ledger.ReasonUnknownAccount || o.CommandType != "CreditTransfer" ||
		o.AggregateID != "acme/nobody" || o.Detail == "" {
		t.Errorf("transfer to an unknown account: status %s, outcome %+v; want accepted, compensated by the credit's refusal (unknown_account)", c.Status, o)
	}
	if len(c.Derived) != 2 || c.Derived[0].CommandType != "CreditTransfer" || c.Derived[0].Status != "rejected" ||
		c.Derived[0].Reason != ledger.ReasonUnknownAccount || c.Derived[0].CauseCommandID != tr.CommandID ||
		c.Derived[1].CommandType != "RefundTransfer" || c.Derived[1].Status != "accepted" || c.Derived[1].AggregateID != "acme/a" ||
		c.Derived[1].CauseCommandID != c.Derived[0].CommandID {
		t.Errorf("transfer to an unknown account: derived %+v; want its credit rejected, then its refund accepted", c.Derived)
	}
	if acc, err := cl.Account(ctx, "a"); err != nil || acc.Balance != 100 {
		t.Errorf("a after the refund: %+v, %v; want its 100 back", acc, err)
	}

	tr, _, err = cl.Transfer(ctx, "t-b", "t2", "a", "b", 40)
	if err != nil {
		t.Fatal(err)
	}
	if c, err = cl.WaitOutcome(ctx, tr.CommandID); err != nil || c.Outcome.Status != "completed" || c.Outcome.Reason != "" ||
		len(c.Derived) != 1 || c.Derived[0].Status != "accepted" || c.Derived[0].AggregateID != "acme/b" {
		t.Errorf("transfer to b: %+v, %v; want completed, its credit accepted", c, err)
	}
	for acc, want := range map[string]int64{"a": 60, "b": 40} {
		if got, err := cl.Account(ctx, acc); err != nil || got.Balance != want {
			t.Errorf("%s: %+v, %v; want a balance of %d", acc, got, err, want)
		}
	}
}
