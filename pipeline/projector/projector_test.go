package projector_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kadm"

	"github.com/onceflow/onceflow/examples/ledger"
	"github.com/onceflow/onceflow/pipeline"
	"github.com/onceflow/onceflow/pipeline/pipelinetest"
	"github.com/onceflow/onceflow/pipeline/projector"
)

// ledgerStreams produces accounts accounts with n events each (an opening,
// deposits, withdrawals, a rejection) and returns the balances they add up
// to and every event.
func ledgerStreams(tenant string, accounts, n int) (map[string]int64, []pipeline.Event) {
	balances := map[string]int64{}
	var evs []pipeline.Event
	streams := make([]*stream, accounts)
	for a := range streams {
		streams[a] = newStream(tenant, fmt.Sprintf("acc-%d", a))
		evs = append(evs, streams[a].next(ledger.AccountOpened{Currency: "EUR"}))
	}
	for i := 1; i < n; i++ {
		for a, s := range streams {
			var m pipeline.Message
			switch {
			case i%7 == 3:
				m = pipeline.CommandRejected{CommandType: "Withdraw", Reason: "insufficient_funds", Detail: "no"}
			case i%3 == 2:
				m = ledger.Withdrawn{Amount: int64(a + 1)}
				balances[s.id] -= int64(a + 1)
			default:
				m = ledger.Deposited{Amount: int64(10 * i)}
				balances[s.id] += int64(10 * i)
			}
			evs = append(evs, s.next(m))
		}
	}
	return balances, evs
}

func checkBalances(t *testing.T, e *env, tenant string, want map[string]int64) {
	t.Helper()
	for id, w := range want {
		got, _, err := e.balance(tenant, id)
		if err != nil || got != w {
			t.Errorf("balance of %s = %d (%v), want %d", id, got, err, w)
		}
	}
}

// Every event is applied once: balances, one command_status row per
// command with its outcome, one audit row and one inbox row per event,
// offsets at the end of the log, the same offsets committed to Kafka.
func TestAppliesEveryEventOnce(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 4)
	want, evs := ledgerStreams("acme", 20, 12)
	r := e.start(projector.Config{})
	e.emit(evs...)
	e.waitOffsets(projector.DefaultConsumer, e.endOffsets(), 30*time.Second)

	checkBalances(t, e, "acme", want)
	if n := e.count(`SELECT count(*) FROM audit_log`); n != int64(len(evs)) {
		t.Errorf("audit_log has %d rows, want %d", n, len(evs))
	}
	if n := e.count(`SELECT count(*) FROM inbox WHERE consumer = $1`, projector.DefaultConsumer); n != int64(len(evs)) {
		t.Errorf("inbox has %d rows, want %d", n, len(evs))
	}
	rejected := 0
	for _, ev := range evs {
		if _, ok := ev.Payload.(pipeline.CommandRejected); ok {
			rejected++
		}
	}
	if n := e.count(`SELECT count(*) FROM command_status WHERE status = 'rejected' AND reason = 'insufficient_funds'`); n != int64(rejected) {
		t.Errorf("rejected commands: %d, want %d", n, rejected)
	}
	if n := e.count(`SELECT count(*) FROM command_status WHERE status = 'accepted' AND cardinality(event_ids) = 1`); n != int64(len(evs)-rejected) {
		t.Errorf("accepted commands with their event: %d, want %d", n, len(evs)-rejected)
	}
	wantCount(t, r, "onceflow_projector_events_applied_total", float64(len(evs)))
	if got := r.metric("onceflow_projector_duplicates_total"); got != 0 {
		t.Errorf("duplicates = %v, want 0", got)
	}
	// Kafka sees the same offsets, for monitoring.
	ends := e.endOffsets()
	pipelinetest.Eventually(t, 10*time.Second, func() error {
		committed := e.kafkaCommitted(projector.DefaultConsumer)
		for p, o := range ends {
			if committed[p] != o {
				return fmt.Errorf("kafka has %v, want %v", committed, ends)
			}
		}
		return nil
	})
}

