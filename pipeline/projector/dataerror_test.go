package projector_test

import (
	"context"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/onceflow/onceflow/examples/ledger"
	"github.com/onceflow/onceflow/pipeline"
	"github.com/onceflow/onceflow/pipeline/pipelinetest"
	"github.com/onceflow/onceflow/pipeline/projector"
)

// notesSQL is the read model of the data-error tests: each event's amount
// (never negative) and memo (at most 8 characters), with the number of
// times it was applied, and each aggregate's total (a bigint).
const notesSQL = `CREATE TABLE test_notes (
		event_id uuid PRIMARY KEY,
		n        int NOT NULL,
		amount   bigint NOT NULL CONSTRAINT test_notes_amount_check CHECK (amount >= 0),
		memo     varchar(8) NOT NULL
	);
	CREATE TABLE test_totals (aggregate text PRIMARY KEY, total bigint NOT NULL)`

// fixNotesSQL is what an operator does about the data errors: drop the
// check, widen the memo, make the total a numeric.
const fixNotesSQL = `ALTER TABLE test_notes DROP CONSTRAINT test_notes_amount_check;
	ALTER TABLE test_notes ALTER COLUMN memo TYPE varchar(64);
	ALTER TABLE test_totals ALTER COLUMN total TYPE numeric`

// note is an event's row: a deposit's amount, a rejection's reason as the
// memo.
func note(ev pipeline.Event) (amount int64, memo string) {
	switch p := ev.Payload.(type) {
	case ledger.Deposited:
		return p.Amount, "deposit"
	case pipeline.CommandRejected:
		return 0, p.Reason
	}
	return 0, ev.Type()
}

// notes writes test_notes and test_totals event by event; nothing in it
// guards against a data error.
type notes struct{}

func (notes) Name() string { return "notes" }

func (notes) Apply(ctx context.Context, tx pgx.Tx, ev pipeline.Event) error {
	amount, memo := note(ev)
	if _, err := tx.Exec(ctx, `INSERT INTO test_notes (event_id, n, amount, memo) VALUES ($1, 1, $2, $3)
		ON CONFLICT (event_id) DO UPDATE SET n = test_notes.n + 1`, ev.ID.String(), amount, memo); err != nil {
		return err
	}
	_, err := tx.Exec(ctx, `INSERT INTO test_totals (aggregate, total) VALUES ($1, $2)
		ON CONFLICT (aggregate) DO UPDATE SET total = test_totals.total + EXCLUDED.total`, ev.AggregateID, amount)
	return err
}

// batchNotes writes the same rows with one statement per table for a whole
// batch: a data error fails the statement, not one event.
type batchNotes struct{ notes }

func (b batchNotes) Apply(ctx context.Context, tx pgx.Tx, ev pipeline.Event) error {
	out, err := b.ApplyBatch(ctx, tx, []pipeline.Event{ev})
	if err != nil {
		return err
	}
	return out[0]
}

func (batchNotes) ApplyBatch(ctx context.Context, tx pgx.Tx, evs []pipeline.Event) ([]error, error) {
	ids, aggs, memos := make([]string, len(evs)), make([]string, len(evs)), make([]string, len(evs))
	amounts := make([]int64, len(evs))
	for i, ev := range evs {
		ids[i], aggs[i] = ev.ID.String(), ev.AggregateID
		amounts[i], memos[i] = note(ev)
	}
	if _, err := tx.Exec(ctx, `INSERT INTO test_notes (event_id, n, amount, memo)
		SELECT id, 1, a, m FROM unnest($1::uuid[], $2::bigint[], $3::text[]) AS v(id, a, m)
		ON CONFLICT (event_id) DO UPDATE SET n = test_notes.n + 1`, ids, amounts, memos); err != nil {
		return nil, err
	}
	if _, err := tx.Exec(ctx, `INSERT INTO test_totals (aggregate, total)
		SELECT g, sum(a) FROM unnest($1::text[], $2::bigint[]) AS v(g, a) GROUP BY g
		ON CONFLICT (aggregate) DO UPDATE SET total = test_totals.total + EXCLUDED.total`, aggs, amounts); err != nil {
		return nil, err
	}
	return make([]error, len(evs)), nil
}

// A projection's data error (SQLSTATE 22, 23, 54) parks the partition of
// the event that raised it, at that event, with the SQLSTATE in the
// detail; the events before it and every other partition are applied
// once, and the stored offsets say so. Unparked while the cause is still
// there, it parks again; once the operator fixed the table, unparking
// applies the rest. For a batch projection (one statement for the whole
// batch, so the event at fault must be found) and a plain one.
func TestDataErrorParksThePartitionAtTheEvent(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		proj pipeline.Projection[pgx.Tx]
	}{{"batch", batchNotes{}}, {"plain", notes{}}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			testDataErrorParks(t, tc.proj)
		})
	}
}

