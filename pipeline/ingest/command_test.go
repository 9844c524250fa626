package ingest_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/url"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/onceflow/onceflow/examples/ledger"
	"github.com/onceflow/onceflow/pipeline"
	"github.com/onceflow/onceflow/pipeline/ingest"
	"github.com/onceflow/onceflow/pipeline/projector"
)

// project records events in command_status as the projector does.
func project(t *testing.T, pool *pgxpool.Pool, evs ...pipeline.Event) {
	t.Helper()
	err := pgx.BeginFunc(context.Background(), pool, func(tx pgx.Tx) error {
		_, err := projector.CommandStatus{}.ApplyBatch(context.Background(), tx, evs)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
}

// event is the index-th event of command id on tenant's account local.
func event(tenant, local string, id pipeline.ID, index int, at time.Time, m pipeline.Message) pipeline.Event {
	agg := pipeline.AggregateID(tenant, local)
	return pipeline.Event{ID: pipeline.EventID(agg, id, index), CommandID: id, Tenant: tenant, AggregateID: agg,
		Version: 1, Time: at, Payload: m}
}

// commandBody is GET /v1/commands/{id}'s body.
type commandBody struct {
	CommandID   string   `json:"command_id"`
	Status      string   `json:"status"`
	CommandType string   `json:"command_type"`
	AggregateID string   `json:"aggregate_id"`
	Reason      string   `json:"reason"`
	Detail      string   `json:"detail"`
	EventIDs    []string `json:"event_ids"`
}

func (s *server) command(t *testing.T, key, id, query string) (response, commandBody) {
	t.Helper()
	r := s.do(t, req{method: http.MethodGet, path: "/v1/commands/" + id + query, apiKey: key})
	var b commandBody
	if r.Status == http.StatusOK {
		if err := json.Unmarshal(r.Body, &b); err != nil {
			t.Fatalf("%s: %v", r, err)
		}
	}
	return r, b
}

// A command is its id within its tenant and aggregate. Tenant b producing
// straight to Kafka with a's command id leaves a's command untouched, and
// neither tenant ever reads the other's; a's own producer using the id on
// another account makes a second command of a, which ?aggregate_id=
// selects, while the id alone keeps answering the command ingest accepted
// (its 202's Location), even when the other is dated earlier.
func TestCommandIDsAreScoped(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, _ := ledgerPool(t)
	s := startServer(t, pool, ingest.Config{})
	a, b := tenant(t, pool, "a"), tenant(t, pool, "b")
	idText := acceptedID(t, s.do(t, req{path: "/v1/accounts/acc-1/deposits", apiKey: a, idemKey: "d1", body: `{"amount":5}`}))
	id, err := pipeline.ParseID(idText)
	if err != nil {
		t.Fatal(err)
	}
	earlier := time.Now().Add(-time.Hour)
	project(t, pool,
		event("b", "acc-1", id, 0, time.Now(), ledger.Deposited{Amount: 1}),
		event("a", "acc-2", id, 0, earlier, ledger.Deposited{Amount: 2}))
	missing := s.do(t, req{method: http.MethodGet, path: "/v1/commands/" + pipeline.NewCommandID().String(), apiKey: a})

	if r, c := s.command(t, a, idText, ""); r.Status != 200 || c.Status != "pending" || c.AggregateID != "a/acc-1" {
		t.Errorf("a's command: %s, want ingest's, pending on a/acc-1", r)
	}
	if r, c := s.command(t, a, idText, "?wait=50ms"); r.Status != 200 || c.Status != "pending" || c.AggregateID != "a/acc-1" {
		t.Errorf("a's command, waiting: %s, want ingest's, pending on a/acc-1", r)
	}
	if r, c := s.command(t, a, idText, "?aggregate_id=a/acc-2"); r.Status != 200 || c.Status != "accepted" || c.AggregateID != "a/acc-2" || len(c.EventIDs) != 1 {
		t.Errorf("a's command on acc-2: %s, want accepted with its event", r)
	}
	if r, c := s.command(t, a, idText, "?aggregate_id="+url.QueryEscape("a/acc-1")); r.Status != 200 || c.Status != "pending" {
		t.Errorf("a's command on acc-1 by name: %s, want pending", r)
	}
	if r, c := s.command(t, b, idText, ""); r.Status != 200 || c.Status != "accepted" || c.AggregateID != "b/acc-1" {
		t.Errorf("b's command under the same id: %s, want b's own, accepted on b/acc-1", r)
	}
	for _, q := range []struct{ key, query string }{
		{a, "?aggregate_id=b/acc-1"}, {b, "?aggregate_id=a/acc-1"}, {b, "?aggregate_id=a/acc-2&wait=50ms"}, {a, "?aggregate_id=a/acc-3"},
	} {
		if r, _ := s.command(t, q.key, idText, q.query); r.Status != http.StatusNotFound || string(r.Body) != string(missing.Body) {
			t.Errorf("%s: got %s, want the 404 of a missing command", q.query, r)
		}
	}
	for _, bad := range []string{"?aggregate_id=acc-1", "?aggregate_id=a/", "?aggregate_id=", "?aggregate_id=a/%00", "?aggregate_id=a/%ff"} {
		if r, _ := s.command(t, a, idText, bad); r.Status != http.StatusUnprocessableEntity || !slices.Equal(r.problem(t).fields(), []string{"aggregate_id"}) {
			t.Errorf("%s: got %s, want 422 naming aggregate_id", bad, r)
		}
	}

	// The outcome of ingest's command reaches a, not b.
	project(t, pool, event("a", "acc-1", id, 0, time.Now(), pipeline.CommandRejected{CommandType: "Deposit", Reason: "account_closed", Detail: "closed"}))
	if r, c := s.command(t, a, idText, ""); c.Status != "rejected" || c.Reason != "account_closed" || c.AggregateID != "a/acc-1" {
		t.Errorf("a's command after its outcome: %s", r)
	}
	if r, c := s.command(t, b, idText, ""); c.Status != "accepted" || c.AggregateID != "b/acc-1" {
		t.Errorf("b's command after a's outcome: %s", r)
	}
	// The key report shows the key's command, ingest's.
	rep, err := ingest.CheckKeys(ctx, pool, "a", time.Hour, 10)
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Top) != 1 || rep.Top[0].CommandID != idText || rep.Top[0].Status != "rejected" {
		t.Errorf("key report: %+v, want one key with ingest's command, rejected", rep.Top)
	}

	// An id only direct producers used, on two accounts: the earlier
	// command answers, ?aggregate_id= the other.
	direct := pipeline.NewCommandID()
	project(t, pool,
		event("a", "acc-8", direct, 0, time.Now(), ledger.Deposited{Amount: 1}),
		event("a", "acc-9", direct, 0, earlier, pipeline.CommandRejected{CommandType: "Deposit", Reason: "account_closed"}))
	if r, c := s.command(t, a, direct.String(), ""); c.AggregateID != "a/acc-9" || c.Status != "rejected" {
		t.Errorf("a direct id on two accounts: %s, want the earlier, a/acc-9", r)
	}
	if r, c := s.command(t, a, direct.String(), "?aggregate_id=a/acc-8"); c.AggregateID != "a/acc-8" || c.Status != "accepted" {
		t.Errorf("a direct id, acc-8 by name: %s", r)
	}
}

// A command that went to the DLQ shows failed, with the reason and detail,
// as a 200 (a waiting client gets it at once); a redrive that succeeds
// replaces it with the outcome.
func TestCommandFailedOverGET(t *testing.T) {
	t.Parallel()
	pool, _ := ledgerPool(t)
	s := startServer(t, pool, ingest.Config{})
	key := tenant(t, pool, "acme")
	idText := acceptedID(t, s.do(t, req{path: "/v1/accounts/acc-1/deposits", apiKey: key, idemKey: "d1", body: `{"amount":5}`}))
	id, _ := pipeline.ParseID(idText)

	type answer struct {
		r    response
		c    commandBody
		took time.Duration
	}
	done := make(chan answer, 1)
	go func() {
		start := time.Now()
		r, err := s.try(context.Background(), req{method: http.MethodGet, path: "/v1/commands/" + idText + "?wait=30s", apiKey: key})
		if err != nil {
			t.Error(err)
		}
		var c commandBody
		json.Unmarshal(r.Body, &c)
		done <- answer{r, c, time.Since(start)}
	}()
	failure := event("acme", "acc-1", id, 0, time.Now(), pipeline.CommandFailed{CommandType: "Deposit", Reason: "decider-error", Detail: "the decider failed"})
	failure.ID = pipeline.FailureEventID(failure.AggregateID, id, 3, 42)
	project(t, pool, failure)
	var got answer
	select {
	case got = <-done:
	case <-time.After(20 * time.Second):
		t.Fatal("the waiting request did not answer once the command failed")
	}
	if got.r.Status != 200 || got.c.Status != "failed" || got.c.Reason != "decider-error" || got.c.Detail != "the decider failed" ||
		got.c.CommandType != "Deposit" || !slices.Equal(got.c.EventIDs, []string{failure.ID.String()}) {
		t.Fatalf("after the failure: %s", got.r)
	}
	if got.took > 15*time.Second {
		t.Errorf("the waiting request answered after %s", got.took)
	}

	project(t, pool, event("acme", "acc-1", id, 0, time.Now(), ledger.Deposited{Amount: 5}))
	if r, c := s.command(t, key, idText, "?wait=5s"); c.Status != "accepted" || c.Reason != "" || len(c.EventIDs) != 1 || c.EventIDs[0] == failure.ID.String() {
		t.Errorf("after the redrive: %s, want accepted with its own event", r)
	}
	// The failure again (a replay) changes nothing.
	project(t, pool, failure)
	if r, c := s.command(t, key, idText, ""); c.Status != "accepted" {
		t.Errorf("after the failure was replayed: %s, want accepted", r)
	}
}
