package projector_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/onceflow/onceflow/examples/ledger"
	"github.com/onceflow/onceflow/examples/ledger/accounts"
	"github.com/onceflow/onceflow/pipeline"
	"github.com/onceflow/onceflow/pipeline/kafka"
	"github.com/onceflow/onceflow/pipeline/postgres"
	"github.com/onceflow/onceflow/pipeline/projector"
)

// depositStreams are accounts whose v-th event deposits v, so a reader can
// check any (balance, version) it sees: balance = 2 + 3 + ... + version.
type depositStreams struct {
	streams []*stream
	next    int
}

func expectedBalance(version int64) int64 { return version*(version+1)/2 - 1 }

func (d *depositStreams) event() pipeline.Event {
	s := d.streams[d.next%len(d.streams)]
	d.next++
	if s.version == 0 {
		return s.next(ledger.AccountOpened{Currency: "EUR"})
	}
	return s.next(ledger.Deposited{Amount: s.version + 1})
}

func newDepositStreams(n int) *depositStreams {
	d := &depositStreams{}
	for i := 0; i < n; i++ {
		d.streams = append(d.streams, newStream("acme", fmt.Sprintf("r-%d", i)))
	}
	return d
}

// reader reads the accounts table the way ingest answers GET
// /v1/accounts/{id}, over and over, and records anything a user must never
// see: an error, an account going back a version or disappearing, a
// balance that does not match its version, fewer accounts than before.
type reader struct {
	reads    atomic.Int64
	mu       sync.Mutex
	problems []string
}

func (r *reader) problem(format string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.problems) < 20 {
		r.problems = append(r.problems, fmt.Sprintf(format, args...))
	}
}

func (r *reader) run(ctx context.Context, url string) {
	pool, err := postgres.Connect(ctx, url, 2)
	if err != nil {
		r.problem("connect: %v", err)
		return
	}
	defer pool.Close()
	last := map[string]int64{}
	for ctx.Err() == nil {
		rows, err := pool.Query(ctx, `SELECT account_id, balance, version FROM accounts WHERE tenant = 'acme'`)
		if err != nil {
			if ctx.Err() == nil {
				r.problem("read accounts: %v", err)
			}
			continue
		}
		seen := map[string]bool{}
		var id string
		var bal, ver int64
		_, err = pgx.ForEachRow(rows, []any{&id, &bal, &ver}, func() error {
			seen[id] = true
			if ver < last[id] {
				r.problem("%s went back from version %d to %d", id, last[id], ver)
			}
			if bal != expectedBalance(ver) {
				r.problem("%s at version %d has balance %d, want %d", id, ver, bal, expectedBalance(ver))
			}
			last[id] = ver
			return nil
		})
		if err != nil && ctx.Err() == nil {
			r.problem("read accounts: %v", err)
		}
		for id := range last {
			if !seen[id] && err == nil {
				r.problem("%s disappeared", id)
			}
		}
		r.reads.Add(1)
	}
}

