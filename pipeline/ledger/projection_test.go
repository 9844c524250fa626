package ledger_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/onceflow/onceflow/pipeline"
	"github.com/onceflow/onceflow/pipeline/ledger"
	"github.com/onceflow/onceflow/pipeline/pipelinetest"
)

// projEvent is an event of aggregate agg at version v caused by command c.
func projEvent(agg string, v int64, c pipeline.ID, index int, m pipeline.Message) pipeline.Event {
	return pipeline.Event{ID: pipeline.EventID(agg, c, index), CommandID: c, Tenant: "acme", AggregateID: agg, Version: v,
		Time: time.UnixMilli(1_700_000_000_000 + v), Payload: m}
}

func inTx(t *testing.T, fn func(ctx context.Context, tx pgx.Tx)) {
	t.Helper()
	pool, _ := pipelinetest.Pool(t)
	ctx := context.Background()
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	fn(ctx, tx)
}

func outcome(err error) string {
	var gap *pipeline.VersionGapError
	switch {
	case err == nil:
		return "ok"
	case errors.Is(err, pipeline.ErrDuplicate):
		return "dup"
	case errors.As(err, &gap):
		return "gap"
	case pipeline.IsPermanent(err):
		return "permanent"
	}
	return err.Error()
}

// Accounts folds a batch per account on top of the stored version: a
// duplicate is at or below it, a gap stops the account (nothing after it
// applies), a rejection leaves it alone, an account must be opened first,
// and a malformed aggregate id can never be applied.
func TestAccountsBatchOutcomes(t *testing.T) {
	t.Parallel()
	inTx(t, func(ctx context.Context, tx pgx.Tx) {
		acc := ledger.Accounts{}
		c := pipeline.NewCommandID
		batch1 := []pipeline.Event{
			projEvent("acme/a", 1, c(), 0, ledger.AccountOpened{Currency: "EUR"}),
			projEvent("acme/a", 2, c(), 0, ledger.Deposited{Amount: 100}),
			projEvent("acme/b", 1, c(), 0, ledger.Deposited{Amount: 5}), // not opened
			projEvent("acme/a", 3, c(), 0, ledger.Withdrawn{Amount: 30}),
			projEvent("bad-id", 1, c(), 0, ledger.AccountOpened{Currency: "EUR"}),
		}
		out, err := acc.ApplyBatch(ctx, tx, batch1)
		if err != nil {
			t.Fatal(err)
		}
		checkOutcomes(t, out, "ok", "ok", "gap", "ok", "permanent")

		rejected := projEvent("acme/a", 4, c(), 0, pipeline.CommandRejected{CommandType: "Withdraw", Reason: "insufficient_funds"})
		rejected.Version = 3 // a rejection carries the current version
		batch2 := []pipeline.Event{
			batch1[3], // already applied
			projEvent("acme/a", 4, c(), 0, ledger.Deposited{Amount: 1}),
			rejected,
			projEvent("acme/a", 6, c(), 0, ledger.Deposited{Amount: 1000}), // 5 is missing
			projEvent("acme/a", 7, c(), 0, ledger.Deposited{Amount: 1000}),
		}
		if out, err = acc.ApplyBatch(ctx, tx, batch2); err != nil {
			t.Fatal(err)
		}
		checkOutcomes(t, out, "dup", "ok", "ok", "gap", "gap")
		var bal, ver int64
		var status string
		if err := tx.QueryRow(ctx, `SELECT balance, version, status FROM accounts WHERE tenant = 'acme' AND account_id = 'a'`).Scan(&bal, &ver, &status); err != nil {
			t.Fatal(err)
		}
		if bal != 71 || ver != 4 || status != "open" {
			t.Errorf("account a: balance %d version %d %s, want 71, 4, open", bal, ver, status)
		}

		// Apply is ApplyBatch of one event.
		if err := acc.Apply(ctx, tx, projEvent("acme/a", 5, c(), 0, ledger.AccountClosed{})); err != nil {
			t.Fatal(err)
		}
		if got := outcome(acc.Apply(ctx, tx, projEvent("acme/a", 5, c(), 0, ledger.AccountClosed{}))); got != "dup" {
			t.Errorf("closing twice: %s, want dup", got)
		}
		tx.QueryRow(ctx, `SELECT status, version FROM accounts WHERE account_id = 'a'`).Scan(&status, &ver)
		if status != "closed" || ver != 5 {
			t.Errorf("after closing: %s version %d", status, ver)
		}
	})
}

