package projector_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/onceflow/onceflow/examples/ledger"
	"github.com/onceflow/onceflow/examples/ledger/accounts"
	"github.com/onceflow/onceflow/pipeline"
	"github.com/onceflow/onceflow/pipeline/avro"
	"github.com/onceflow/onceflow/pipeline/kafka"
	"github.com/onceflow/onceflow/pipeline/pipelinetest"
	"github.com/onceflow/onceflow/pipeline/postgres"
	"github.com/onceflow/onceflow/pipeline/projector"
)

// env is one test's broker, topics, database and events serde.
type env struct {
	t       testing.TB
	brokers []string
	topics  kafka.Topics
	pool    *pgxpool.Pool
	url     string
	serde   *avro.Serde
	prod    *kgo.Client
	// maxDecompress is the projectors' kafka.Config.MaxDecompressBatchBytes
	// (0: the default).
	maxDecompress int
}

// ledgerMigrations are the ledger's read model's: the accounts table.
var ledgerMigrations = postgres.Migrations{Name: "ledger", FS: accounts.Migrations}

func newEnv(t testing.TB, partitions int32) *env {
	t.Helper()
	b := pipelinetest.Broker(t)
	e := &env{t: t, brokers: b.Addrs()}
	e.topics = pipelinetest.Topics(t, e.brokers, partitions)
	e.pool, e.url = pipelinetest.Pool(t, ledgerMigrations)
	e.serde = eventsSerde(t, e.topics)
	e.prod = pipelinetest.Client(t, e.brokers, kgo.ProducerLinger(5*time.Millisecond), kgo.ProducerBatchMaxBytes(1<<20))
	return e
}

func eventsSerde(t testing.TB, topics kafka.Topics) *avro.Serde {
	t.Helper()
	ctx := context.Background()
	schemaText, err := ledger.SchemaOf(ledger.Events)
	schema := []byte(schemaText)
	if err != nil {
		t.Fatal(err)
	}
	s, err := avro.NewSerde(avro.NewEmbedded(), avro.ValueSubject(topics.Events()), string(schema), ledger.EventTypes())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Register(ctx); err != nil {
		t.Fatal(err)
	}
	return s
}

// record encodes an event as the processor would produce it.
func (e *env) record(ev pipeline.Event) *kgo.Record {
	e.t.Helper()
	value, err := e.serde.Encode(context.Background(), ev.Payload)
	if err != nil {
		e.t.Fatal(err)
	}
	return kafka.EventRecord(e.topics.Events(), ev, value)
}

// produce writes records and returns where each landed.
func (e *env) produce(recs ...*kgo.Record) []*kgo.Record {
	e.t.Helper()
	if err := e.prod.ProduceSync(context.Background(), recs...).FirstErr(); err != nil {
		e.t.Fatalf("produce: %v", err)
	}
	return recs
}

// emit produces events.
func (e *env) emit(evs ...pipeline.Event) []*kgo.Record {
	e.t.Helper()
	recs := make([]*kgo.Record, len(evs))
	for i, ev := range evs {
		recs[i] = e.record(ev)
	}
	return e.produce(recs...)
}

// endOffsets returns the high watermark of every partition of the events
// topic (the test producer is not transactional, so it is also the last
// stable offset).
func (e *env) endOffsets() map[int32]int64 {
	e.t.Helper()
	adm := kadm.NewClient(pipelinetest.Client(e.t, e.brokers))
	ends, err := adm.ListEndOffsets(context.Background(), e.topics.Events())
	if err != nil {
		e.t.Fatal(err)
	}
	out := map[int32]int64{}
	ends.Each(func(o kadm.ListedOffset) { out[o.Partition] = o.Offset })
	return out
}

// storedOffsets reads a consumer's offsets from Postgres.
func (e *env) storedOffsets(consumer string) map[int32]int64 {
	e.t.Helper()
	rows, err := e.pool.Query(context.Background(), `SELECT partition, next_offset FROM consumer_offsets WHERE consumer = $1 AND topic = $2`, consumer, e.topics.Events())
	if err != nil {
		e.t.Fatal(err)
	}
	out := map[int32]int64{}
	var p int32
	var o int64
	if _, err := pgx.ForEachRow(rows, []any{&p, &o}, func() error { out[p] = o; return nil }); err != nil {
		e.t.Fatal(err)
	}
	return out
}

// waitOffsets waits until the consumer's stored offsets reach want on
// every partition want names (with a non-zero offset).
func (e *env) waitOffsets(consumer string, want map[int32]int64, within time.Duration) {
	e.t.Helper()
	pipelinetest.Eventually(e.t, within, func() error {
		got := e.storedOffsets(consumer)
		for p, o := range want {
			if o > 0 && got[p] < o {
				return fmt.Errorf("partition %d at %d, want %d (all: %v)", p, got[p], o, got)
			}
		}
		return nil
	})
}