// A rebuild under live traffic: events keep coming and the live projector
// keeps applying them while accounts is rebuilt from the start of the log;
// readers never fail, never see an account go back or vanish; at the swap
// the rebuilt table equals the live one (same checksum at the same
// offsets); afterwards the live projector goes on writing the new table.
func TestRebuildUnderLiveTraffic(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 4)
	ctx := context.Background()
	d := newDepositStreams(40)
	var evs []pipeline.Event
	for i := 0; i < 40*50; i++ {
		evs = append(evs, d.event())
	}
	e.emit(evs...)
	live := e.start(projector.Config{MaxPollRecords: 300})
	e.waitOffsets(projector.DefaultConsumer, e.endOffsets(), 30*time.Second)

	trafficCtx, stopTraffic := context.WithCancel(ctx)
	var wg sync.WaitGroup
	var produced atomic.Int64
	wg.Add(1)
	go func() { // live traffic
		defer wg.Done()
		for trafficCtx.Err() == nil {
			recs := make([]*kgo.Record, 10)
			for i := range recs {
				recs[i] = e.record(d.event())
			}
			if err := e.prod.ProduceSync(ctx, recs...).FirstErr(); err != nil {
				t.Errorf("produce: %v", err)
				return
			}
			produced.Add(int64(len(recs)))
			time.Sleep(5 * time.Millisecond)
		}
	}()
	rd := &reader{}
	for i := 0; i < 2; i++ {
		wg.Add(1)
		go func() { defer wg.Done(); rd.run(trafficCtx, e.url) }()
	}

	rb, err := projector.NewRebuild(projector.RebuildConfig{
		Topic: e.topics.Events(), Projection: accounts.Projection{}, Verify: true, MaxPollRecords: 500,
	}, kafka.Config{Brokers: e.brokers}, e.pool, e.serde, quietLogger())
	if err != nil {
		t.Fatal(err)
	}
	res, err := rb.Run(ctx)
	if err != nil {
		t.Fatalf("rebuild: %v", err)
	}
	readsAtSwap, producedAtSwap := rd.reads.Load(), produced.Load()
	time.Sleep(300 * time.Millisecond) // some traffic and reads after the swap
	stopTraffic()
	wg.Wait()

	if len(res.Tables) != 1 {
		t.Fatalf("swapped tables: %+v", res.Tables)
	}
	sw := res.Tables[0]
	if sw.LiveRows != 40 || sw.RebuiltRows != sw.LiveRows || sw.LiveChecksum != sw.RebuiltChecksum {
		t.Errorf("at offsets %v: live %d rows %s, rebuilt %d rows %s; want equal, 40 rows",
			res.Offsets, sw.LiveRows, sw.LiveChecksum, sw.RebuiltRows, sw.RebuiltChecksum)
	}
	t.Logf("swapped at %v after applying %d events in %s; %d events produced and %d reads before the swap, %d and %d after",
		res.Offsets, res.Applied, res.Duration.Round(time.Millisecond), producedAtSwap, readsAtSwap,
		produced.Load()-producedAtSwap, rd.reads.Load()-readsAtSwap)
	if producedAtSwap == 0 || readsAtSwap < 10 || rd.reads.Load() == readsAtSwap {
		t.Errorf("not much happened around the rebuild: %d events produced, %d reads", produced.Load(), rd.reads.Load())
	}
	for _, p := range rd.problems {
		t.Error("reader:", p)
	}

	// The live projector writes the new table; everything adds up.
	e.waitOffsets(projector.DefaultConsumer, e.endOffsets(), 30*time.Second)
	for _, s := range d.streams {
		bal, ver, err := e.balance("acme", s.id)
		if err != nil || ver != s.version || bal != expectedBalance(ver) {
			t.Errorf("%s: balance %d version %d (%v), want version %d balance %d", s.id, bal, ver, err, s.version, expectedBalance(s.version))
		}
	}
	if n := e.count(`SELECT count(*) FROM pg_namespace WHERE nspname LIKE 'onceflow_rebuild_%'`); n != 0 {
		t.Errorf("%d shadow schemas left", n)
	}
	if n := e.count(`SELECT count(*) FROM projection_rebuilds WHERE state = 'swapped' AND projection = 'accounts'`); n != 1 {
		t.Errorf("rebuild not recorded as swapped")
	}
	if got := live.metric("onceflow_projector_batch_errors_total"); got != 0 {
		t.Errorf("the live projector had %v failed batches", got)
	}
}