// Duplicates written straight into the events topic (the same event ids
// again, at new offsets) change nothing, with the projector running and
// after a restart.
func TestDuplicatesInTopicChangeNothing(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 3)
	want, evs := ledgerStreams("acme", 8, 6)
	r := e.start(projector.Config{})
	e.emit(evs...)
	e.waitOffsets(projector.DefaultConsumer, e.endOffsets(), 30*time.Second)
	before := e.snapshot()

	e.emit(evs...)         // every event again
	e.emit(evs[3], evs[3]) // one of them twice more, in one batch
	e.waitOffsets(projector.DefaultConsumer, e.endOffsets(), 30*time.Second)
	wantCount(t, r, "onceflow_projector_duplicates_total", float64(len(evs)+2))
	r.stop()

	// A new member reads from the stored offsets: nothing is read twice.
	e.emit(evs[:5]...)
	r2 := e.start(projector.Config{})
	e.waitOffsets(projector.DefaultConsumer, e.endOffsets(), 30*time.Second)
	wantCount(t, r2, "onceflow_projector_duplicates_total", 5) // after the restart
	checkBalances(t, e, "acme", want)
	if after := e.snapshot(); after != before {
		t.Errorf("read models changed:\nbefore %s\nafter  %s", before, after)
	}
}

// snapshot is a checksum of the read models.
func (e *env) snapshot() string {
	e.t.Helper()
	var s string
	err := e.pool.QueryRow(context.Background(), `SELECT
		(SELECT md5(coalesce(string_agg(a::text, '|' ORDER BY tenant, account_id), '')) FROM accounts a) || ' ' ||
		(SELECT md5(coalesce(string_agg(c::text, '|' ORDER BY command_id), '')) FROM command_status c) || ' ' ||
		(SELECT md5(coalesce(string_agg(l::text, '|' ORDER BY event_id), '')) FROM audit_log l)`).Scan(&s)
	if err != nil {
		e.t.Fatal(err)
	}
	return s
}

func (e *env) kafkaCommitted(group string) map[int32]int64 {
	e.t.Helper()
	cl := pipelinetest.Client(e.t, e.brokers)
	req := map[int32]int64{}
	resp, err := kadm.NewClient(cl).FetchOffsets(context.Background(), group)
	if err != nil {
		return req
	}
	for _, ps := range resp {
		for p, o := range ps {
			req[p] = o.At
		}
	}
	return req
}

// An out-of-order event (version 3 before 2) parks its partition: nothing
// after it on that partition is applied, not even other accounts' events;
// the other partitions go on; the stored offset and projector_parked point
// at the event; a restart parks again rather than skip it; so does an
// operator's unpark while the cause is still there.
func TestOutOfOrderEventParksPartition(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 2)
	r := e.start(projector.Config{ParkCheckInterval: 50 * time.Millisecond})

	a := newStream("acme", "a")
	opened := e.emit(a.next(ledger.AccountOpened{Currency: "EUR"}))
	v2 := a.next(ledger.Deposited{Amount: 5})
	v3 := a.next(ledger.Deposited{Amount: 7})
	gapRec := e.emit(v3)[0]
	e.emit(v2)
	part := opened[0].Partition
	// Another account on the same partition, after the gap, and one on the
	// other partition.
	var same, other *stream
	for i := 0; same == nil || other == nil; i++ {
		s := newStream("acme", fmt.Sprintf("b-%d", i))
		rec := e.emit(s.next(ledger.AccountOpened{Currency: "EUR"}))[0]
		if rec.Partition == part && same == nil {
			same = s
		} else if rec.Partition != part && other == nil {
			other = s
		}
	}
	e.emit(other.next(ledger.Deposited{Amount: 3}))

	pipelinetest.Eventually(t, 20*time.Second, func() error {
		if _, v, err := e.balance("acme", other.id); err != nil || v != 2 {
			return fmt.Errorf("other partition not applied: version %d, %v", v, err)
		}
		return e.parkedAt(part, gapRec.Offset, "version-gap")
	})
	if bal, v, _ := e.balance("acme", "a"); bal != 0 || v != 1 {
		t.Errorf("account a: balance %d version %d, want 0 and 1 (nothing after the gap applied)", bal, v)
	}
	if _, _, err := e.balance("acme", same.id); !errors.Is(err, pgx.ErrNoRows) {
		t.Errorf("an account after the gap on the parked partition was applied (err %v)", err)
	}
	if got := e.storedOffsets(projector.DefaultConsumer)[part]; got != gapRec.Offset {
		t.Errorf("stored offset of parked partition = %d, want %d (the gap)", got, gapRec.Offset)
	}
	wantCount(t, r, "onceflow_projector_version_gaps_total", 1)
	if got := r.p.Parked(); len(got) != 1 {
		t.Errorf("parked partitions = %v, want one", got)
	}

	// An operator unparks: the projector tries again and parks again.
	if _, err := e.pool.Exec(context.Background(), `DELETE FROM projector_parked`); err != nil {
		t.Fatal(err)
	}
	pipelinetest.Eventually(t, 20*time.Second, func() error {
		if got := r.metric("onceflow_projector_version_gaps_total"); got != 2 {
			return fmt.Errorf("version gaps = %v, want 2", got)
		}
		return e.parkedAt(part, gapRec.Offset, "version-gap")
	})
	r.stop()

	// A restart finds the gap again.
	r2 := e.start(projector.Config{})
	pipelinetest.Eventually(t, 20*time.Second, func() error {
		if got := r2.metric("onceflow_projector_version_gaps_total"); got != 1 {
			return fmt.Errorf("version gaps after restart = %v, want 1", got)
		}
		return nil
	})
	if bal, v, _ := e.balance("acme", "a"); bal != 0 || v != 1 {
		t.Errorf("after restart account a: balance %d version %d, want 0 and 1", bal, v)
	}
}

