package e2e

import (
	"context"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/onceflow/onceflow"
	"github.com/onceflow/onceflow/examples/ledger"
	"github.com/onceflow/onceflow/pipeline"
	"github.com/onceflow/onceflow/pipeline/kafka"
	"github.com/onceflow/onceflow/pipeline/pipelinetest"
	"github.com/onceflow/onceflow/pipeline/projector"
)

// projRig is the broker, a database and projector processes, with the
// test producing events straight into {prefix}.events as the processor
// would: the projector is the only thing under test.
type projRig struct {
	*Pipeline
	t      *testing.T
	pool   *pgxpool.Pool
	serdes onceflow.Serdes
	cl     *kgo.Client
	hold   string // the projectors' crash-point directory

	accounts map[string]*projAccount
	events   int
	proj     *Component
	starts   int
}

type projAccount struct {
	version int64
	balance int64
}

func newProjRig(t *testing.T, ctx context.Context) *projRig {
	t.Helper()
	if testing.Short() {
		t.Skip("multi-process end-to-end test; skipped with -short")
	}
	pool, url := pipelinetest.Pool(t)
	pl := newPipeline(t, url)
	pl.BrokerEnv = map[string]string{"ONCEFLOW_DEV_GROUP_MIN_SESSION_TIMEOUT": "500ms"}
	r := &projRig{Pipeline: pl, t: t, pool: pool, hold: t.TempDir(), accounts: map[string]*projAccount{}}
	if _, err := pl.StartBroker(ctx); err != nil {
		t.Fatal(err)
	}
	r.serdes = registrySerdes(t, ctx, pl)
	r.cl = pipelinetest.Client(t, pl.Brokers())
	return r
}

// startProjector starts a new projector process (after a kill, the next
// incarnation) and waits until it is ready.
func (r *projRig) startProjector(ctx context.Context) {
	r.t.Helper()
	r.starts++
	c, err := r.StartComponent(ctx, "projector", fmt.Sprintf("projector-%d", r.starts), map[string]string{
		projector.HoldEnv:                    r.hold,
		"ONCEFLOW_PROJECTOR_SESSION_TIMEOUT": "2s",
	})
	if err != nil {
		r.t.Fatal(err)
	}
	r.proj = c
}

// produce writes n new events (openings and deposits over a few
// accounts, with their versions) and remembers what they must add up to.
func (r *projRig) produce(ctx context.Context, n int) {
	r.t.Helper()
	recs := make([]*kgo.Record, 0, n)
	for i := 0; i < n; i++ {
		id := fmt.Sprintf("acc-%d", (r.events+i)%12)
		a := r.accounts[id]
		if a == nil {
			a = &projAccount{}
			r.accounts[id] = a
		}
		var m pipeline.Message = ledger.Deposited{Amount: int64(r.events + i)}
		if a.version == 0 {
			m = ledger.AccountOpened{Currency: "EUR"}
		} else {
			a.balance += int64(r.events + i)
		}
		a.version++
		cmd := pipeline.NewCommandID()
		value, err := r.serdes.Events.Encode(ctx, m)
		if err != nil {
			r.t.Fatal(err)
		}
		recs = append(recs, kafka.EventRecord(r.Prefix+".events", pipeline.Event{ID: pipeline.EventID("acme/"+id, cmd, 0), CommandID: cmd,
			Tenant: "acme", AggregateID: "acme/" + id, Version: a.version, Payload: m}, value))
	}
	r.events += n
	if err := r.cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		r.t.Fatal(err)
	}
}

// arm makes the next batch stop at point; held waits until one has and
// returns its Postgres backend pid; release lets it go on.
func (r *projRig) arm(point string) {
	r.t.Helper()
	if err := os.WriteFile(filepath.Join(r.hold, point+".arm"), nil, 0o644); err != nil {
		r.t.Fatal(err)
	}
}

