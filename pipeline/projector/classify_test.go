package projector_test

import (
	"context"
	"errors"
	"fmt"
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

// unlucky is the amount the picky projections cannot take: an error of no
// known kind (no SQLSTATE, not pipeline.Permanent), as the webhooks
// projection's JSON encoding of a time before year 0 was.
const unlucky = 13

var errUnlucky = errors.New("json: unsupported value: the amount 13")

// pickyBatch fails a whole batch that holds an unlucky deposit, without
// saying which event; pickyPlain fails the event itself.
type pickyBatch struct{ notes }

func (pickyBatch) Name() string { return "picky" }

func (p pickyBatch) ApplyBatch(ctx context.Context, tx pgx.Tx, evs []pipeline.Event) ([]error, error) {
	for _, ev := range evs {
		if d, ok := ev.Payload.(ledger.Deposited); ok && d.Amount == unlucky {
			return nil, fmt.Errorf("webhook body: %w", errUnlucky)
		}
	}
	return batchNotes{}.ApplyBatch(ctx, tx, evs)
}

type pickyPlain struct{ notes }

func (pickyPlain) Name() string { return "picky" }

func (p pickyPlain) Apply(ctx context.Context, tx pgx.Tx, ev pipeline.Event) error {
	if d, ok := ev.Payload.(ledger.Deposited); ok && d.Amount == unlucky {
		return errUnlucky
	}
	return p.notes.Apply(ctx, tx, ev)
}

// An error a projection returns that is of no known kind — neither a data
// error nor pipeline.Permanent (park at once), nor a class known to pass
// (the connection, a serialization failure, a missing table: retried for
// as long as it lasts) — is retried MaxUnknownFailures times, each
// counted, then taken as the event's: the partition parks on the event
// that raises it (found among the batch's as a data error's is), reason
// projection-error, the error in the detail; the events before it and the
// other partitions are applied once. An operator who decides the event
// must go skips it: `onceflow projections skip` (projector.Skip) refuses
// any offset but the parked one, moves the partition past it, records
// who, why and what in projector_skips, and the projector applies the
// rest, once, without the skipped event.
func TestUnknownErrorParksAfterTriesAndCanBeSkipped(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		proj pipeline.Projection[pgx.Tx]
	}{{"batch", pickyBatch{}}, {"plain", pickyPlain{}}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			testUnknownErrorParks(t, tc.proj)
		})
	}
}