// A rebuild repairs a damaged read model (the checksums then differ and the
// rebuilt figures are right), keeps command_status rows that only ingest
// knows (pending commands), resumes after being interrupted, and refuses to
// run twice at once.
func TestRebuildRepairsAndKeepsPendingCommands(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 2)
	ctx := context.Background()
	want, evs := ledgerStreams("acme", 10, 10)
	e.emit(evs...)
	r := e.start(projector.Config{})
	e.waitOffsets(projector.DefaultConsumer, e.endOffsets(), 30*time.Second)
	r.stop() // the live projector may be down: its offsets are what the rebuild matches

	// Damage: a wrong balance, a lost outcome; a pending command from ingest.
	if _, err := e.pool.Exec(ctx, `UPDATE accounts SET balance = balance + 1000 WHERE account_id = 'acc-3'`); err != nil {
		t.Fatal(err)
	}
	if _, err := e.pool.Exec(ctx, `DELETE FROM command_status WHERE command_id = $1`, evs[5].CommandID.String()); err != nil {
		t.Fatal(err)
	}
	pending := pipeline.NewCommandID()
	if _, err := e.pool.Exec(ctx, `INSERT INTO command_status (command_id, tenant, aggregate_id, command_type, status) VALUES ($1, 'acme', 'acme/acc-1', 'Deposit', 'pending')`, pending.String()); err != nil {
		t.Fatal(err)
	}

	build := func(p pipeline.Projection[pgx.Tx], restart bool) (projector.RebuildResult, error) {
		rb, err := projector.NewRebuild(projector.RebuildConfig{Topic: e.topics.Events(), Projection: p, Verify: true, Restart: restart, MaxPollRecords: 7},
			kafka.Config{Brokers: e.brokers}, e.pool, e.serde, quietLogger())
		if err != nil {
			t.Fatal(err)
		}
		return rb.Run(ctx)
	}

	// An interrupted rebuild leaves its shadow behind and is resumed. It is
	// interrupted in its second batch, so the first one's progress is
	// stored (a poll of the stored offsets raced a rebuild that finished
	// first).
	ictx, cancel := context.WithCancel(ctx)
	defer cancel()
	rb, err := projector.NewRebuild(projector.RebuildConfig{Topic: e.topics.Events(), Projection: &cancelAtBatch{at: 2, cancel: cancel}, MaxPollRecords: 7,
		Progress: func(p projector.RebuildProgress) {}}, kafka.Config{Brokers: e.brokers}, e.pool, e.serde, quietLogger())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := rb.Run(ictx); !errors.Is(err, context.Canceled) {
		t.Fatalf("interrupted rebuild: %v, want context.Canceled", err)
	}
	if n := e.count(`SELECT count(*) FROM projection_rebuilds WHERE state = 'building'`); n != 1 {
		t.Fatalf("%d rebuilds building after the interruption, want 1", n)
	}

	res, err := build(accounts.Projection{}, false)
	if err != nil {
		t.Fatal(err)
	}
	if sw := res.Tables[0]; sw.LiveChecksum == sw.RebuiltChecksum || sw.LiveRows != sw.RebuiltRows {
		t.Errorf("accounts: checksums %s and %s, rows %d and %d: want different checksums, same rows", sw.LiveChecksum, sw.RebuiltChecksum, sw.LiveRows, sw.RebuiltRows)
	}
	checkBalances(t, e, "acme", want)
	if n := e.count(`SELECT count(*) FROM projection_rebuilds WHERE state = 'swapped'`); n != 1 {
		t.Errorf("%d swapped rebuilds, want 1 (the interrupted one resumed, not replaced)", n)
	}

	res, err = build(projector.CommandStatus{}, true)
	if err != nil {
		t.Fatal(err)
	}
	if sw := res.Tables[0]; sw.RebuiltRows != sw.LiveRows+1 {
		t.Errorf("command_status: %d rows live, %d rebuilt; want the lost outcome back", sw.LiveRows, sw.RebuiltRows)
	}
	var status string
	if err := e.pool.QueryRow(ctx, `SELECT status FROM command_status WHERE command_id = $1`, pending.String()).Scan(&status); err != nil || status != "pending" {
		t.Errorf("pending command after the rebuild: %q, %v", status, err)
	}
	if err := e.pool.QueryRow(ctx, `SELECT status FROM command_status WHERE command_id = $1`, evs[5].CommandID.String()).Scan(&status); err != nil || status != "accepted" {
		t.Errorf("lost outcome after the rebuild: %q, %v", status, err)
	}

	res, err = build(projector.AuditLog{}, false)
	if err != nil {
		t.Fatal(err)
	}
	if sw := res.Tables[0]; sw.LiveChecksum != sw.RebuiltChecksum || sw.RebuiltRows != int64(len(evs)) {
		t.Errorf("audit_log: %d/%d rows, checksums %s and %s; want equal", sw.LiveRows, sw.RebuiltRows, sw.LiveChecksum, sw.RebuiltChecksum)
	}

	// Two at once: the second is refused.
	conn, err := e.pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	if _, err := conn.Exec(ctx, `SELECT pg_advisory_lock(hashtextextended('onceflow_rebuild:onceflow-projector:accounts', 0))`); err != nil {
		t.Fatal(err)
	}
	if _, err := build(accounts.Projection{}, false); !errors.Is(err, projector.ErrRebuildRunning) {
		t.Errorf("second rebuild at once: %v, want ErrRebuildRunning", err)
	}
}

// cancelAtBatch is the ledger's accounts projection that cancels its
// rebuild's context when it is given its at-th batch, and applies that
// batch with the canceled context.
type cancelAtBatch struct {
	accounts.Projection
	at, seen int
	cancel   context.CancelFunc
}

func (c *cancelAtBatch) ApplyBatch(ctx context.Context, tx pgx.Tx, evs []pipeline.Event) ([]error, error) {
	if c.seen++; c.seen == c.at {
		c.cancel()
	}
	return c.Projection.ApplyBatch(ctx, tx, evs)
}