func (r *projRig) held(point string) int {
	r.t.Helper()
	var pid int
	pipelinetest.Eventually(r.t, 60*time.Second, func() error {
		b, err := os.ReadFile(filepath.Join(r.hold, point+".held"))
		if err != nil {
			return fmt.Errorf("projector not at %s yet: %v", point, err)
		}
		pid, err = strconv.Atoi(string(b))
		return err
	})
	return pid
}

func (r *projRig) release(point string) {
	r.t.Helper()
	if err := os.Remove(filepath.Join(r.hold, point+".held")); err != nil {
		r.t.Fatal(err)
	}
}

// caughtUp waits until the stored offsets reach the end of the log.
func (r *projRig) caughtUp(ctx context.Context) {
	r.t.Helper()
	adm := kadm.NewClient(r.cl)
	pipelinetest.Eventually(r.t, 90*time.Second, func() error {
		ends, err := adm.ListEndOffsets(ctx, r.Prefix+".events")
		if err != nil {
			return err
		}
		var end, stored int64
		ends.Each(func(o kadm.ListedOffset) { end += o.Offset })
		if err := r.pool.QueryRow(ctx, `SELECT coalesce(sum(next_offset), 0) FROM consumer_offsets WHERE consumer = $1`, projector.DefaultConsumer).Scan(&stored); err != nil {
			return err
		}
		if stored != end {
			return fmt.Errorf("stored offsets at %d of %d", stored, end)
		}
		return nil
	})
}

// check asserts every event was applied exactly once: the read models hold
// exactly what the events add up to, one audit row, one inbox row and one
// command outcome per event, and the running projector never had to absorb
// a second application of an event (which the ledger's own guards would
// otherwise hide).
func (r *projRig) check(ctx context.Context) {
	r.t.Helper()
	r.caughtUp(ctx)
	for id, want := range r.accounts {
		var bal, ver int64
		err := r.pool.QueryRow(ctx, `SELECT balance, version FROM accounts WHERE tenant = 'acme' AND account_id = $1`, id).Scan(&bal, &ver)
		if err != nil || bal != want.balance || ver != want.version {
			r.t.Errorf("%s: balance %d version %d (%v), want %d and %d", id, bal, ver, err, want.balance, want.version)
		}
	}
	for _, q := range []string{
		`SELECT count(*) FROM audit_log`,
		`SELECT count(*) FROM inbox WHERE consumer = 'onceflow-projector'`,
		`SELECT count(*) FROM command_status WHERE status = 'accepted' AND cardinality(event_ids) = 1`,
	} {
		var n int
		if err := r.pool.QueryRow(ctx, q).Scan(&n); err != nil || n != r.events {
			r.t.Errorf("%s: %d (%v), want %d", q, n, err, r.events)
		}
	}
	if dups, err := r.proj.Metric(ctx, `onceflow_projector_duplicates_total{consumer="onceflow-projector"}`); err != nil || dups != 0 {
		r.t.Errorf("the projector met %v events it had applied before (%v), want 0", dups, err)
	}
}

