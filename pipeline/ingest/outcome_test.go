package ingest_test

import (
	"context"
	"encoding/json"
	"net/http"
	"testing"
	"time"

	"github.com/onceflow/onceflow/examples/ledger"
	"github.com/onceflow/onceflow/pipeline"
	"github.com/onceflow/onceflow/pipeline/ingest"
)

// outcomeBody is GET /v1/commands/{id}'s body with its outcome.
type outcomeBody struct {
	commandBody
	Outcome struct {
		Status      string `json:"status"`
		Reason      string `json:"reason"`
		Detail      string `json:"detail"`
		CommandID   string `json:"command_id"`
		AggregateID string `json:"aggregate_id"`
		CommandType string `json:"command_type"`
	} `json:"outcome"`
	Derived []struct {
		commandBody
		CauseCommandID   string `json:"cause_command_id"`
		CauseAggregateID string `json:"cause_aggregate_id"`
	} `json:"derived"`
}

// A transfer's status is its debit's, accepted; its outcome follows the
// credit and the refund: pending while either is, compensated with the
// credit's reason once the refund is applied, with both listed under it
// with their own statuses. ?wait=&for=outcome waits for all of it, and
// ?wait= alone for the debit, as before. A transfer whose credit lands is
// completed.
func TestCommandOutcomeOverGET(t *testing.T) {
	t.Parallel()
	pool, _ := ledgerPool(t)
	s := startServer(t, pool, ingest.Config{})
	key := tenant(t, pool, "acme")
	get := func(id, query string) outcomeBody {
		t.Helper()
		r := s.do(t, req{method: http.MethodGet, path: "/v1/commands/" + id + query, apiKey: key})
		var b outcomeBody
		if err := json.Unmarshal(r.Body, &b); r.Status != http.StatusOK || err != nil {
			t.Fatalf("%s: %v", r, err)
		}
		return b
	}
	idText := acceptedID(t, s.do(t, req{path: "/v1/transfers", apiKey: key, idemKey: "t1",
		body: `{"transfer_id":"t1","from":"a","to":"nobody","amount":5}`}))
	debit, _ := pipeline.ParseID(idText)
	credit := ledger.CreditCommandID("acme/a", debit, "t1")
	refund := ledger.RefundCommandID(credit)

	if b := get(idText, ""); b.Status != "pending" || b.Outcome.Status != "pending" || len(b.Derived) != 0 {
		t.Fatalf("accepted: %+v, want pending and nothing derived", b)
	}
	if r := s.do(t, req{method: http.MethodGet, path: "/v1/commands/" + idText + "?for=all", apiKey: key}); r.Status != http.StatusUnprocessableEntity {
		t.Errorf("?for=all: %s, want 422", r)
	}
	done := make(chan outcomeBody, 1)
	go func() {
		r, err := s.try(context.Background(), req{method: http.MethodGet, path: "/v1/commands/" + idText + "?wait=30s&for=outcome", apiKey: key})
		if err != nil {
			t.Error(err)
		}
		var b outcomeBody
		json.Unmarshal(r.Body, &b)
		done <- b
	}()

	debited := event("acme", "a", debit, 0, time.Now(), ledger.TransferDebited{TransferID: "t1", To: "nobody", Amount: 5})
	debited.Derived = []pipeline.CommandRef{{ID: credit, AggregateID: "acme/nobody", Type: "CreditTransfer"}}
	project(t, pool, debited)
	b := get(idText, "?wait=5s")
	if b.Status != "accepted" || b.Outcome.Status != "pending" || len(b.Derived) != 1 || b.Derived[0].CommandID != credit.String() ||
		b.Derived[0].Status != "pending" || b.Derived[0].CauseCommandID != idText || b.Derived[0].CauseAggregateID != "acme/a" {
		t.Fatalf("debited: %+v, want accepted, its credit pending", b)
	}
	refused := event("acme", "nobody", credit, 0, time.Now(), pipeline.CommandRejected{CommandType: "CreditTransfer", Reason: ledger.ReasonUnknownAccount, Detail: "account does not exist"})
	refused.Derived = []pipeline.CommandRef{{ID: refund, AggregateID: "acme/a", Type: "RefundTransfer"}}
	project(t, pool, refused)
	if b := get(idText, "?wait=1s&for=outcome"); b.Outcome.Status != "pending" || len(b.Derived) != 2 || b.Derived[1].Status != "pending" {
		t.Fatalf("credit refused, refund pending: %+v, want the outcome pending after the wait", b)
	}
	select {
	case b := <-done:
		t.Fatalf("the wait for the outcome answered before the refund: %+v", b)
	default:
	}
	project(t, pool, event("acme", "a", refund, 0, time.Now(), ledger.TransferRefunded{TransferID: "t1", To: "nobody", Amount: 5, Reason: ledger.ReasonUnknownAccount}))
	select {
	case b = <-done:
	case <-time.After(20 * time.Second):
		t.Fatal("the wait for the outcome did not answer once the refund was applied")
	}
	o := b.Outcome
	if b.Status != "accepted" || o.Status != "compensated" || o.Reason != ledger.ReasonUnknownAccount || o.Detail != "account does not exist" ||
		o.CommandID != credit.String() || o.AggregateID != "acme/nobody" || o.CommandType != "CreditTransfer" {
		t.Errorf("refunded: status %s, outcome %+v; want accepted, compensated by the credit's refusal", b.Status, o)
	}
	if len(b.Derived) != 2 || b.Derived[0].Status != "rejected" || b.Derived[0].Reason != ledger.ReasonUnknownAccount ||
		b.Derived[1].CommandID != refund.String() || b.Derived[1].Status != "accepted" || b.Derived[1].CommandType != "RefundTransfer" ||
		b.Derived[1].CauseCommandID != credit.String() || len(b.Derived[1].EventIDs) != 1 {
		t.Errorf("refunded: derived %+v, want the credit rejected, then the refund accepted", b.Derived)
	}

	// A transfer whose credit lands.
	idText = acceptedID(t, s.do(t, req{path: "/v1/transfers", apiKey: key, idemKey: "t2",
		body: `{"transfer_id":"t2","from":"a","to":"b","amount":1}`}))
	debit, _ = pipeline.ParseID(idText)
	credit = ledger.CreditCommandID("acme/a", debit, "t2")
	debited = event("acme", "a", debit, 0, time.Now(), ledger.TransferDebited{TransferID: "t2", To: "b", Amount: 1})
	debited.Derived = []pipeline.CommandRef{{ID: credit, AggregateID: "acme/b", Type: "CreditTransfer"}}
	project(t, pool, debited, event("acme", "b", credit, 0, time.Now(), ledger.TransferCredited{TransferID: "t2", From: "a", Amount: 1}))
	if b := get(idText, "?wait=5s&for=outcome"); b.Outcome.Status != "completed" || b.Outcome.Reason != "" || len(b.Derived) != 1 || b.Derived[0].Status != "accepted" {
		t.Errorf("credited: %+v, want completed", b)
	}
}
