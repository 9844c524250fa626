package projector_test

import (
	"context"
	"testing"
	"time"

	"github.com/onceflow/onceflow/examples/ledger"
	"github.com/onceflow/onceflow/pipeline"
	"github.com/onceflow/onceflow/pipeline/kafka"
	"github.com/onceflow/onceflow/pipeline/projector"
)

// A rebuild of command_status ends where the live table is: a failure
// followed by its redrive's outcome is the outcome, an outcome followed by
// a failure (a poison copy of a decided command) stays the outcome, and
// what only ingest and the relay know survives the swap: a pending command
// and a command whose outbox row went to outbox_dead (failed, no event).
// Of a tenant's two commands of one id, GET's order (ingest's, else the
// earliest) still puts ingest's first, though the rebuilt rows no longer
// say which ingest wrote.
func TestRebuildCommandStatusKeepsFailuresAndIngestRows(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 2)
	ctx := context.Background()
	at := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	ev := func(local string, cmd pipeline.ID, index int, v int64, m pipeline.Message) pipeline.Event {
		agg := pipeline.AggregateID("acme", local)
		return pipeline.Event{ID: pipeline.EventID(agg, cmd, index), CommandID: cmd, Tenant: "acme", AggregateID: agg,
			Version: v, Time: at.Add(time.Duration(v) * time.Second), Payload: m}
	}
	failure := func(local string, cmd pipeline.ID, v int64, offset int64, reason string) pipeline.Event {
		f := ev(local, cmd, 0, v, pipeline.CommandFailed{CommandType: "Deposit", Reason: reason})
		f.ID = pipeline.FailureEventID(f.AggregateID, cmd, 0, offset)
		return f
	}
	open, redriven, decided, ingested := pipeline.NewCommandID(), pipeline.NewCommandID(), pipeline.NewCommandID(), pipeline.NewCommandID()
	pending, dead, alone := pipeline.NewCommandID(), pipeline.NewCommandID(), pipeline.NewCommandID()
	// ingest's rows, written before the events exist.
	for _, r := range []struct {
		id         pipeline.ID
		agg, state string
	}{{ingested, "acme/acc-1", "pending"}, {alone, "acme/acc-1", "pending"}, {pending, "acme/acc-1", "pending"}, {dead, "acme/acc-1", "failed"}} {
		if _, err := e.pool.Exec(ctx, `INSERT INTO command_status (command_id, tenant, aggregate_id, command_type, status, reason, ingested)
			VALUES ($1, 'acme', $2, 'Deposit', $3, CASE WHEN $3 = 'failed' THEN 'MESSAGE_TOO_LARGE' END, true)`, r.id.String(), r.agg, r.state); err != nil {
			t.Fatal(err)
		}
	}
	// The tenant's own producer, the same id on another account, later.
	sibling := ev("acc-2", ingested, 0, 1, ledger.AccountOpened{Currency: "EUR"})
	sibling.Time = at.Add(time.Minute)
	e.emit(
		ev("acc-1", open, 0, 1, ledger.AccountOpened{Currency: "EUR"}),
		failure("acc-1", redriven, 1, 10, "decider-error"),
		ev("acc-1", redriven, 0, 2, ledger.Deposited{Amount: 1}),
		ev("acc-1", decided, 0, 3, ledger.Deposited{Amount: 2}),
		failure("acc-1", decided, 3, 12, "output-refused"),
		ev("acc-1", ingested, 0, 4, ledger.Deposited{Amount: 3}),
		ev("acc-1", alone, 0, 5, ledger.Deposited{Amount: 4}),
		sibling,
	)
	r := e.start(projector.Config{})
	e.waitOffsets(projector.DefaultConsumer, e.endOffsets(), 30*time.Second)
	r.stop()

	type row struct {
		status, reason string
		events         int
		ingested       bool
	}
	read := func() map[string]row {
		t.Helper()
		rows, err := e.pool.Query(ctx, `SELECT command_id::text || ' ' || aggregate_id, status, coalesce(reason, ''), cardinality(event_ids), ingested FROM command_status`)
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		out := map[string]row{}
		for rows.Next() {
			var k string
			var r row
			if err := rows.Scan(&k, &r.status, &r.reason, &r.events, &r.ingested); err != nil {
				t.Fatal(err)
			}
			out[k] = r
		}
		return out
	}
	want := map[string]row{
		open.String() + " acme/acc-1":     {"accepted", "", 1, false},
		redriven.String() + " acme/acc-1": {"accepted", "", 1, false},
		decided.String() + " acme/acc-1":  {"accepted", "", 1, false},
		ingested.String() + " acme/acc-1": {"accepted", "", 1, true},
		ingested.String() + " acme/acc-2": {"accepted", "", 1, false},
		alone.String() + " acme/acc-1":    {"accepted", "", 1, true},
		pending.String() + " acme/acc-1":  {"pending", "", 0, true},
		dead.String() + " acme/acc-1":     {"failed", "MESSAGE_TOO_LARGE", 0, true},
	}
	check := func(when string) {
		t.Helper()
		got := read()
		if len(got) != len(want) {
			t.Errorf("%s: %d rows, want %d: %v", when, len(got), len(want), got)
		}
		for k, w := range want {
			if got[k] != w {
				t.Errorf("%s: %s: %+v, want %+v", when, k, got[k], w)
			}
		}
	}
	check("live")

	rb, err := projector.NewRebuild(projector.RebuildConfig{Topic: e.topics.Events(), Projection: projector.CommandStatus{}, Verify: true, MaxPollRecords: 3},
		kafka.Config{Brokers: e.brokers}, e.pool, e.serde, quietLogger())
	if err != nil {
		t.Fatal(err)
	}
	res, err := rb.Run(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if sw := res.Tables[0]; sw.RebuiltRows != sw.LiveRows {
		t.Errorf("command_status: %d rows live, %d rebuilt", sw.LiveRows, sw.RebuiltRows)
	}
	// The rebuilt rows of decided commands do not say which ingest wrote
	// (docs/decisions/0002-get-command-answers-ingests-command.md).
	want[alone.String()+" acme/acc-1"] = row{"accepted", "", 1, false}
	want[ingested.String()+" acme/acc-1"] = row{"accepted", "", 1, false}
	check("rebuilt")
	var first string
	if err := e.pool.QueryRow(ctx, `SELECT aggregate_id FROM command_status WHERE command_id = $1 AND tenant = 'acme'
		ORDER BY ingested DESC, created_at, aggregate_id LIMIT 1`, ingested.String()).Scan(&first); err != nil || first != "acme/acc-1" {
		t.Errorf("the command GET answers for the shared id: %q (%v), want ingest's, on acme/acc-1", first, err)
	}
}
