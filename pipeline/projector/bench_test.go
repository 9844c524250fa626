package projector_test

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/onceflow/onceflow/examples/ledger"
	"github.com/onceflow/onceflow/pipeline"
	"github.com/onceflow/onceflow/pipeline/kafka"
	"github.com/onceflow/onceflow/pipeline/projector"
)

// BenchmarkCatchUp measures how fast a projector catches up on a backlog
// of ledger events (ONCEFLOW_BENCH_EVENTS, default 1,000,000, over one
// account per 100 events, on 8 partitions), with everything that makes it
// exactly-once: the inbox, version checks and offsets in each batch's
// transaction. Next to it, on the same database and the same backlog:
//
//   - baseline: a consumer that decodes the same records and writes the
//     same batched upserts of the three read models (accounts folded per
//     account, command_status, audit_log), one transaction per poll batch,
//     with no inbox, no version reads or guards and no offsets;
//   - per-event: the projector with one transaction per event, over the
//     first ONCEFLOW_BENCH_PER_EVENT_EVENTS (default 5,000) events: what
//     batching buys;
//   - per-event, synchronous: the same with SynchronousCommit, each
//     commit waiting for its WAL flush: what asynchronous commit buys
//     where it matters most, a transaction of few events
//     (docs/projector.md#asynchronous-commit). The two alternate (ABBA).
//
// The goal is >= 50,000 events/s and >= 0.6x the baseline.
func BenchmarkCatchUp(b *testing.B) {
	total := envInt("ONCEFLOW_BENCH_EVENTS", 1_000_000)
	perEvent := envInt("ONCEFLOW_BENCH_PER_EVENT_EVENTS", 5_000)
	accounts := max(total/100, 1)
	parallelism := envInt("ONCEFLOW_BENCH_PARALLELISM", 2) // the projector's default
	e := newEnv(b, 8)
	start := time.Now()
	produced := e.produceBacklog(total, accounts)
	b.Logf("backlog: %d events over %d accounts produced in %s", produced, accounts, time.Since(start).Round(time.Millisecond))
	ctx := context.Background()

	var rate, base float64
	for b.Loop() {
		e.resetReadModels(ctx)
		base = e.runBaseline(ctx, produced, parallelism)
		e.resetReadModels(ctx)
		rate = e.runProjector(projector.Config{Consumer: "bench", Parallelism: parallelism}, produced)
	}
	n := int64(min(perEvent, total))
	var async, sync []float64
	for i, synchronous := range []bool{false, true, true, false} {
		e.resetReadModels(ctx)
		r := e.runProjector(projector.Config{Consumer: fmt.Sprintf("bench-per-event-%d", i), MaxPollRecords: 1, SynchronousCommit: synchronous}, n)
		if synchronous {
			sync = append(sync, r)
		} else {
			async = append(async, r)
		}
	}
	single := (async[0] + async[1]) / 2
	singleSync := (sync[0] + sync[1]) / 2

	b.ReportMetric(rate, "events/s")
	b.ReportMetric(base, "baseline_events/s")
	b.ReportMetric(rate/base, "ratio")
	b.ReportMetric(single, "per_event_tx_events/s")
	b.ReportMetric(singleSync, "per_event_tx_sync_events/s")
	b.ReportMetric(single/singleSync, "async_speedup")
	b.ReportMetric(rate/single, "batching_speedup")
}

func envInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}

// produceBacklog writes total events: each account is opened, then gets
// deposits and withdrawals, and one command in twenty is rejected.
func (e *env) produceBacklog(total, accounts int) int64 {
	e.t.Helper()
	ctx := context.Background()
	streams := make([]*stream, accounts)
	for i := range streams {
		streams[i] = newStream("bench", fmt.Sprintf("acc-%d", i))
	}
	cl, err := kafka.Config{Brokers: e.brokers}.NewClient(
		kgo.ProducerLinger(10*time.Millisecond), kgo.ProducerBatchMaxBytes(1<<20), kgo.MaxBufferedRecords(50_000))
	if err != nil {
		e.t.Fatal(err)
	}
	defer cl.Close()
	var firstErr error
	for i := 0; i < total; i++ {
		s := streams[i%accounts]
		var m pipeline.Message
		switch {
		case s.version == 0:
			m = ledger.AccountOpened{Currency: "EUR"}
		case i%20 == 7:
			m = pipeline.CommandRejected{CommandType: "Withdraw", Reason: "insufficient_funds", Detail: "balance too low"}
		case i%3 == 1:
			m = ledger.Withdrawn{Amount: 3}
		default:
			m = ledger.Deposited{Amount: 10}
		}
		cl.Produce(ctx, e.record(s.next(m)), func(_ *kgo.Record, err error) {
			if err != nil && firstErr == nil {
				firstErr = err
			}
		})
	}
	if err := cl.Flush(ctx); err != nil {
		e.t.Fatal(err)
	}
	if firstErr != nil {
		e.t.Fatal(firstErr)
	}
	var n int64
	for _, o := range e.endOffsets() {
		n += o
	}
	return n
}

func (e *env) resetReadModels(ctx context.Context) {
	e.t.Helper()
	if _, err := e.pool.Exec(ctx, `TRUNCATE accounts, command_status, audit_log, inbox, consumer_offsets, projector_parked`); err != nil {
		e.t.Fatal(err)
	}
}

