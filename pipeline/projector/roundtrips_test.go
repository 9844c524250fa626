package projector_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/onceflow/onceflow/examples/ledger"
	"github.com/onceflow/onceflow/pipeline"
	"github.com/onceflow/onceflow/pipeline/pipelinetest"
	"github.com/onceflow/onceflow/pipeline/projector"
)

// TestBatchOfOneRoundTrips counts what a batch of one event sends to
// Postgres, from its transaction's start to its commit, on the connection
// that runs it: at a low rate every batch holds one event, and each round
// trip is a wake-up of both processes, a sizeable part of the batch's time
// (docs/benchmarks.md#the-bill-cpu-per-command). The begin goes with the
// offsets' lock; the library's own projections with the offsets, parks
// and notification: a change that adds a round trip fails here, and says
// which.
func TestBatchOfOneRoundTrips(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 1)
	rt := &roundTrips{byPID: map[uint32][]string{}}
	cfg, err := pgxpool.ParseConfig(e.url)
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.Tracer = rt
	traced, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(traced.Close)
	e.pool = traced

	counted := make(chan uint32, 1)
	hold := func(point string, pid uint32) {
		rt.mu.Lock()
		defer rt.mu.Unlock()
		switch point {
		case projector.HoldBeforeTx:
			rt.on = rt.armed
			clear(rt.byPID)
		case projector.HoldInTx:
			rt.pid = pid
		case projector.HoldAfterCommit:
			if rt.on {
				rt.on, rt.armed = false, false
				counted <- rt.pid
			}
		}
	}
	e.start(projector.Config{Hold: hold}, ledgerProjections()...)

	// The account's opening prepares the statements; its deposit is counted.
	s := newStream("acme", "a1")
	e.emit(s.next(ledger.AccountOpened{Currency: "EUR"}))
	e.waitOffsets(projector.DefaultConsumer, e.endOffsets(), 30*time.Second)
	rt.mu.Lock()
	rt.armed = true
	rt.mu.Unlock()
	e.emit(s.next(ledger.Deposited{Amount: 5}))
	var pid uint32
	select {
	case pid = <-counted:
	case <-time.After(30 * time.Second):
		t.Fatal("the deposit's batch did not commit")
	}
	rt.mu.Lock()
	got := rt.byPID[pid]
	rt.mu.Unlock()

	want := []string{
		"batch: begin, SET, INSERT", // the begin, asynchronous commit, the offsets' lock
		"WITH",                      // the inbox
		"SELECT", "UPDATE",          // accounts: the stored version, the guarded update
		// command_status, audit_log; the offsets, the parks cleared, the
		// outcome's notification
		"batch: INSERT, INSERT, UPDATE, WITH, SELECT",
		"commit",
	}
	if strings.Join(got, " | ") != strings.Join(want, " | ") {
		t.Errorf("a batch of one event sent %d round trips, want %d:\n got: %s\nwant: %s", len(got), len(want),
			strings.Join(got, " | "), strings.Join(want, " | "))
	}
}

// roundTrips records, by backend, the first word of each statement and
// batch pgx sends while on.
type roundTrips struct {
	mu        sync.Mutex
	armed, on bool
	pid       uint32
	byPID     map[uint32][]string
}

func (r *roundTrips) add(conn *pgx.Conn, what string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.on {
		pid := conn.PgConn().PID()
		r.byPID[pid] = append(r.byPID[pid], what)
	}
}

func firstWord(sql string) string {
	w, _, _ := strings.Cut(strings.TrimSpace(sql), " ")
	return w
}

func (r *roundTrips) TraceQueryStart(ctx context.Context, conn *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	r.add(conn, firstWord(d.SQL))
	return ctx
}

func (r *roundTrips) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func (r *roundTrips) TraceBatchStart(ctx context.Context, conn *pgx.Conn, d pgx.TraceBatchStartData) context.Context {
	var words []string
	for _, q := range d.Batch.QueuedQueries {
		words = append(words, firstWord(q.SQL))
	}
	r.add(conn, fmt.Sprintf("batch: %s", strings.Join(words, ", ")))
	return ctx
}

func (r *roundTrips) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {}

func (r *roundTrips) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}

func (r *roundTrips) TraceCopyFromStart(ctx context.Context, conn *pgx.Conn, d pgx.TraceCopyFromStartData) context.Context {
	r.add(conn, "copy")
	return ctx
}

func (r *roundTrips) TraceCopyFromEnd(context.Context, *pgx.Conn, pgx.TraceCopyFromEndData) {}

// TestQueuedProjectionDataError: command_status and audit_log go in the
// batch's last round trip, after the other projections; a data error
// there is still theirs, and still the event's. Here a constraint on
// command_status refuses one command's reason: the partition parks at its
// event, with the projection and the SQLSTATE in the detail; the events
// before it are applied, in every read model, once.
func TestQueuedProjectionDataError(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 1)
	ctx := context.Background()
	if _, err := e.pool.Exec(ctx, `ALTER TABLE command_status ADD CONSTRAINT test_reason CHECK (reason IS DISTINCT FROM 'refused-here')`); err != nil {
		t.Fatal(err)
	}
	s := newStream("acme", "a1")
	evs := []pipeline.Event{
		s.next(ledger.AccountOpened{Currency: "EUR"}),
		s.next(ledger.Deposited{Amount: 5}),
		s.next(pipeline.CommandRejected{CommandType: "Withdraw", Reason: "refused-here", Detail: "the constraint refuses it"}),
		s.next(ledger.Deposited{Amount: 7}),
	}
	e.emit(evs...)
	e.start(projector.Config{ParkCheckInterval: 50 * time.Millisecond}, ledgerProjections()...)
	pipelinetest.Eventually(t, 30*time.Second, func() error { return e.parkedAt(0, 2, "data-error") })
	detail := e.parkedRows()[0]
	for _, want := range []string{"command_status:", "SQLSTATE 23514", evs[2].ID.String()} {
		if !strings.Contains(detail, want) {
			t.Errorf("parked detail %q lacks %q", detail, want)
		}
	}
	if got := e.storedOffsets(projector.DefaultConsumer)[0]; got != 2 {
		t.Errorf("stored offset %d, want 2 (parked at the refused event)", got)
	}
	for i, ev := range evs {
		want := int64(0)
		if i < 2 {
			want = 1
		}
		if n := e.count(`SELECT count(*) FROM audit_log WHERE event_id = $1`, ev.ID.String()); n != want {
			t.Errorf("event %d: %d audit rows, want %d", i, n, want)
		}
		if n := e.count(`SELECT count(*) FROM command_status WHERE command_id = $1`, ev.CommandID.String()); n != want {
			t.Errorf("event %d: %d command_status rows, want %d", i, n, want)
		}
	}
	if bal, _, err := e.balance("acme", "a1"); err != nil || bal != 5 {
		t.Errorf("balance %d (%v), want 5: the deposit after the parked event is not applied", bal, err)
	}
}