func checkOutcomes(t *testing.T, out []error, want ...string) {
	t.Helper()
	if len(out) != len(want) {
		t.Fatalf("%d outcomes, want %d", len(out), len(want))
	}
	for i, o := range out {
		if got := outcome(o); got != want[i] {
			t.Errorf("event %d: %s (%v), want %s", i, got, o, want[i])
		}
	}
}

// command_status records outcomes over ingest's pending row, for commands
// sent straight to Kafka too, and recording an event id twice (an event the
// inbox no longer remembers) does not add it twice.
func TestCommandStatusBatch(t *testing.T) {
	t.Parallel()
	inTx(t, func(ctx context.Context, tx pgx.Tx) {
		cs := ledger.CommandStatus{}
		pending, direct, rejected := pipeline.NewCommandID(), pipeline.NewCommandID(), pipeline.NewCommandID()
		if _, err := tx.Exec(ctx, `INSERT INTO command_status (command_id, tenant, aggregate_id, command_type, status) VALUES ($1, 'acme', 'acme/a', 'Deposit', 'pending')`, pending.String()); err != nil {
			t.Fatal(err)
		}
		evs := []pipeline.Event{
			projEvent("acme/a", 2, pending, 0, ledger.Deposited{Amount: 1}),
			projEvent("acme/b", 1, direct, 0, ledger.AccountOpened{Currency: "EUR"}),
			projEvent("acme/b", 2, direct, 1, ledger.Deposited{Amount: 1}),
			projEvent("acme/b", 2, rejected, 0, pipeline.CommandRejected{CommandType: "Withdraw", Reason: "insufficient_funds", Detail: "no"}),
		}
		for i := 0; i < 2; i++ {
			if _, err := cs.ApplyBatch(ctx, tx, evs); err != nil {
				t.Fatal(err)
			}
		}
		for _, w := range []struct {
			id      pipeline.ID
			status  string
			events  int
			cmdType string
			reason  string
		}{
			{pending, "accepted", 1, "Deposit", ""},
			{direct, "accepted", 2, "OpenAccount", ""},
			{rejected, "rejected", 1, "Withdraw", "insufficient_funds"},
		} {
			var status, cmdType string
			var reason *string
			var n int
			err := tx.QueryRow(ctx, `SELECT status, cardinality(event_ids), command_type, reason FROM command_status WHERE command_id = $1`, w.id.String()).
				Scan(&status, &n, &cmdType, &reason)
			got := ""
			if reason != nil {
				got = *reason
			}
			if err != nil || status != w.status || n != w.events || cmdType != w.cmdType || got != w.reason {
				t.Errorf("%s: %s %d events %s %q (%v), want %+v", w.id, status, n, cmdType, got, err, w)
			}
		}
	})
}

// audit_log records each event once, with its fields under their schema
// names; an event recorded before is a duplicate, the rest of its batch is
// still recorded.
func TestAuditLogBatch(t *testing.T) {
	t.Parallel()
	inTx(t, func(ctx context.Context, tx pgx.Tx) {
		al := ledger.AuditLog{}
		c := pipeline.NewCommandID()
		first := projEvent("acme/a", 1, c, 0, ledger.TransferDebited{TransferID: "t-1", To: "b", Amount: 7})
		if out, err := al.ApplyBatch(ctx, tx, []pipeline.Event{first}); err != nil || outcome(out[0]) != "ok" {
			t.Fatalf("first: %v %v", out, err)
		}
		second := projEvent("acme/a", 2, c, 1, ledger.Deposited{Amount: 1})
		out, err := al.ApplyBatch(ctx, tx, []pipeline.Event{first, second})
		if err != nil {
			t.Fatal(err)
		}
		checkOutcomes(t, out, "dup", "ok")
		var n int
		var payload string
		if err := tx.QueryRow(ctx, `SELECT count(*) FROM audit_log`).Scan(&n); err != nil || n != 2 {
			t.Errorf("%d audit rows (%v), want 2", n, err)
		}
		if err := tx.QueryRow(ctx, `SELECT payload::text FROM audit_log WHERE event_id = $1`, first.ID.String()).Scan(&payload); err != nil ||
			payload != `{"to": "b", "amount": 7, "transfer_id": "t-1"}` {
			t.Errorf("payload %s (%v)", payload, err)
		}
	})
}