// wantCount checks one of the projector's counters. The projector counts
// a batch right after committing it, so a test that has just seen the
// batch's offsets stored may read the counter a moment early: it waits
// until the count reaches want, then checks it is not above.
func wantCount(t *testing.T, r *running, name string, want float64) {
	t.Helper()
	var got float64
	pipelinetest.Eventually(t, 10*time.Second, func() error {
		if got = r.metric(name); got < want {
			return fmt.Errorf("%s = %v, want %v", name, got, want)
		}
		return nil
	})
	if got != want {
		t.Errorf("%s = %v, want %v", name, got, want)
	}
}

// running is a projector running in the background.
type running struct {
	p    *projector.Projector
	reg  *prometheus.Registry
	stop func()
}

func (e *env) start(cfg projector.Config, projections ...pipeline.Projection[pgx.Tx]) *running {
	e.t.Helper()
	if cfg.Topic == "" {
		cfg.Topic = e.topics.Events()
	}
	if len(projections) == 0 {
		projections = ledgerProjections()
	}
	reg := prometheus.NewRegistry()
	p, err := projector.New(cfg, kafka.Config{Brokers: e.brokers, MaxDecompressBatchBytes: e.maxDecompress}, e.pool, e.serde, projections, quietLogger(), reg)
	if err != nil {
		e.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	errc := make(chan error, 1)
	go func() {
		defer wg.Done()
		errc <- p.Run(ctx)
	}()
	var once sync.Once
	stop := func() {
		once.Do(func() {
			cancel()
			wg.Wait()
			if err := <-errc; err != nil {
				e.t.Errorf("projector: %v", err)
			}
		})
	}
	e.t.Cleanup(stop)
	select {
	case <-p.Ready():
	case <-time.After(30 * time.Second):
		e.t.Fatal("projector not ready")
	}
	return &running{p: p, reg: reg, stop: stop}
}

// metric reads a projector counter or gauge by name: the sum of its
// series whose labels include labels ("reason", "data-error", ...).
func (r *running) metric(name string, labels ...string) float64 {
	mfs, err := r.reg.Gather()
	if err != nil {
		panic(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		var sum float64
	series:
		for _, m := range mf.GetMetric() {
			for i := 0; i+1 < len(labels); i += 2 {
				found := false
				for _, l := range m.GetLabel() {
					found = found || l.GetName() == labels[i] && l.GetValue() == labels[i+1]
				}
				if !found {
					continue series
				}
			}
			if c := m.GetCounter(); c != nil {
				sum += c.GetValue()
			} else {
				sum += m.GetGauge().GetValue()
			}
		}
		return sum
	}
	return -1
}

// histogram reads a projector histogram's count and sum.
func (r *running) histogram(name string) (uint64, float64) {
	mfs, err := r.reg.Gather()
	if err != nil {
		panic(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			h := mf.GetMetric()[0].GetHistogram()
			return h.GetSampleCount(), h.GetSampleSum()
		}
	}
	return 0, 0
}

func quietLogger() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// stream builds an account's events with consecutive versions.
type stream struct {
	namedIDs   bool // UUIDv5 command ids (as for transfers' follow-ups), not UUIDv7
	tenant, id string
	version    int64
	seq        int
	at         time.Time
}

func newStream(tenant, id string) *stream {
	return &stream{tenant: tenant, id: id, at: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)}
}

func (s *stream) aggregate() string { return pipeline.AggregateID(s.tenant, s.id) }

// next returns the account's next event (a new command each time).
func (s *stream) next(payload pipeline.Message) pipeline.Event {
	s.seq++
	cmd := pipeline.NewCommandID() // as ingest mints them
	if s.namedIDs {
		cmd = pipeline.NameID(pipeline.Nil, fmt.Appendf(nil, "%s/%s/%d", s.tenant, s.id, s.seq))
	}
	ev := pipeline.Event{
		ID: pipeline.EventID(s.aggregate(), cmd, 0), CommandID: cmd, Tenant: s.tenant, AggregateID: s.aggregate(),
		Time: s.at.Add(time.Duration(s.seq) * time.Millisecond), Payload: payload,
	}
	if _, rejected := payload.(pipeline.CommandRejected); rejected {
		ev.Version = s.version
	} else {
		s.version++
		ev.Version = s.version
	}
	return ev
}

// balance reads an account from Postgres.
func (e *env) balance(tenant, id string) (balance, version int64, err error) {
	err = e.pool.QueryRow(context.Background(), `SELECT balance, version FROM accounts WHERE tenant = $1 AND account_id = $2`, tenant, id).Scan(&balance, &version)
	return
}

func (e *env) count(sql string, args ...any) int64 {
	e.t.Helper()
	var n int64
	if err := e.pool.QueryRow(context.Background(), sql, args...).Scan(&n); err != nil {
		e.t.Fatalf("%s: %v", sql, err)
	}
	return n
}

// ledgerProjections are the read models the ledger's projector applies:
// accounts, then command_status and audit_log.
func ledgerProjections() []pipeline.Projection[pgx.Tx] {
	return []pipeline.Projection[pgx.Tx]{accounts.Projection{}, projector.CommandStatus{CommandTypeOf: ledger.CommandTypeOf}, projector.AuditLog{}}
}
