package projector_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/onceflow/onceflow/examples/ledger"
	"github.com/onceflow/onceflow/pipeline"
	"github.com/onceflow/onceflow/pipeline/pipelinetest"
	"github.com/onceflow/onceflow/pipeline/postgres"
	"github.com/onceflow/onceflow/pipeline/projector"
)

// A database crash after asynchronous commits loses the last ones whole:
// their effects, their inbox rows and their offsets
// (docs/projector.md#asynchronous-commit). The test makes the database
// lose them as a crash would, in one transaction, while the projector
// runs: on one partition when nothing more arrives on it (found by the
// projector's check of its offsets), on another just before new events
// do (found by the next batch's transaction, if the check is not first).
// Either way the projector reads the lost events again: each event is
// applied exactly once in the end, none is missing, and the offsets reach
// the end of the log again.
func TestLostCommitsAreReadAgain(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 2)
	ctx := context.Background()
	if _, err := e.pool.Exec(ctx, `CREATE TABLE test_counts (event_id uuid PRIMARY KEY, n int NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	r := e.start(projector.Config{}, counting{})

	streams := make([]*stream, 8) // keyed by account: on both partitions
	for i := range streams {
		streams[i] = newStream("acme", fmt.Sprintf("acc-%d", i))
	}
	var all []*kgo.Record
	emit := func(n int) {
		evs := make([]pipeline.Event, n)
		for i := range evs {
			evs[i] = streams[i%len(streams)].next(ledger.Deposited{Amount: 1})
		}
		all = append(all, e.emit(evs...)...)
	}
	emit(40)
	e.waitOffsets(projector.DefaultConsumer, e.endOffsets(), 30*time.Second)

	// lose makes the database forget what the projector committed on
	// partition part from offset from on.
	lose := func(part int32, from int64) int {
		var ids []string
		for _, rec := range all {
			if rec.Partition == part && rec.Offset >= from {
				ids = append(ids, idOf(t, rec))
			}
		}
		if len(ids) == 0 {
			t.Fatalf("no events on partition %d from %d", part, from)
		}
		b := &pgx.Batch{}
		b.Queue(`BEGIN`)
		b.Queue(`DELETE FROM test_counts WHERE event_id = ANY ($1::uuid[])`, ids)
		b.Queue(`DELETE FROM inbox WHERE consumer = $1 AND event_id = ANY ($2::uuid[])`, projector.DefaultConsumer, ids)
		b.Queue(`UPDATE consumer_offsets SET next_offset = $4 WHERE consumer = $1 AND topic = $2 AND partition = $3`,
			projector.DefaultConsumer, e.topics.Events(), part, from)
		b.Queue(`COMMIT`)
		if err := e.pool.SendBatch(ctx, b).Close(); err != nil {
			t.Fatal(err)
		}
		return len(ids)
	}
	first, second := partitionsWithEvents(t, all)

	// Partition first loses its last commits and gets nothing new.
	lost := lose(first, firstOffset(all, first)+5)
	t.Logf("partition %d lost %d events", first, lost)
	e.waitOffsets(projector.DefaultConsumer, e.endOffsets(), 30*time.Second)

	// Partition second loses its last commits, and new events arrive.
	lost = lose(second, firstOffset(all, second)+3)
	t.Logf("partition %d lost %d events", second, lost)
	emit(20)
	e.waitOffsets(projector.DefaultConsumer, e.endOffsets(), 30*time.Second)

	pipelinetest.Eventually(t, 10*time.Second, func() error {
		var rows, total, wrong int64
		if err := e.pool.QueryRow(ctx, `SELECT count(*), coalesce(sum(n), 0), count(*) FILTER (WHERE n <> 1) FROM test_counts`).Scan(&rows, &total, &wrong); err != nil {
			return err
		}
		if rows != int64(len(all)) || total != int64(len(all)) || wrong != 0 {
			return fmt.Errorf("%d events applied %d times (%d not once), want each of %d once", rows, total, wrong, len(all))
		}
		return nil
	})
	if n := e.count(`SELECT count(*) FROM inbox WHERE consumer = $1`, projector.DefaultConsumer); n != int64(len(all)) {
		t.Errorf("inbox has %d rows, want %d", n, len(all))
	}
	if n := r.metric("onceflow_projector_rewinds_total"); n < 2 {
		t.Errorf("onceflow_projector_rewinds_total = %v, want a rewind for each partition that lost commits", n)
	}
}

// idOf is the event id a record carries.
func idOf(t *testing.T, rec *kgo.Record) string {
	t.Helper()
	for _, h := range rec.Headers {
		if h.Key == pipeline.HeaderEventID {
			return string(h.Value)
		}
	}
	t.Fatalf("record at %d/%d has no event-id header", rec.Partition, rec.Offset)
	return ""
}

func firstOffset(recs []*kgo.Record, part int32) int64 {
	first := int64(-1)
	for _, r := range recs {
		if r.Partition == part && (first < 0 || r.Offset < first) {
			first = r.Offset
		}
	}
	return first
}

// partitionsWithEvents returns two partitions that have at least ten
// records each.
func partitionsWithEvents(t *testing.T, recs []*kgo.Record) (int32, int32) {
	t.Helper()
	n := map[int32]int{}
	for _, r := range recs {
		n[r.Partition]++
	}
	var parts []int32
	for p, c := range n {
		if c >= 10 {
			parts = append(parts, p)
		}
	}
	if len(parts) < 2 {
		t.Fatalf("records by partition: %v, want two partitions of ten or more", n)
	}
	return parts[0], parts[1]
}

// The projector tells ingest which commands' outcomes it committed
// (postgres.OutcomesChannel), so their ?wait= answers at once: every
// command is named, and by the time a notification arrives its commands'
// outcomes are in command_status. Both ways of committing: the
// notification sent by the transaction itself (asynchronous commit), and
// after the commit on its own (SynchronousCommit).
func TestOutcomesNotifiedAfterTheyAreVisible(t *testing.T) {
	t.Parallel()
	for _, synchronous := range []bool{false, true} {
		t.Run(fmt.Sprintf("synchronous=%v", synchronous), func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, 2)
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			conn, err := pgx.Connect(ctx, e.url)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close(context.Background())
			if _, err := conn.Exec(ctx, "LISTEN "+postgres.OutcomesChannel); err != nil {
				t.Fatal(err)
			}
			e.start(projector.Config{SynchronousCommit: synchronous})
			_, evs := ledgerStreams("acme", 5, 4)
			want := map[pipeline.ID]bool{}
			for _, ev := range evs {
				want[ev.CommandID] = true
			}
			e.emit(evs...)
			for len(want) > 0 {
				n, err := conn.WaitForNotification(ctx)
				if err != nil {
					t.Fatalf("%d commands never named: %v", len(want), err)
				}
				ids, err := postgres.ParseOutcomePayload(n.Payload)
				if err != nil {
					t.Fatalf("payload %q: %v", n.Payload, err)
				}
				var pending int
				strs := make([]string, len(ids))
				for i, id := range ids {
					strs[i] = id.String()
					delete(want, id)
				}
				if err := e.pool.QueryRow(ctx, `SELECT count(*) FROM unnest($1::uuid[]) AS id
					WHERE NOT EXISTS (SELECT 1 FROM command_status c WHERE c.command_id = id AND c.status <> 'pending')`, strs).Scan(&pending); err != nil {
					t.Fatal(err)
				}
				if pending > 0 {
					t.Errorf("a notification named %d commands whose outcome was not in command_status yet", pending)
				}
			}
		})
	}
}