func testDataErrorParks(t *testing.T, proj pipeline.Projection[pgx.Tx]) {
	e := newEnv(t, 4)
	ctx := context.Background()
	if _, err := e.pool.Exec(ctx, notesSQL); err != nil {
		t.Fatal(err)
	}
	// Ten events on each partition, one account per partition; partitions
	// 0 to 2 carry one bad event each, partition 3 none.
	const perPartition = 10
	bad := map[int32]struct {
		at       int
		payload  pipeline.Message
		sqlstate string
	}{
		0: {4, ledger.Deposited{Amount: -1}, "23514"},                              // check_violation
		1: {5, pipeline.CommandRejected{Reason: "far-too-long-a-reason"}, "22001"}, // string_data_right_truncation
		2: {3, ledger.Deposited{Amount: math.MaxInt64}, "22003"},                   // numeric_value_out_of_range
	}
	evs := map[int32][]pipeline.Event{}
	streams := map[int32]*stream{}
	var recs []*kgo.Record
	for i := range perPartition {
		for part := int32(0); part < 4; part++ {
			s := streams[part]
			if s == nil {
				s = newStream("acme", fmt.Sprintf("p%d", part))
				streams[part] = s
			}
			var m pipeline.Message = ledger.Deposited{Amount: 1}
			if b, ok := bad[part]; ok && b.at == i {
				m = b.payload
			}
			ev := s.next(m)
			evs[part] = append(evs[part], ev)
			r := e.record(ev)
			r.Partition = part
			recs = append(recs, r)
		}
	}
	prod := pipelinetest.Client(t, e.brokers, kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err := prod.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		t.Fatal(err)
	}
	r := e.start(projector.Config{ParkCheckInterval: 50 * time.Millisecond}, proj)

	// Parked exactly at the bad events; partition 3 at its end.
	wantOffsets := map[int32]int64{0: 4, 1: 5, 2: 3, 3: perPartition}
	e.waitOffsets(projector.DefaultConsumer, map[int32]int64{3: perPartition}, 30*time.Second)
	pipelinetest.Eventually(t, 30*time.Second, func() error {
		for part, b := range bad {
			if err := e.parkedAt(part, int64(b.at), "data-error"); err != nil {
				return err
			}
		}
		return nil
	})
	parked := e.parkedRows()
	t.Logf("parked: %q", parked)
	for part, b := range bad {
		ev := evs[part][b.at]
		for _, want := range []string{"SQLSTATE " + b.sqlstate, "notes:", ev.Type(), ev.ID.String(), ev.AggregateID, fmt.Sprintf("version %d", ev.Version)} {
			if !strings.Contains(parked[part], want) {
				t.Errorf("partition %d: detail %q lacks %q", part, parked[part], want)
			}
		}
	}
	if got := e.storedOffsets(projector.DefaultConsumer); !sameOffsets(got, wantOffsets) {
		t.Errorf("stored offsets %v, want %v", got, wantOffsets)
	}
	e.wantApplied(t, evs, wantOffsets)
	wantCount(t, r, "onceflow_projector_parked_partitions", 3)
	if got := r.metric("onceflow_projector_parked_partitions", "reason", "data-error"); got != 3 {
		t.Errorf("parked partitions with reason data-error = %v, want 3", got)
	}
	if got := r.metric("onceflow_projector_batch_errors_total"); got != 0 {
		t.Errorf("batch errors = %v, want 0: a data error is not retried", got)
	}

	// Unparked with the cause still there: parked again, at the same events.
	unparked := time.Now()
	if _, err := projector.Unpark(ctx, e.pool, projector.DefaultConsumer, e.topics.Events(), nil); err != nil {
		t.Fatal(err)
	}
	pipelinetest.Eventually(t, 30*time.Second, func() error {
		var n int64
		if err := e.pool.QueryRow(ctx, `SELECT count(*) FROM projector_parked WHERE reason = 'data-error' AND parked_at > $1`, unparked).Scan(&n); err != nil || n != 3 {
			return fmt.Errorf("%d partitions parked again (%v), want 3", n, err)
		}
		return nil
	})
	if got := e.storedOffsets(projector.DefaultConsumer); !sameOffsets(got, wantOffsets) {
		t.Errorf("stored offsets after a futile unpark %v, want %v", got, wantOffsets)
	}
	e.wantApplied(t, evs, wantOffsets)

	// The operator fixes the tables and unparks: the rest applies, once.
	if _, err := e.pool.Exec(ctx, fixNotesSQL); err != nil {
		t.Fatal(err)
	}
	if _, err := projector.Unpark(ctx, e.pool, projector.DefaultConsumer, e.topics.Events(), nil); err != nil {
		t.Fatal(err)
	}
	all := map[int32]int64{0: perPartition, 1: perPartition, 2: perPartition, 3: perPartition}
	e.waitOffsets(projector.DefaultConsumer, all, 30*time.Second)
	e.wantApplied(t, evs, all)
	if n := e.count(`SELECT count(*) FROM projector_parked`); n != 0 {
		t.Errorf("%d parked rows after the fix", n)
	}
	pipelinetest.Eventually(t, 10*time.Second, func() error {
		if got := r.metric("onceflow_projector_parked_partitions"); got != 0 {
			return fmt.Errorf("parked partitions gauge = %v, want 0", got)
		}
		return nil
	})
	var total string
	if err := e.pool.QueryRow(ctx, `SELECT total::text FROM test_totals WHERE aggregate = $1`, evs[2][0].AggregateID).Scan(&total); err != nil || total != fmt.Sprint(uint64(math.MaxInt64)+perPartition-1) {
		t.Errorf("total of partition 2's account = %s (%v), want MaxInt64 + 9", total, err)
	}
}

