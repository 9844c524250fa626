package projector

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/onceflow/onceflow/pipeline"
	"github.com/onceflow/onceflow/pipeline/pipelinetest"
)

// tally counts Apply calls per event id: it has no idempotence of its own,
// so only the runtime stands between it and a second application.
type tally struct{}

func (tally) Name() string { return "tally" }

func (tally) Apply(ctx context.Context, tx pgx.Tx, ev pipeline.Event) error {
	_, err := tx.Exec(ctx, `INSERT INTO test_tally (event_id, n) VALUES ($1, 1)
		ON CONFLICT (event_id) DO UPDATE SET n = test_tally.n + 1`, ev.ID.String())
	return err
}

func tallyEvents(n int, partition int32, from int64) []event {
	evs := make([]event, n)
	for i := range evs {
		cmd := pipeline.NewCommandID()
		evs[i] = event{Event: pipeline.Event{ID: pipeline.EventID(fmt.Sprintf("acme/p%d", partition), cmd, 0), CommandID: cmd, AggregateID: fmt.Sprintf("acme/p%d", partition), Version: int64(i + 1),
			Payload: pipeline.CommandRejected{}},
			partition: partition, offset: from + int64(i), epoch: -1}
	}
	return evs
}

// Two members applying the same records at once (a zombie that has not
// noticed it lost its partition, and its successor): the offset row lock
// serializes them, one applies, the other finds the offset past its
// records and skips them; a stale batch arriving later moves nothing back.
func TestConcurrentWritersOfAPartitionAreFenced(t *testing.T) {
	t.Parallel()
	pool, _ := pipelinetest.Pool(t)
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `CREATE TABLE test_tally (event_id uuid PRIMARY KEY, n int NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	newApplier := func(hold Hold) *applier {
		return &applier{consumer: "c", topic: "events", pool: pool, projections: []pipeline.Projection[pgx.Tx]{tally{}}, hold: hold}
	}
	evs := tallyEvents(50, 0, 0)

	// The zombie stops inside its transaction, offsets row locked, until
	// its successor is waiting on that lock.
	inTx := make(chan struct{})
	release := make(chan struct{})
	zombie := newApplier(func(point string, _ uint32) {
		if point == HoldInTx {
			close(inTx)
			<-release
		}
	})
	var wg sync.WaitGroup
	results := make([]result, 2)
	errs := make([]error, 2)
	wg.Add(1)
	go func() { defer wg.Done(); results[0], errs[0] = zombie.apply(ctx, evs, nil) }()
	<-inTx
	wg.Add(1)
	go func() { defer wg.Done(); results[1], errs[1] = newApplier(nil).apply(ctx, evs, nil) }()
	pipelinetest.Eventually(t, 10*time.Second, func() error {
		var waiting int
		pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'`).Scan(&waiting)
		if waiting == 0 {
			return errFake
		}
		return nil
	})
	close(release)
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("writer %d: %v", i, err)
		}
	}
	if results[0].applied != 50 || results[1].applied != 0 || results[1].fenced != 50 {
		t.Errorf("zombie applied %d; successor applied %d and skipped %d; want 50, 0, 50",
			results[0].applied, results[1].applied, results[1].fenced)
	}

	// A stale batch (the first 20 again) changes nothing, moves nothing back.
	res, err := newApplier(nil).apply(ctx, evs[:20], nil)
	if err != nil || res.applied != 0 || res.fenced != 20 {
		t.Errorf("stale batch: %+v, %v", res, err)
	}
	var twice, off int64
	pool.QueryRow(ctx, `SELECT count(*) FROM test_tally WHERE n <> 1`).Scan(&twice)
	pool.QueryRow(ctx, `SELECT next_offset FROM consumer_offsets WHERE consumer = 'c'`).Scan(&off)
	if twice != 0 || off != 50 {
		t.Errorf("%d events applied more than once, offset %d; want 0 and 50", twice, off)
	}
}

// Events below their partition's stored offset (an operator's skip moved
// it past them, or another member applied them) are not recorded in the
// inbox: were they, moving the offset back to read them again would find
// them duplicates and never apply them.
func TestFencedEventsStayOutOfTheInbox(t *testing.T) {
	t.Parallel()
	pool, _ := pipelinetest.Pool(t)
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `CREATE TABLE test_tally (event_id uuid PRIMARY KEY, n int NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `INSERT INTO consumer_offsets (consumer, topic, partition, next_offset) VALUES ('c', 'events', 0, 30)`); err != nil {
		t.Fatal(err)
	}
	a := &applier{consumer: "c", topic: "events", pool: pool, projections: []pipeline.Projection[pgx.Tx]{tally{}}}
	evs := append(tallyEvents(40, 0, 0), tallyEvents(5, 1, 0)...)
	res, err := a.apply(ctx, evs, nil)
	if err != nil || res.applied != 15 || res.fenced != 30 || res.duplicates != 0 {
		t.Fatalf("applied %d, fenced %d, duplicates %d, %v; want 15, 30, 0", res.applied, res.fenced, res.duplicates, err)
	}
	var inboxed int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM inbox WHERE consumer = 'c'`).Scan(&inboxed); err != nil {
		t.Fatal(err)
	}
	if inboxed != 15 {
		t.Errorf("%d ids in the inbox, want the 15 applied", inboxed)
	}

	// Moved back, the partition's skipped events are applied, once.
	if _, err := pool.Exec(ctx, `UPDATE consumer_offsets SET next_offset = 0 WHERE consumer = 'c' AND partition = 0`); err != nil {
		t.Fatal(err)
	}
	res, err = a.apply(ctx, evs[:40], nil)
	if err != nil || res.applied != 30 || res.duplicates != 10 {
		t.Fatalf("again from 0: applied %d, duplicates %d, %v; want 30, 10", res.applied, res.duplicates, err)
	}
	var applied, twice int
	pool.QueryRow(ctx, `SELECT count(*), count(*) FILTER (WHERE n <> 1) FROM test_tally`).Scan(&applied, &twice)
	if applied != 45 || twice != 0 {
		t.Errorf("%d events applied, %d more than once; want 45, 0", applied, twice)
	}
}

