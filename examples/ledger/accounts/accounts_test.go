package accounts_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/onceflow/onceflow/examples/ledger"
	"github.com/onceflow/onceflow/examples/ledger/accounts"
	"github.com/onceflow/onceflow/pipeline"
	"github.com/onceflow/onceflow/pipeline/pipelinetest"
	"github.com/onceflow/onceflow/pipeline/postgres"
	"github.com/onceflow/onceflow/pipeline/projector"
)

// projEvent is an event of aggregate agg at version v caused by command c.
func projEvent(agg string, v int64, c pipeline.ID, index int, m pipeline.Message) pipeline.Event {
	return pipeline.Event{ID: pipeline.EventID(agg, c, index), CommandID: c, Tenant: "acme", AggregateID: agg, Version: v,
		Time: time.UnixMilli(1_700_000_000_000 + v), Payload: m}
}

func inTx(t *testing.T, fn func(ctx context.Context, tx pgx.Tx)) {
	t.Helper()
	pool, _ := pipelinetest.Pool(t, postgres.Migrations{Name: "ledger", FS: accounts.Migrations})
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
		acc := accounts.Projection{}
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

// A CommandFailed leaves the account alone, as a rejection does: not a
// duplicate, not a version change, not a gap; the audit log records it
// like any event.
func TestCommandFailedInAccountsAndAudit(t *testing.T) {
	t.Parallel()
	inTx(t, func(ctx context.Context, tx pgx.Tx) {
		acc, al := accounts.Projection{}, projector.AuditLog{}
		c := pipeline.NewCommandID
		opened := projEvent("acme/a", 1, c(), 0, ledger.AccountOpened{Currency: "EUR"})
		failure := projEvent("acme/a", 1, c(), 0, pipeline.CommandFailed{CommandType: "Deposit", Reason: "decider-error", Detail: "boom"})
		neverOpened := projEvent("acme/z", 0, c(), 0, pipeline.CommandFailed{CommandType: "Deposit", Reason: "decider-error"})
		deposit := projEvent("acme/a", 2, c(), 0, ledger.Deposited{Amount: 5})
		out, err := acc.ApplyBatch(ctx, tx, []pipeline.Event{opened, failure, neverOpened, deposit})
		if err != nil {
			t.Fatal(err)
		}
		checkOutcomes(t, out, "ok", "ok", "ok", "ok")
		var bal, ver int64
		if err := tx.QueryRow(ctx, `SELECT balance, version FROM accounts WHERE tenant = 'acme' AND account_id = 'a'`).Scan(&bal, &ver); err != nil || bal != 5 || ver != 2 {
			t.Errorf("account a: balance %d version %d (%v), want 5, 2", bal, ver, err)
		}
		if out := acc.Apply(ctx, tx, failure); out != nil {
			t.Errorf("the failure again: %v, want nil (not a duplicate)", out)
		}
		var n int
		if err := tx.QueryRow(ctx, `SELECT count(*) FROM accounts WHERE account_id = 'z'`).Scan(&n); err != nil || n != 0 {
			t.Errorf("a failure opened account z (%d rows, %v)", n, err)
		}

		if out, err := al.ApplyBatch(ctx, tx, []pipeline.Event{failure}); err != nil || outcome(out[0]) != "ok" {
			t.Fatalf("audit: %v %v", out, err)
		}
		var typ, payload string
		if err := tx.QueryRow(ctx, `SELECT event_type, payload::text FROM audit_log WHERE event_id = $1`, failure.ID.String()).Scan(&typ, &payload); err != nil ||
			typ != "CommandFailed" || payload != `{"detail": "boom", "reason": "decider-error", "command_type": "Deposit"}` {
			t.Errorf("audit row: %s %s (%v)", typ, payload, err)
		}
	})
}

// An account written from outside the projector after the batch read its
// version fails the batch (the projector rolls it back and tries again)
// instead of being written over: the update waits for the other writer's
// lock, then finds the row at another version.
func TestAccountWrittenMeanwhileFailsTheBatch(t *testing.T) {
	t.Parallel()
	pool, _ := pipelinetest.Pool(t, postgres.Migrations{Name: "ledger", FS: accounts.Migrations})
	ctx := context.Background()
	acc := accounts.Projection{}
	c := pipeline.NewCommandID
	apply := func(evs ...pipeline.Event) error {
		tx, err := pool.Begin(ctx)
		if err != nil {
			return err
		}
		defer tx.Rollback(ctx)
		out, err := acc.ApplyBatch(ctx, tx, evs)
		if err != nil {
			return err
		}
		for _, o := range out {
			if o != nil {
				return o
			}
		}
		return tx.Commit(ctx)
	}
	if err := apply(projEvent("acme/a", 1, c(), 0, ledger.AccountOpened{Currency: "EUR"})); err != nil {
		t.Fatal(err)
	}
	other, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Rollback(ctx)
	if _, err := other.Exec(ctx, `UPDATE accounts SET version = 2, balance = 7 WHERE tenant = 'acme' AND account_id = 'a'`); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- apply(projEvent("acme/a", 2, c(), 0, ledger.Deposited{Amount: 100})) }()
	for waiting := 0; waiting == 0; time.Sleep(5 * time.Millisecond) {
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock' AND query LIKE 'UPDATE accounts%'`).Scan(&waiting); err != nil {
			t.Fatal(err)
		}
		select {
		case err := <-done:
			t.Fatalf("the batch ended without waiting for the other writer: %v", err)
		default:
		}
	}
	if err := other.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err == nil || !strings.Contains(err.Error(), "0 of 1 rows at the expected version") {
		t.Fatalf("the batch over a row written meanwhile: %v, want the update to find no row at version 1 (0 of 1 rows at the expected version)", err)
	}
	var bal, ver int64
	if err := pool.QueryRow(ctx, `SELECT balance, version FROM accounts WHERE tenant = 'acme' AND account_id = 'a'`).Scan(&bal, &ver); err != nil || bal != 7 || ver != 2 {
		t.Errorf("account after the failed batch: balance %d version %d (%v), want the other writer's 7 at 2", bal, ver, err)
	}
}