// runProjector runs a projector from the start of the log until it has
// applied (or absorbed) want events and returns its events per second.
func (e *env) runProjector(cfg projector.Config, want int64) float64 {
	e.t.Helper()
	start := time.Now()
	r := e.start(cfg)
	ready := time.Since(start)
	for {
		n := r.metric("onceflow_projector_events_applied_total") + r.metric("onceflow_projector_duplicates_total")
		if int64(n) >= want {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	elapsed := time.Since(start)
	r.stop()
	count, sum := r.histogram("onceflow_projector_batch_duration_seconds")
	e.t.Logf("%s: %d events in %s (ready after %s), %d batches taking %.1fs in Postgres",
		cfg.Consumer, want, elapsed.Round(time.Millisecond), ready.Round(time.Millisecond), count, sum)
	return float64(want) / elapsed.Seconds()
}

const baselineAccountsSQL = `INSERT INTO accounts (tenant, account_id, currency, balance, status, version, updated_at)
	SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::bigint[], $5::text[], $6::bigint[], $7::timestamptz[])
	ON CONFLICT (tenant, account_id) DO UPDATE SET
		balance = accounts.balance + EXCLUDED.balance,
		status = CASE WHEN EXCLUDED.status = 'closed' THEN 'closed' ELSE accounts.status END,
		version = EXCLUDED.version,
		updated_at = EXCLUDED.updated_at`

// runBaseline consumes the whole log and writes the read models with the
// same batched upserts but none of the exactly-once machinery, and
// returns its events per second.
func (e *env) runBaseline(ctx context.Context, want int64, parallelism int) float64 {
	e.t.Helper()
	start := time.Now()
	cl, err := kafka.Config{Brokers: e.brokers}.NewClient(
		kgo.ConsumeTopics(e.topics.Events()),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.FetchMaxPartitionBytes(projector.FetchMaxPartitionBytes),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()))
	if err != nil {
		e.t.Fatal(err)
	}
	defer cl.Close()
	var seen int64
	for seen < want {
		records := cl.PollRecords(ctx, 5000).Records()
		evs := make([]pipeline.Event, 0, len(records))
		for _, r := range records {
			ev, err := projector.DecodeForBench(ctx, e.serde, r)
			if err != nil {
				e.t.Fatal(err)
			}
			evs = append(evs, ev)
		}
		// The same split by partition as the projector's Parallelism.
		groups := map[int32][]pipeline.Event{}
		for i, r := range records {
			g := int32(0)
			if parallelism > 1 {
				g = r.Partition % int32(parallelism)
			}
			groups[g] = append(groups[g], evs[i])
		}
		var wg sync.WaitGroup
		errs := make(chan error, len(groups))
		for _, g := range groups {
			wg.Add(1)
			go func() {
				defer wg.Done()
				errs <- pgx.BeginFunc(ctx, e.pool, func(tx pgx.Tx) error {
					if err := baselineAccounts(ctx, tx, g); err != nil {
						return err
					}
					if _, err := (projector.CommandStatus{}).ApplyBatch(ctx, tx, g); err != nil {
						return err
					}
					_, err := (projector.AuditLog{}).ApplyBatch(ctx, tx, g)
					return err
				})
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			if err != nil {
				e.t.Fatal(err)
			}
		}
		seen += int64(len(records))
	}
	return float64(want) / time.Since(start).Seconds()
}

// baselineAccounts folds a batch per account and upserts it, trusting the
// log: no version read, no guard.
func baselineAccounts(ctx context.Context, tx pgx.Tx, evs []pipeline.Event) error {
	type acct struct {
		tenant, id, currency, status string
		delta, version               int64
		at                           time.Time
	}
	by := map[string]*acct{}
	var order []*acct
	for _, ev := range evs {
		if _, ok := ev.Payload.(pipeline.CommandRejected); ok {
			continue
		}
		a := by[ev.AggregateID]
		if a == nil {
			tenant, id, err := pipeline.SplitAggregateID(ev.AggregateID)
			if err != nil {
				return err
			}
			a = &acct{tenant: tenant, id: id, status: "open"}
			by[ev.AggregateID] = a
			order = append(order, a)
		}
		switch p := ev.Payload.(type) {
		case ledger.AccountOpened:
			a.currency = p.Currency
		case ledger.Deposited:
			a.delta += p.Amount
		case ledger.Withdrawn:
			a.delta -= p.Amount
		case ledger.AccountClosed:
			a.status = "closed"
		}
		a.version, a.at = ev.Version, ev.Time
	}
	n := len(order)
	tenants, ids, currencies, statuses := make([]string, n), make([]string, n), make([]string, n), make([]string, n)
	deltas, versions := make([]int64, n), make([]int64, n)
	ats := make([]time.Time, n)
	for i, a := range order {
		tenants[i], ids[i], currencies[i], statuses[i] = a.tenant, a.id, a.currency, a.status
		deltas[i], versions[i], ats[i] = a.delta, a.version, a.at
	}
	_, err := tx.Exec(ctx, baselineAccountsSQL, tenants, ids, currencies, deltas, statuses, versions, ats)
	return err
}