// The projector killed with SIGKILL before, inside and right after its
// transaction, and its connection terminated by the server inside it:
// afterwards every event is applied exactly once.
func TestProjectorCrashPoints(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	r := newProjRig(t, ctx)
	r.produce(ctx, 40)
	r.startProjector(ctx)
	r.check(ctx)

	for _, point := range []string{projector.HoldBeforeTx, projector.HoldInTx, projector.HoldAfterCommit} {
		t.Run("sigkill "+point, func(t *testing.T) {
			r.t = t
			r.arm(point)
			r.produce(ctx, 30)
			r.held(point)
			r.proj.Kill()
			r.release(point)
			r.produce(ctx, 10) // and more while it is down
			r.startProjector(ctx)
			r.check(ctx)
		})
	}

	t.Run("pg_terminate_backend in-tx", func(t *testing.T) {
		r.t = t
		r.arm(projector.HoldInTx)
		r.produce(ctx, 30)
		pid := r.held(projector.HoldInTx)
		var ok bool
		if err := r.pool.QueryRow(ctx, `SELECT pg_terminate_backend($1)`, pid).Scan(&ok); err != nil || !ok {
			t.Fatalf("terminate backend %d: %v %v", pid, ok, err)
		}
		r.release(projector.HoldInTx)
		r.check(ctx)
		if n, err := r.proj.MetricSum(ctx, "onceflow_projector_batch_errors_total", `consumer="onceflow-projector"`); err != nil || n < 1 {
			t.Errorf("batch errors %v (%v): the terminated transaction should have failed and been retried", n, err)
		}
	})

	t.Run("sigkill under load", func(t *testing.T) {
		r.t = t
		for i := 0; i < 3; i++ {
			r.produce(ctx, 200)
			time.Sleep(time.Duration(20+30*i) * time.Millisecond)
			r.proj.Kill()
			r.startProjector(ctx)
		}
		r.check(ctx)
	})
}

// An out-of-order event parks its partition in the real binary too: the
// version gap is counted, `onceflow lag` shows the partition parked at the
// event, the events before it are applied and nothing after it.
func TestProjectorParksOutOfOrderEvent(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	r := newProjRig(t, ctx)
	r.produce(ctx, 24) // every account opened, some deposits
	r.startProjector(ctx)
	r.check(ctx)

	// acc-0 version 4 arrives before version 3.
	a := r.accounts["acc-0"]
	mk := func(version int64) *kgo.Record {
		cmd := pipeline.NewCommandID()
		value, _ := r.serdes.Events.Encode(ctx, ledger.Deposited{Amount: 1})
		return kafka.EventRecord(r.Prefix+".events", pipeline.Event{ID: pipeline.EventID("acme/acc-0", cmd, 0), CommandID: cmd,
			Tenant: "acme", AggregateID: "acme/acc-0", Version: version, Payload: ledger.Deposited{Amount: 1}}, value)
	}
	gap := mk(a.version + 2)
	if err := r.cl.ProduceSync(ctx, gap, mk(a.version+1)).FirstErr(); err != nil {
		t.Fatal(err)
	}
	pipelinetest.Eventually(t, 30*time.Second, func() error {
		n, err := r.proj.Metric(ctx, `onceflow_projector_version_gaps_total{consumer="onceflow-projector"}`)
		if err != nil || n != 1 {
			return fmt.Errorf("version gaps %v (%v)", n, err)
		}
		return nil
	})
	var ver int64
	if err := r.pool.QueryRow(ctx, `SELECT version FROM accounts WHERE tenant = 'acme' AND account_id = 'acc-0'`).Scan(&ver); err != nil || ver != a.version {
		t.Errorf("acc-0 at version %d (%v), want %d: nothing after the gap applied", ver, err, a.version)
	}
	// The process exports the lag of its Postgres-stored offsets: the parked
	// partition lags, the others do not.
	pipelinetest.Eventually(t, 30*time.Second, func() error {
		for p := int32(0); p < 8; p++ {
			lag, err := r.proj.Metric(ctx, fmt.Sprintf(`kafka_consumergroup_group_lag{group="onceflow-projector",partition="%d",topic="%s.events"}`, p, r.Prefix))
			switch {
			case err != nil:
				return err
			case p == gap.Partition && lag < 2:
				return fmt.Errorf("parked partition %d lag %v, want 2 or more", p, lag)
			case p != gap.Partition && lag != 0:
				return fmt.Errorf("partition %d lag %v, want 0", p, lag)
			}
		}
		return nil
	})
	out, err := runCLI(ctx, r.Pipeline, "lag", "-group", projector.DefaultConsumer)
	if err != nil {
		t.Fatalf("onceflow lag: %v\n%s", err, out)
	}
	want := fmt.Sprintf("version-gap@%d", gap.Offset)
	if !strings.Contains(out, want) || !strings.Contains(out, "postgres") {
		t.Errorf("onceflow lag does not show the partition parked (%s):\n%s", want, out)
	}
}

