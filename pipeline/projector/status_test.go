package projector_test

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/onceflow/onceflow/examples/ledger"
	"github.com/onceflow/onceflow/pipeline"
	"github.com/onceflow/onceflow/pipeline/pipelinetest"
	"github.com/onceflow/onceflow/pipeline/projector"
)

// projEvent is an event of aggregate agg at version v caused by command c.
func projEvent(agg string, v int64, c pipeline.ID, index int, m pipeline.Message) pipeline.Event {
	return pipeline.Event{ID: pipeline.EventID(agg, c, index), CommandID: c, Tenant: "acme", AggregateID: agg, Version: v,
		Time: time.UnixMilli(1_700_000_000_000 + v), Payload: m}
}

func inTx(t *testing.T, fn func(ctx context.Context, tx pgx.Tx)) {
	t.Helper()
	pool, _ := pipelinetest.Pool(t, ledgerMigrations)
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
		cs := projector.CommandStatus{CommandTypeOf: ledger.CommandTypeOf}
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
		al := projector.AuditLog{}
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

// statusRow is a command_status row as a test reads it.
type statusRow struct {
	status, cmdType, reason, detail string
	events                          []string
}

func readStatus(t *testing.T, ctx context.Context, tx pgx.Tx, tenant, agg string, id pipeline.ID) statusRow {
	t.Helper()
	var r statusRow
	var reason, detail *string
	err := tx.QueryRow(ctx, `SELECT status, command_type, reason, detail, event_ids::text[] FROM command_status
		WHERE command_id = $1 AND tenant = $2 AND aggregate_id = $3`, id.String(), tenant, agg).
		Scan(&r.status, &r.cmdType, &reason, &detail, &r.events)
	if errors.Is(err, pgx.ErrNoRows) {
		return statusRow{status: "none"}
	}
	if err != nil {
		t.Fatal(err)
	}
	if reason != nil {
		r.reason = *reason
	}
	if detail != nil {
		r.detail = *detail
	}
	return r
}

// tenantEvent is projEvent for another tenant.
func tenantEvent(tenant, local string, v int64, c pipeline.ID, index int, m pipeline.Message) pipeline.Event {
	ev := projEvent(pipeline.AggregateID(tenant, local), v, c, index, m)
	ev.Tenant = tenant
	return ev
}

// A command is its id within its tenant and aggregate: tenant b's outcome
// under a's command id, or a's own direct producer using the id on another
// account, writes rows of their own, in the same batch or in later ones,
// and a's pending command is untouched.
func TestCommandStatusIsScoped(t *testing.T) {
	t.Parallel()
	inTx(t, func(ctx context.Context, tx pgx.Tx) {
		cs := projector.CommandStatus{CommandTypeOf: ledger.CommandTypeOf}
		id := pipeline.NewCommandID()
		if _, err := tx.Exec(ctx, `INSERT INTO command_status (command_id, tenant, aggregate_id, command_type, status, ingested)
			VALUES ($1, 'a', 'a/acc-1', 'Deposit', 'pending', true)`, id.String()); err != nil {
			t.Fatal(err)
		}
		bOpened := tenantEvent("b", "acc-1", 1, id, 0, ledger.AccountOpened{Currency: "EUR"})
		bRejected := tenantEvent("b", "acc-9", 3, id, 0, pipeline.CommandRejected{CommandType: "Withdraw", Reason: "insufficient_funds"})
		aOther := tenantEvent("a", "acc-2", 4, id, 0, pipeline.CommandFailed{CommandType: "Deposit", Reason: "undecodable", Detail: "x"})
		if _, err := cs.ApplyBatch(ctx, tx, []pipeline.Event{bOpened, bRejected, aOther}); err != nil {
			t.Fatal(err)
		}
		// Again, one at a time (what a later batch or a redelivery does).
		for _, ev := range []pipeline.Event{aOther, bRejected, bOpened} {
			if err := cs.Apply(ctx, tx, ev); err != nil {
				t.Fatal(err)
			}
		}
		for _, w := range []struct {
			tenant, agg, status, reason string
			events                      int
		}{
			{"a", "a/acc-1", "pending", "", 0},
			{"a", "a/acc-2", "failed", "undecodable", 1},
			{"b", "b/acc-1", "accepted", "", 1},
			{"b", "b/acc-9", "rejected", "insufficient_funds", 1},
		} {
			got := readStatus(t, ctx, tx, w.tenant, w.agg, id)
			if got.status != w.status || got.reason != w.reason || len(got.events) != w.events {
				t.Errorf("%s %s: %s %q with %d events, want %s %q with %d", w.tenant, w.agg, got.status, got.reason, len(got.events), w.status, w.reason, w.events)
			}
		}
		var n int
		if err := tx.QueryRow(ctx, `SELECT count(*) FROM command_status WHERE command_id = $1`, id.String()).Scan(&n); err != nil || n != 4 {
			t.Errorf("%d rows of the id (%v), want 4", n, err)
		}
	})
}

// A failure (CommandFailed: the command went to the DLQ) is terminal until
// an outcome of the same command replaces it (a redrive that succeeded);
// an outcome is never replaced by a failure, whichever order the events
// come in, in one batch or across batches (a rebuild reads them again in
// log order).
func TestCommandStatusFailed(t *testing.T) {
	t.Parallel()
	failed := func(reason string) pipeline.Message {
		return pipeline.CommandFailed{CommandType: "Deposit", Reason: reason, Detail: reason + " detail"}
	}
	accepted := ledger.Deposited{Amount: 1}
	rejected := pipeline.CommandRejected{CommandType: "Deposit", Reason: "account_closed", Detail: "closed"}
	for _, tc := range []struct {
		name     string
		pending  bool                 // ingest's row exists first
		batches  [][]pipeline.Message // each event is the next index of the command
		status   string
		reason   string
		eventIdx []int // the indexes of event_ids, in order
	}{
		{"failed over pending", true, [][]pipeline.Message{{failed("undecodable")}}, "failed", "undecodable", []int{0}},
		{"failed then redriven, accepted", true, [][]pipeline.Message{{failed("decider-error")}, {accepted}}, "accepted", "", []int{1}},
		{"failed then accepted in one batch", false, [][]pipeline.Message{{failed("decider-error"), accepted}}, "accepted", "", []int{1}},
		{"failed then rejected", false, [][]pipeline.Message{{failed("decider-error")}, {rejected}}, "rejected", "account_closed", []int{1}},
		{"accepted then a failure replayed", true, [][]pipeline.Message{{accepted}, {failed("output-refused")}}, "accepted", "", []int{0}},
		{"accepted then a failure in one batch", false, [][]pipeline.Message{{accepted, failed("output-refused")}}, "accepted", "", []int{0}},
		{"rejected then a failure", false, [][]pipeline.Message{{rejected}, {failed("output-refused")}}, "rejected", "account_closed", []int{0}},
		{"failed twice: the last reason", false, [][]pipeline.Message{{failed("undecodable")}, {failed("decider-panic")}}, "failed", "decider-panic", []int{0, 1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			inTx(t, func(ctx context.Context, tx pgx.Tx) {
				cs := projector.CommandStatus{CommandTypeOf: ledger.CommandTypeOf}
				id := pipeline.NewCommandID()
				if tc.pending {
					if _, err := tx.Exec(ctx, `INSERT INTO command_status (command_id, tenant, aggregate_id, command_type, status, ingested)
						VALUES ($1, 'acme', 'acme/a', 'Deposit', 'pending', true)`, id.String()); err != nil {
						t.Fatal(err)
					}
				}
				var all []pipeline.Event
				i := 0
				for _, batch := range tc.batches {
					var evs []pipeline.Event
					for _, m := range batch {
						evs = append(evs, projEvent("acme/a", 3, id, i, m))
						i++
					}
					if _, err := cs.ApplyBatch(ctx, tx, evs); err != nil {
						t.Fatal(err)
					}
					all = append(all, evs...)
				}
				got := readStatus(t, ctx, tx, "acme", "acme/a", id)
				var want []string
				for _, k := range tc.eventIdx {
					want = append(want, all[k].ID.String())
				}
				if got.status != tc.status || got.reason != tc.reason || got.cmdType != "Deposit" || !slices.Equal(got.events, want) {
					t.Errorf("got %s %q (%s) events %v; want %s %q (Deposit) events %v", got.status, got.reason, got.cmdType, got.events, tc.status, tc.reason, want)
				}
				if tc.status == "failed" && got.detail != tc.reason+" detail" {
					t.Errorf("detail %q, want the failure's", got.detail)
				}
			})
		})
	}
}

// A failure of a record the processor could not decode has no command type;
// the outcome of a redrive fills it in.
func TestCommandStatusFailureWithoutType(t *testing.T) {
	t.Parallel()
	inTx(t, func(ctx context.Context, tx pgx.Tx) {
		cs := projector.CommandStatus{CommandTypeOf: ledger.CommandTypeOf}
		id := pipeline.NewCommandID()
		if err := cs.Apply(ctx, tx, projEvent("acme/a", 0, id, 0, pipeline.CommandFailed{Reason: "undecodable"})); err != nil {
			t.Fatal(err)
		}
		if got := readStatus(t, ctx, tx, "acme", "acme/a", id); got.status != "failed" || got.cmdType != "" {
			t.Fatalf("got %+v, want failed without a type", got)
		}
		if err := cs.Apply(ctx, tx, projEvent("acme/a", 1, id, 0, ledger.AccountOpened{Currency: "EUR"})); err != nil {
			t.Fatal(err)
		}
		if got := readStatus(t, ctx, tx, "acme", "acme/a", id); got.status != "accepted" || got.cmdType != "OpenAccount" || got.reason != "" {
			t.Errorf("got %+v, want accepted OpenAccount without a reason", got)
		}
	})
}

// The commands a decision sent are recorded pending with their cause,
// and keep it whatever comes first: here the refused credit's outcome
// (from another partition) comes before the debit that sent it, and the
// debit's second transfer and that credit's outcome share a batch. A
// derived command's own outcome replaces pending and keeps the cause; a
// decision named again (the inbox forgot it) changes nothing.
func TestCommandStatusDerived(t *testing.T) {
	t.Parallel()
	inTx(t, func(ctx context.Context, tx pgx.Tx) {
		cs := projector.CommandStatus{CommandTypeOf: ledger.CommandTypeOf}
		debit, debit2 := pipeline.NewCommandID(), pipeline.NewCommandID()
		credit := ledger.CreditCommandID("acme/a", debit, "t1")
		credit2 := ledger.CreditCommandID("acme/a", debit2, "t2")
		refund := ledger.RefundCommandID(credit)
		ref := func(id pipeline.ID, agg, typ string) []pipeline.CommandRef {
			return []pipeline.CommandRef{{ID: id, AggregateID: agg, Type: typ}}
		}
		rejected := projEvent("acme/nobody", 0, credit, 0, pipeline.CommandRejected{CommandType: "CreditTransfer", Reason: ledger.ReasonUnknownAccount})
		rejected.Derived = ref(refund, "acme/a", "RefundTransfer")
		debited := projEvent("acme/a", 3, debit, 0, ledger.TransferDebited{TransferID: "t1", To: "nobody", Amount: 5})
		debited.Derived = ref(credit, "acme/nobody", "CreditTransfer")
		debited2 := projEvent("acme/a", 4, debit2, 0, ledger.TransferDebited{TransferID: "t2", To: "b", Amount: 1})
		debited2.Derived = ref(credit2, "acme/b", "CreditTransfer")
		credited := projEvent("acme/b", 2, credit2, 0, ledger.TransferCredited{TransferID: "t2", From: "a", Amount: 1})
		refunded := projEvent("acme/a", 5, refund, 0, ledger.TransferRefunded{TransferID: "t1", To: "nobody", Amount: 5})
		for _, batch := range [][]pipeline.Event{{rejected}, {debited, debited2, credited}, {debited}} {
			if _, err := cs.ApplyBatch(ctx, tx, batch); err != nil {
				t.Fatal(err)
			}
		}
		type row struct{ status, cmdType, cause, causeAggregate string }
		read := func(id pipeline.ID) row {
			t.Helper()
			var r row
			if err := tx.QueryRow(ctx, `SELECT status, command_type, coalesce(cause_command_id::text, ''), coalesce(cause_aggregate_id, '')
				FROM command_status WHERE command_id = $1`, id.String()).Scan(&r.status, &r.cmdType, &r.cause, &r.causeAggregate); err != nil {
				t.Fatalf("%s: %v", id, err)
			}
			return r
		}
		want := map[pipeline.ID]row{
			debit:   {"accepted", "RequestTransfer", "", ""},
			credit:  {"rejected", "CreditTransfer", debit.String(), "acme/a"},
			refund:  {"pending", "RefundTransfer", credit.String(), "acme/nobody"},
			credit2: {"accepted", "CreditTransfer", debit2.String(), "acme/a"},
		}
		for id, w := range want {
			if got := read(id); got != w {
				t.Errorf("%s: %+v, want %+v", id, got, w)
			}
		}
		if _, err := cs.ApplyBatch(ctx, tx, []pipeline.Event{refunded}); err != nil {
			t.Fatal(err)
		}
		if got, w := read(refund), (row{"accepted", "RefundTransfer", credit.String(), "acme/nobody"}); got != w {
			t.Errorf("refund: %+v, want %+v", got, w)
		}
	})
}