func testUnknownErrorParks(t *testing.T, proj pipeline.Projection[pgx.Tx]) {
	e := newEnv(t, 2)
	ctx := context.Background()
	if _, err := e.pool.Exec(ctx, notesSQL); err != nil {
		t.Fatal(err)
	}
	const perPartition, badAt = 8, 5
	evs := map[int32][]pipeline.Event{}
	var recs []*kgo.Record
	for part := int32(0); part < 2; part++ {
		s := newStream("acme", fmt.Sprintf("p%d", part))
		for i := range perPartition {
			amount := int64(1)
			if part == 0 && i == badAt {
				amount = unlucky
			}
			ev := s.next(ledger.Deposited{Amount: amount})
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
	const tries = 3
	r := e.start(projector.Config{ParkCheckInterval: 50 * time.Millisecond, MaxBackoff: 50 * time.Millisecond, MaxUnknownFailures: tries}, proj)

	want := map[int32]int64{0: badAt, 1: perPartition}
	e.waitOffsets(projector.DefaultConsumer, map[int32]int64{1: perPartition}, 30*time.Second)
	pipelinetest.Eventually(t, 30*time.Second, func() error { return e.parkedAt(0, badAt, "projection-error") })
	detail := e.parkedRows()[0]
	bad := evs[0][badAt]
	for _, s := range []string{"picky:", bad.ID.String(), bad.AggregateID, errUnlucky.Error(), fmt.Sprintf("%d tries", tries)} {
		if !strings.Contains(detail, s) {
			t.Errorf("park detail %q lacks %q", detail, s)
		}
	}
	if got := e.storedOffsets(projector.DefaultConsumer); !sameOffsets(got, want) {
		t.Errorf("stored offsets %v, want %v", got, want)
	}
	e.wantApplied(t, evs, want)
	if got := r.metric("onceflow_projector_batch_errors_total", "class", "other"); got < tries {
		t.Errorf("batch errors of class other = %v, want at least %d (each try counted)", got, tries)
	}
	// The gauge follows the parked row: it is set once the row's
	// transaction has committed.
	pipelinetest.Eventually(t, 5*time.Second, func() error {
		if got := r.metric("onceflow_projector_parked_partitions", "reason", "projection-error"); got != 1 {
			return fmt.Errorf("parked partitions with reason projection-error = %v, want 1", got)
		}
		return nil
	})

	// Skipped on purpose: only at the parked offset.
	topic := e.topics.Events()
	if _, err := projector.Skip(ctx, e.pool, projector.Skipping{Consumer: projector.DefaultConsumer, Topic: topic, Partition: 0, Offset: badAt + 1,
		Note: "wrong offset", Operator: "alice"}); !errors.Is(err, projector.ErrNotParked) {
		t.Errorf("Skip at an offset the partition is not parked at: %v, want ErrNotParked", err)
	}
	if _, err := projector.Skip(ctx, e.pool, projector.Skipping{Consumer: projector.DefaultConsumer, Topic: topic, Partition: 1, Offset: 0,
		Note: "not parked", Operator: "alice"}); !errors.Is(err, projector.ErrNotParked) {
		t.Errorf("Skip of a partition that is not parked: %v, want ErrNotParked", err)
	}
	sk, err := projector.Skip(ctx, e.pool, projector.Skipping{Consumer: projector.DefaultConsumer, Topic: topic, Partition: 0, Offset: badAt,
		Note: "amount 13 from a test producer; refunded by hand", Operator: "alice"})
	if err != nil {
		t.Fatal(err)
	}
	if sk.To != badAt+1 || sk.Reason != "projection-error" || sk.Detail != detail {
		t.Errorf("skip %+v, want to %d with the park's reason and detail", sk, badAt+1)
	}
	all := map[int32]int64{0: perPartition, 1: perPartition}
	e.waitOffsets(projector.DefaultConsumer, all, 30*time.Second)
	applied := map[int32][]pipeline.Event{0: append(append([]pipeline.Event{}, evs[0][:badAt]...), evs[0][badAt+1:]...), 1: evs[1]}
	e.wantAppliedEvents(t, applied, bad)
	var note, operator, reason string
	var from, to int64
	if err := e.pool.QueryRow(ctx, `SELECT from_offset, to_offset, reason, note, operator FROM projector_skips
		WHERE consumer = $1 AND topic = $2 AND partition = 0`, projector.DefaultConsumer, topic).Scan(&from, &to, &reason, &note, &operator); err != nil {
		t.Fatalf("the skip's audit row: %v", err)
	}
	if from != badAt || to != badAt+1 || reason != "projection-error" || operator != "alice" || !strings.HasPrefix(note, "amount 13") {
		t.Errorf("audit row: %d..%d %s %q by %q", from, to, reason, note, operator)
	}
	if n := e.count(`SELECT count(*) FROM projector_parked`); n != 0 {
		t.Errorf("%d parked rows after the skip", n)
	}
}

// wantAppliedEvents checks that each of evs was applied once, and skipped
// never.
func (e *env) wantAppliedEvents(t *testing.T, evs map[int32][]pipeline.Event, skipped pipeline.Event) {
	t.Helper()
	for part, list := range evs {
		for _, ev := range list {
			if n := e.count(`SELECT coalesce(max(n), 0) FROM test_notes WHERE event_id = $1`, ev.ID.String()); n != 1 {
				t.Errorf("partition %d: event %s applied %d times, want once", part, ev.ID, n)
			}
		}
	}
	if n := e.count(`SELECT count(*) FROM test_notes WHERE event_id = $1`, skipped.ID.String()); n != 0 {
		t.Errorf("the skipped event was applied")
	}
}

// A batch on the events topic that decompresses beyond the projector's
// bound (a few hundred bytes of zstd that make 8 MiB) is not read: its
// partition parks at it, reason batch-too-large, the events before it
// applied and the other partition going on; `onceflow projections skip`
// at its offset moves the partition past the whole batch, and the events
// after it are applied.
func TestBatchTooLargeParksAndCanBeSkipped(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 2)
	e.maxDecompress = 1 << 20
	ctx := context.Background()
	if _, err := e.pool.Exec(ctx, notesSQL); err != nil {
		t.Fatal(err)
	}
	prod := pipelinetest.Client(t, e.brokers, kgo.RecordPartitioner(kgo.ManualPartitioner()))
	bomber := pipelinetest.Client(t, e.brokers, kgo.RecordPartitioner(kgo.ManualPartitioner()),
		kgo.ProducerBatchCompression(kgo.ZstdCompression()), kgo.ProducerBatchMaxBytes(64<<20))
	streams := []*stream{newStream("acme", "p0"), newStream("acme", "p1")}
	send := func(cl *kgo.Client, part int32, value []byte) *kgo.Record {
		t.Helper()
		r := e.record(streams[part].next(ledger.Deposited{Amount: 1}))
		r.Partition = part
		if value != nil {
			r.Value = value
		}
		got, err := cl.ProduceSync(ctx, r).First()
		if err != nil {
			t.Fatal(err)
		}
		return got
	}
	send(prod, 0, nil)
	bomb := send(bomber, 0, make([]byte, 8<<20))
	send(prod, 1, nil)
	e.start(projector.Config{ParkCheckInterval: 50 * time.Millisecond, MaxBackoff: 50 * time.Millisecond}, batchNotes{})
	e.waitOffsets(projector.DefaultConsumer, map[int32]int64{1: 1}, 30*time.Second)
	pipelinetest.Eventually(t, 30*time.Second, func() error { return e.parkedAt(0, bomb.Offset, "batch-too-large") })
	if n := e.count(`SELECT count(*) FROM test_notes`); n != 2 {
		t.Errorf("%d events applied, want the two around the bomb's partition", n)
	}
	sk, err := projector.Skip(ctx, e.pool, projector.Skipping{Consumer: projector.DefaultConsumer, Topic: e.topics.Events(), Partition: 0,
		Offset: bomb.Offset, Note: "8 MiB of zeros", Operator: "alice"})
	if err != nil || sk.To != bomb.Offset+1 || sk.Reason != "batch-too-large" {
		t.Fatalf("Skip: %+v, %v", sk, err)
	}
	after := send(prod, 0, nil)
	e.waitOffsets(projector.DefaultConsumer, map[int32]int64{0: after.Offset + 1, 1: 1}, 30*time.Second)
	if n := e.count(`SELECT count(*) FROM test_notes`); n != 3 {
		t.Errorf("%d events applied after the skip, want 3", n)
	}
}