// runCLI runs the onceflow binary against the rig.
func runCLI(ctx context.Context, pl *Pipeline, args ...string) (string, error) {
	return runCLIWith(ctx, pl, nil, args...)
}

// cliRuns numbers the CLI's runs, for their logs.
var cliRuns atomic.Int64

// runCLIWith is runCLI with env's variables added.
func runCLIWith(ctx context.Context, pl *Pipeline, env map[string]string, args ...string) (string, error) {
	vars := map[string]string{
		"KAFKA_BROKERS": pl.BrokerAddr, "DATABASE_URL": pl.DatabaseURL, "SCHEMA_REGISTRY_URL": pl.RegistryURL,
		"ONCEFLOW_TOPIC_PREFIX": pl.Prefix,
	}
	maps.Copy(vars, env)
	// A log of its own: the output is this run's whole output, however
	// long (`onceflow lag` lists every group on a shared cluster).
	logPath := filepath.Join(pl.Dir, fmt.Sprintf("cli-%03d.log", cliRuns.Add(1)))
	p, err := Start(filepath.Join(pl.Bin, "onceflow"), "cli", args, vars, logPath, "")
	if err != nil {
		return "", err
	}
	select {
	case <-p.done:
	case <-ctx.Done():
		p.Kill()
		return p.Log(), ctx.Err()
	}
	out := p.Log()
	if p.err != nil {
		return out, p.err
	}
	return out, nil
}

// A projection error of no known kind — here a trigger an operator added
// to the accounts table raises P0001 on one account's update; the
// webhooks projection's JSON encoding of a time before year 0 was another
// (the embedded broker cannot carry such a time) — failed the projector's
// batch with no known class and was retried for ever. Now it is retried
// MaxUnknownFailures times, then its partition parks on the event
// (projection-error, shown by `onceflow lag`), and `onceflow projections
// skip` moves the partition past it on purpose, recorded in
// projector_skips; the events after it are applied.
func TestProjectorParksAnEventOfNoKnownErrorAndSkipsIt(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	r := newProjRig(t, ctx)
	r.produce(ctx, 24)
	r.startProjector(ctx)
	r.check(ctx)

	a := r.accounts["acc-0"]
	if _, err := r.pool.Exec(ctx, fmt.Sprintf(`CREATE FUNCTION e2e_refuse() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN
			IF NEW.account_id = 'acc-0' AND NEW.version = %d THEN RAISE EXCEPTION 'refused by a trigger' USING ERRCODE = 'P0001'; END IF;
			RETURN NEW;
		END $$;
		CREATE TRIGGER e2e_refuse BEFORE INSERT OR UPDATE ON accounts FOR EACH ROW EXECUTE FUNCTION e2e_refuse()`, a.version+1)); err != nil {
		t.Fatal(err)
	}
	ev := func(version int64) *kgo.Record {
		cmd := pipeline.NewCommandID()
		value, _ := r.serdes.Events.Encode(ctx, ledger.Deposited{Amount: 1})
		return kafka.EventRecord(r.Prefix+".events", pipeline.Event{ID: pipeline.EventID("acme/acc-0", cmd, 0), CommandID: cmd,
			Tenant: "acme", AggregateID: "acme/acc-0", Version: version, Time: time.Now(), Payload: ledger.Deposited{Amount: 1}}, value)
	}
	got, err := r.cl.ProduceSync(ctx, ev(a.version+1)).First()
	if err != nil {
		t.Fatal(err)
	}
	want := fmt.Sprintf("projection-error@%d", got.Offset)
	pipelinetest.Eventually(t, 90*time.Second, func() error {
		out, err := runCLI(ctx, r.Pipeline, "lag", "-group", projector.DefaultConsumer)
		if err != nil || !strings.Contains(out, want) {
			return fmt.Errorf("onceflow lag does not show %s (%v):\n%s", want, err, out)
		}
		return nil
	})
	if n, err := r.proj.Metric(ctx, `onceflow_projector_batch_errors_total{class="postgres",consumer="onceflow-projector"}`); err != nil || n < projector.DefaultMaxUnknownFailures {
		t.Errorf("batch errors of class postgres: %v (%v), want at least %d", n, err, projector.DefaultMaxUnknownFailures)
	}
	out, err := runCLI(ctx, r.Pipeline, "projections", "skip", "-note", "refused by the operator's trigger", "-operator", "e2e",
		fmt.Sprint(got.Partition), fmt.Sprint(got.Offset))
	if err != nil || !strings.Contains(out, "skipped partition") {
		t.Fatalf("onceflow projections skip: %v\n%s", err, out)
	}
	if _, err := r.pool.Exec(ctx, `DROP TRIGGER e2e_refuse ON accounts`); err != nil {
		t.Fatal(err)
	}
	if err := r.cl.ProduceSync(ctx, ev(a.version+1)).FirstErr(); err != nil {
		t.Fatal(err)
	}
	pipelinetest.Eventually(t, 30*time.Second, func() error {
		var ver int64
		err := r.pool.QueryRow(ctx, `SELECT version FROM accounts WHERE tenant = 'acme' AND account_id = 'acc-0'`).Scan(&ver)
		if err == nil && ver != a.version+1 {
			err = fmt.Errorf("acc-0 at version %d, want %d: the event after the skipped one applied", ver, a.version+1)
		}
		return err
	})
	var note, reason, detail string
	if err := r.pool.QueryRow(ctx, `SELECT note, reason, detail FROM projector_skips WHERE partition = $1 AND from_offset = $2`, got.Partition, got.Offset).Scan(&note, &reason, &detail); err != nil ||
		reason != "projection-error" || !strings.Contains(note, "trigger") || !strings.Contains(detail, "refused by a trigger") {
		t.Errorf("projector_skips: %q %q %q (%v)", reason, note, detail, err)
	}
}