type fakeErr struct{}

func (fakeErr) Error() string { return "no transaction waits on a lock yet" }

var errFake error = fakeErr{}

// A projection's gap stops its partition at the event: the events before
// it are applied and stored, the other partitions go on, the parked row
// and the offset point at the event, and an event a projection refuses for
// good (Permanent) parks the same way.
func TestGapStopsPartitionAtTheEvent(t *testing.T) {
	t.Parallel()
	pool, _ := pipelinetest.Pool(t)
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `CREATE TABLE test_tally (event_id uuid PRIMARY KEY, n int NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	a := &applier{consumer: "c", topic: "events", pool: pool, projections: []pipeline.Projection[pgx.Tx]{gapAt{"acme/p0", 5}, tally{}}}
	evs := append(tallyEvents(10, 0, 100), tallyEvents(10, 1, 0)...)
	res, err := a.apply(ctx, evs, nil)
	if err != nil {
		t.Fatal(err)
	}
	if res.applied != 14 || len(res.parks) != 1 || res.parks[0].partition != 0 || res.parks[0].offset != 104 || res.parks[0].reason != reasonGap {
		t.Errorf("applied %d, parks %+v; want 14 applied and partition 0 parked at 104", res.applied, res.parks)
	}
	if res.next[0].Offset != 104 || res.next[1].Offset != 10 {
		t.Errorf("offsets %v, want 0:104 1:10", res.next)
	}
	var n, parkedAt int64
	pool.QueryRow(ctx, `SELECT count(*) FROM test_tally`).Scan(&n)
	pool.QueryRow(ctx, `SELECT next_offset FROM projector_parked WHERE consumer = 'c' AND partition = 0`).Scan(&parkedAt)
	if n != 14 || parkedAt != 104 {
		t.Errorf("%d applied, parked at %d; want 14 and 104", n, parkedAt)
	}

	// Past the gap (an operator fixed it), the parked row goes away.
	a.projections = []pipeline.Projection[pgx.Tx]{tally{}}
	if _, err := a.apply(ctx, evs[4:10], nil); err != nil {
		t.Fatal(err)
	}
	pool.QueryRow(ctx, `SELECT count(*) FROM projector_parked`).Scan(&n)
	if n != 0 {
		t.Errorf("%d parked rows after the partition moved past its record", n)
	}

	a.projections = []pipeline.Projection[pgx.Tx]{refuse{}, tally{}}
	res, err = a.apply(ctx, tallyEvents(3, 2, 0), nil)
	if err != nil || len(res.parks) != 1 || res.parks[0].reason != reasonRefused || res.parks[0].offset != 0 {
		t.Errorf("refused event: %+v, %v", res.parks, err)
	}
}

// gapAt reports a version gap for the event of version v of aggregate agg.
type gapAt struct {
	agg string
	v   int64
}

func (gapAt) Name() string { return "gap" }

func (g gapAt) Apply(_ context.Context, _ pgx.Tx, ev pipeline.Event) error {
	if ev.AggregateID == g.agg && ev.Version == g.v {
		return &pipeline.VersionGapError{AggregateID: ev.AggregateID, Stored: g.v - 2, Got: g.v}
	}
	return nil
}

type refuse struct{}

func (refuse) Name() string { return "refuse" }

func (refuse) Apply(context.Context, pgx.Tx, pipeline.Event) error {
	return pipeline.Permanent(errFake)
}

// divideByZero raises a data error (22012) on the events of one aggregate.
type divideByZero struct{ agg string }

func (divideByZero) Name() string { return "divide" }

func (d divideByZero) Apply(ctx context.Context, tx pgx.Tx, ev pipeline.Event) error {
	if ev.AggregateID != d.agg {
		return nil
	}
	_, err := tx.Exec(ctx, `SELECT 1 / 0`)
	return err
}

// A data error on an event whose aggregate id (a record key, which a
// producer chose) holds a NUL and invalid UTF-8 still parks: the detail
// that names it is made storable rather than failing the batch for ever.
func TestDataErrorParksWhateverTheKey(t *testing.T) {
	t.Parallel()
	pool, _ := pipelinetest.Pool(t)
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `CREATE TABLE test_tally (event_id uuid PRIMARY KEY, n int NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	evs := append(tallyEvents(3, 0, 0), tallyEvents(3, 1, 0)...)
	hostile := "acme/\x00p1\xff"
	for i := 3; i < 6; i++ {
		evs[i].AggregateID = hostile
	}
	a := &applier{consumer: "c", topic: "events", pool: pool, projections: []pipeline.Projection[pgx.Tx]{tally{}, divideByZero{hostile}}}
	res, err := a.apply(ctx, evs, nil)
	if err != nil {
		t.Fatal(err)
	}
	if res.applied != 3 || len(res.parks) != 1 || res.parks[0].partition != 1 || res.parks[0].offset != 0 || res.parks[0].reason != reasonDataError {
		t.Errorf("applied %d, parks %+v; want 3 applied and partition 1 parked at 0 for a data error", res.applied, res.parks)
	}
	var detail string
	if err := pool.QueryRow(ctx, `SELECT detail FROM projector_parked WHERE consumer = 'c' AND partition = 1`).Scan(&detail); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(detail, `acme/\x00p1`+"\uFFFD") || !strings.Contains(detail, "SQLSTATE 22012") {
		t.Errorf("detail %q", detail)
	}
}