func (e *env) parkedAt(part int32, offset int64, reason string) error {
	var off int64
	var why string
	err := e.pool.QueryRow(context.Background(), `SELECT next_offset, reason FROM projector_parked WHERE consumer = $1 AND topic = $2 AND partition = $3`,
		projector.DefaultConsumer, e.topics.Events(), part).Scan(&off, &why)
	if err != nil {
		return fmt.Errorf("projector_parked row of partition %d: %w", part, err)
	}
	if off != offset || why != reason {
		return fmt.Errorf("parked at %d for %s, want %d for %s", off, why, offset, reason)
	}
	return nil
}

// An event that cannot be decoded parks its partition at that record; the
// records before it are applied, the other partitions go on.
func TestUndecodableEventParksPartition(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 1)
	r := e.start(projector.Config{})
	a := newStream("acme", "a")
	e.emit(a.next(ledger.AccountOpened{Currency: "EUR"}))
	bad := e.record(a.next(ledger.Deposited{Amount: 1}))
	bad.Value = []byte{0, 0, 0, 0, 99, 1, 2} // schema id 99 does not exist
	bad = e.produce(bad)[0]
	e.emit(a.next(ledger.Deposited{Amount: 2}))
	pipelinetest.Eventually(t, 20*time.Second, func() error { return e.parkedAt(0, bad.Offset, "undecodable") })
	if bal, v, err := e.balance("acme", "a"); bal != 0 || v != 1 || err != nil {
		t.Errorf("account a: balance %d version %d (%v), want 0 and 1", bal, v, err)
	}
	wantCount(t, r, "onceflow_projector_parked_partitions", 1) // set once the parking transaction committed
}

// counting is a user projection with no idempotence of its own and no
// version: it counts Apply calls per event, so a second Apply of an event
// shows. Only the inbox stands between it and a duplicate.
type counting struct{}

func (counting) Name() string { return "counting" }

func (counting) Apply(ctx context.Context, tx pgx.Tx, ev pipeline.Event) error {
	_, err := tx.Exec(ctx, `INSERT INTO test_counts (event_id, n) VALUES ($1, 1)
		ON CONFLICT (event_id) DO UPDATE SET n = test_counts.n + 1`, ev.ID.String())
	return err
}