// A writer to the events topic puts a batch of a few KiB that
// decompresses to 32 MiB (beyond the projector's bound, 16 MiB by default)
// before one account's next event. The projector does not decompress it:
// the partition parks at it (batch-too-large), which the projector's
// metric and `onceflow lag` show, while the events of the other
// partitions are applied; `onceflow projections skip` at its offset moves
// the partition past the whole batch, recorded in projector_skips, and the
// account's next event is applied.
func TestDecompressionBombOnTheEventsTopic(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	r := newProjRig(t, ctx)
	r.produce(ctx, 24)
	r.startProjector(ctx)
	r.check(ctx)

	a := r.accounts["acc-0"]
	ev := func(version int64) *kgo.Record {
		cmd := pipeline.NewCommandID()
		value, _ := r.serdes.Events.Encode(ctx, ledger.Deposited{Amount: 1})
		return kafka.EventRecord(r.Prefix+".events", pipeline.Event{ID: pipeline.EventID("acme/acc-0", cmd, 0), CommandID: cmd,
			Tenant: "acme", AggregateID: "acme/acc-0", Version: version, Time: time.Now(), Payload: ledger.Deposited{Amount: 1}}, value)
	}
	bomb := ev(a.version + 1)
	bomb.Value = make([]byte, 32<<20)
	bomber := pipelinetest.Client(t, r.Brokers(), kgo.ProducerBatchCompression(kgo.ZstdCompression()), kgo.ProducerBatchMaxBytes(64<<20))
	got, err := bomber.ProduceSync(ctx, bomb).First()
	if err != nil {
		t.Fatal(err)
	}
	want := fmt.Sprintf("batch-too-large@%d", got.Offset)
	pipelinetest.Eventually(t, 90*time.Second, func() error {
		out, err := runCLI(ctx, r.Pipeline, "lag", "-group", projector.DefaultConsumer)
		if err != nil || !strings.Contains(out, want) {
			return fmt.Errorf("onceflow lag does not show %s (%v):\n%s", want, err, out)
		}
		return nil
	})
	if n, err := r.proj.MetricSum(ctx, "onceflow_projector_parked_partitions", `reason="batch-too-large"`); err != nil || n != 1 {
		t.Errorf("parked partitions of reason batch-too-large: %v (%v), want 1", n, err)
	}
	// Another account's next event, on another partition, is applied
	// meanwhile.
	topics, err := kadm.NewClient(r.cl).ListTopics(ctx, r.Prefix+".events")
	if err != nil {
		t.Fatal(err)
	}
	parts := len(topics[r.Prefix+".events"].Partitions)
	other := ""
	for i := 1; i < 12 && other == ""; i++ {
		id := fmt.Sprint("acc-", i)
		if kgo.StickyKeyPartitioner(nil).ForTopic("t").Partition(&kgo.Record{Key: []byte("acme/" + id)}, parts) != int(got.Partition) {
			other = id
		}
	}
	if other == "" {
		t.Fatalf("no account of the 12 outside partition %d of %d", got.Partition, parts)
	}
	o := r.accounts[other]
	cmd := pipeline.NewCommandID()
	value, _ := r.serdes.Events.Encode(ctx, ledger.Deposited{Amount: 1})
	if err := r.cl.ProduceSync(ctx, kafka.EventRecord(r.Prefix+".events", pipeline.Event{ID: pipeline.EventID("acme/"+other, cmd, 0), CommandID: cmd,
		Tenant: "acme", AggregateID: "acme/" + other, Version: o.version + 1, Time: time.Now(), Payload: ledger.Deposited{Amount: 1}}, value)).FirstErr(); err != nil {
		t.Fatal(err)
	}
	pipelinetest.Eventually(t, 30*time.Second, func() error {
		var ver int64
		err := r.pool.QueryRow(ctx, `SELECT version FROM accounts WHERE tenant = 'acme' AND account_id = $1`, other).Scan(&ver)
		if err == nil && ver != o.version+1 {
			err = fmt.Errorf("%s at version %d, want %d: a partition without the bomb goes on", other, ver, o.version+1)
		}
		return err
	})
	out, err := runCLI(ctx, r.Pipeline, "projections", "skip", "-note", "32 MiB of zeros", "-operator", "e2e",
		fmt.Sprint(got.Partition), fmt.Sprint(got.Offset))
	if err != nil || !strings.Contains(out, "skipped partition") || !strings.Contains(out, "batch-too-large") {
		t.Fatalf("onceflow projections skip: %v\n%s", err, out)
	}
	next, err := r.cl.ProduceSync(ctx, ev(a.version+1)).First()
	if err != nil {
		t.Fatal(err)
	}
	pipelinetest.Eventually(t, 60*time.Second, func() error {
		var ver int64
		err := r.pool.QueryRow(ctx, `SELECT version FROM accounts WHERE tenant = 'acme' AND account_id = 'acc-0'`).Scan(&ver)
		if err == nil && ver != a.version+1 {
			err = fmt.Errorf("acc-0 at version %d, want %d: the event after the skipped batch (offset %d) applied", ver, a.version+1, next.Offset)
		}
		return err
	})
	var reason, operator string
	if err := r.pool.QueryRow(ctx, `SELECT reason, operator FROM projector_skips WHERE partition = $1 AND from_offset = $2`, got.Partition, got.Offset).Scan(&reason, &operator); err != nil ||
		reason != "batch-too-large" || operator != "e2e" {
		t.Errorf("projector_skips: %q by %q (%v), want batch-too-large by e2e", reason, operator, err)
	}
}