// wantApplied checks that the events of each partition below upTo were
// applied once and no other.
func (e *env) wantApplied(t *testing.T, evs map[int32][]pipeline.Event, upTo map[int32]int64) {
	t.Helper()
	counts := map[string]int64{}
	rows, err := e.pool.Query(context.Background(), `SELECT event_id::text, n FROM test_notes`)
	if err != nil {
		t.Fatal(err)
	}
	var id string
	var n int64
	if _, err := pgx.ForEachRow(rows, []any{&id, &n}, func() error { counts[id] = n; return nil }); err != nil {
		t.Fatal(err)
	}
	want := 0
	for part, list := range evs {
		for i, ev := range list {
			applied := counts[ev.ID.String()]
			switch {
			case int64(i) < upTo[part] && applied != 1:
				t.Errorf("partition %d event %d applied %d times, want once", part, i, applied)
			case int64(i) >= upTo[part] && applied != 0:
				t.Errorf("partition %d event %d (at or after where it parked) applied %d times", part, i, applied)
			}
			if int64(i) < upTo[part] {
				want++
			}
		}
	}
	if len(counts) != want {
		t.Errorf("%d events applied, want %d", len(counts), want)
	}
}

// parkedRows returns the detail of each parked partition.
func (e *env) parkedRows() map[int32]string {
	e.t.Helper()
	out := map[int32]string{}
	list, err := projector.Parked(context.Background(), e.pool)
	if err != nil {
		e.t.Fatal(err)
	}
	for _, p := range list {
		out[p.Partition] = p.Detail
	}
	return out
}

func sameOffsets(got, want map[int32]int64) bool {
	if len(got) != len(want) {
		return false
	}
	for p, o := range want {
		if got[p] != o {
			return false
		}
	}
	return true
}

// An error that is not the data's (here a projection's table is missing:
// class 42, a deploy ahead of its migration) is retried, never parked,
// and never silently: counted by class, the partition shown as retrying
// in the metrics, in Retrying and in projector_retrying (what `onceflow
// lag` reads); once the table exists the batch applies, once, and the
// retrying state is gone.
func TestTransientErrorIsRetriedVisibly(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 1)
	ctx := context.Background()
	r := e.start(projector.Config{MaxBackoff: 50 * time.Millisecond}, counting{})
	a := newStream("acme", "a")
	evs := []pipeline.Event{a.next(ledger.AccountOpened{Currency: "EUR"}), a.next(ledger.Deposited{Amount: 1})}
	e.emit(evs...)
	var retry projector.RetryingPartition
	pipelinetest.Eventually(t, 20*time.Second, func() error {
		list, err := projector.Retrying(ctx, e.pool)
		if err != nil || len(list) != 1 {
			return fmt.Errorf("retrying partitions %v (%v), want one", list, err)
		}
		retry = list[0]
		return nil
	})
	if retry.Class != "schema" || retry.Partition != 0 || !strings.Contains(retry.Error, "42P01") || retry.Attempts < 1 {
		t.Errorf("retrying row %+v, want partition 0, class schema, the SQLSTATE in the error", retry)
	}
	if got := r.metric("onceflow_projector_batch_errors_total", "class", "schema"); got < 1 {
		t.Errorf("batch errors of class schema = %v, want at least 1", got)
	}
	if got := r.metric("onceflow_projector_retrying_partitions", "class", "schema"); got != 1 {
		t.Errorf("retrying partitions of class schema = %v, want 1", got)
	}
	if got := r.p.Retrying(); !strings.HasPrefix(got[0], "schema: ") {
		t.Errorf("Retrying() = %v", got)
	}
	if n := e.count(`SELECT count(*) FROM projector_parked`); n != 0 {
		t.Errorf("%d parked partitions: a missing table is not the event's fault", n)
	}

	if _, err := e.pool.Exec(ctx, `CREATE TABLE test_counts (event_id uuid PRIMARY KEY, n int NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	e.waitOffsets(projector.DefaultConsumer, e.endOffsets(), 20*time.Second)
	if n := e.count(`SELECT count(*) FROM test_counts WHERE n = 1`); n != 2 {
		t.Errorf("%d events applied once, want 2", n)
	}
	if n := e.count(`SELECT count(*) FROM projector_retrying`); n != 0 {
		t.Errorf("%d projector_retrying rows after the batch applied", n)
	}
	pipelinetest.Eventually(t, 10*time.Second, func() error {
		if got := r.metric("onceflow_projector_retrying_partitions"); got != 0 {
			return fmt.Errorf("retrying partitions = %v, want 0", got)
		}
		return nil
	})
}