// The inbox holds an id whatever day it was stored on: an event first seen
// yesterday (another partition of the inbox) is still a duplicate today,
// for a user projection that has nothing but the inbox.
func TestInboxSpansDays(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 1)
	ctx := context.Background()
	if _, err := e.pool.Exec(ctx, `CREATE TABLE test_counts (event_id uuid PRIMARY KEY, n int NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	// One event whose command id is a UUIDv7 (the lookup starts a day
	// before it was minted) stored 20 hours ago, one whose command id is a
	// UUIDv5 (looked up everywhere) stored a day ago.
	a := newStream("acme", "a")
	seenV7 := a.next(ledger.AccountOpened{Currency: "EUR"})
	a.namedIDs = true
	seenV5 := a.next(ledger.Deposited{Amount: 1})
	fresh := a.next(ledger.Deposited{Amount: 1})
	for _, s := range []struct {
		ev  pipeline.Event
		ago string
	}{{seenV7, "20 hours"}, {seenV5, "1 day"}} {
		if _, err := e.pool.Exec(ctx, `INSERT INTO inbox (consumer, event_id, received_at) VALUES ($1, $2, now() - $3::interval)`,
			projector.DefaultConsumer, s.ev.ID.String(), s.ago); err != nil {
			t.Fatal(err)
		}
	}
	r := e.start(projector.Config{}, counting{})
	e.emit(seenV7, seenV5, fresh, seenV5, seenV7)
	e.waitOffsets(projector.DefaultConsumer, e.endOffsets(), 20*time.Second)
	var n int64
	for _, ev := range []pipeline.Event{seenV7, seenV5} {
		if err := e.pool.QueryRow(ctx, `SELECT coalesce(sum(n), 0) FROM test_counts WHERE event_id = $1`, ev.ID.String()).Scan(&n); err != nil || n != 0 {
			t.Errorf("event %s stored on an earlier day applied %d times (%v), want 0", ev.ID, n, err)
		}
	}
	if err := e.pool.QueryRow(ctx, `SELECT n FROM test_counts WHERE event_id = $1`, fresh.ID.String()).Scan(&n); err != nil || n != 1 {
		t.Errorf("new event applied %d times (%v), want 1", n, err)
	}
	wantCount(t, r, "onceflow_projector_duplicates_total", 4)
}

// A batch whose connection is terminated by the server inside its
// transaction (pg_terminate_backend) is rolled back and applied again:
// every event once.
func TestConnectionTerminatedInsideTransaction(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 2)
	ctx := context.Background()
	if _, err := e.pool.Exec(ctx, `CREATE TABLE test_counts (event_id uuid PRIMARY KEY, n int NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	want, evs := ledgerStreams("acme", 5, 8)
	terminated := make(chan struct{})
	var once sync.Once
	hold := func(point string, pid uint32) {
		if point != projector.HoldInTx {
			return
		}
		once.Do(func() {
			if _, err := e.pool.Exec(ctx, `SELECT pg_terminate_backend($1)`, int32(pid)); err != nil {
				t.Errorf("terminate: %v", err)
			}
			close(terminated)
		})
	}
	projections := append(ledgerProjections(), counting{})
	r := e.start(projector.Config{Hold: hold, MaxBackoff: 100 * time.Millisecond}, projections...)
	e.emit(evs...)
	e.waitOffsets(projector.DefaultConsumer, e.endOffsets(), 30*time.Second)
	<-terminated
	checkBalances(t, e, "acme", want)
	if n := e.count(`SELECT count(*) FROM test_counts WHERE n <> 1`); n != 0 {
		t.Errorf("%d events applied more than once", n)
	}
	if n := e.count(`SELECT count(*) FROM test_counts`); n != int64(len(evs)) {
		t.Errorf("%d events applied, want %d", n, len(evs))
	}
	if got := r.metric("onceflow_projector_batch_errors_total"); got < 1 {
		t.Errorf("batch errors = %v, want the terminated batch counted", got)
	}
}

// Without today's inbox partition (no janitor ran, the projector's start
// was long ago) a batch fails once, the projector creates the partitions
// and applies it: nothing is lost.
func TestCreatesMissingInboxPartition(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 1)
	ctx := context.Background()
	r := e.start(projector.Config{MaxBackoff: 50 * time.Millisecond})
	var today string
	if err := e.pool.QueryRow(ctx, `SELECT 'inbox_p' || to_char((now() AT TIME ZONE 'UTC')::date, 'YYYYMMDD')`).Scan(&today); err != nil {
		t.Fatal(err)
	}
	if _, err := e.pool.Exec(ctx, `DROP TABLE `+today); err != nil {
		t.Fatal(err)
	}
	a := newStream("acme", "a")
	e.emit(a.next(ledger.AccountOpened{Currency: "EUR"}), a.next(ledger.Deposited{Amount: 4}))
	e.waitOffsets(projector.DefaultConsumer, e.endOffsets(), 20*time.Second)
	if bal, v, err := e.balance("acme", "a"); bal != 4 || v != 2 || err != nil {
		t.Errorf("account a: balance %d version %d (%v), want 4 and 2", bal, v, err)
	}
	if n := e.count(`SELECT count(*) FROM ` + today); n != 2 {
		t.Errorf("today's inbox partition holds %d rows, want 2", n)
	}
	_ = r
}
