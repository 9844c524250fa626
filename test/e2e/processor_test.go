package e2e

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/onceflow/onceflow"
	"github.com/onceflow/onceflow/examples/ledger"
	"github.com/onceflow/onceflow/pipeline"
	"github.com/onceflow/onceflow/pipeline/kafka"
	"github.com/onceflow/onceflow/pipeline/pipelinetest"
)

// Processor processes run with a short session timeout so a paused one is
// declared dead quickly; the broker accepts it.
const procSessionTimeout = 2 * time.Second

// procRig is a broker and processor processes, and a client that produces
// commands straight to Kafka as any producer may.
type procRig struct {
	*Pipeline
	t      *testing.T
	serdes onceflow.Serdes
	cl     *kgo.Client

	mu    sync.Mutex
	procs map[string]*Component
}

func newProcRig(t *testing.T, ctx context.Context) *procRig {
	t.Helper()
	if testing.Short() {
		t.Skip("multi-process end-to-end test; skipped with -short")
	}
	pl := newPipeline(t, "")
	pl.BrokerEnv = map[string]string{"ONCEFLOW_DEV_GROUP_MIN_SESSION_TIMEOUT": "500ms"}
	rig := &procRig{Pipeline: pl, t: t, procs: map[string]*Component{}}
	if _, err := pl.StartBroker(ctx); err != nil {
		t.Fatal(err)
	}
	rig.serdes = registrySerdes(t, ctx, pl)
	rig.cl = pipelinetest.Client(t, pl.Brokers())
	return rig
}

func (r *procRig) topics() kafka.Topics { return kafka.Topics{Prefix: r.Prefix} }

// start starts (or restarts) processor name and waits until it is ready.
func (r *procRig) start(ctx context.Context, name string) *Component {
	r.t.Helper()
	return r.startWith(ctx, name, nil)
}

// startWith is start with more environment (a shared instance id, a log
// level).
func (r *procRig) startWith(ctx context.Context, name string, extra map[string]string) *Component {
	r.t.Helper()
	env := map[string]string{"ONCEFLOW_PROCESSOR_SESSION_TIMEOUT": procSessionTimeout.String()}
	for k, v := range extra {
		env[k] = v
	}
	c, err := r.StartComponent(ctx, "processor", name, env)
	if err != nil {
		r.t.Fatal(err)
	}
	r.mu.Lock()
	r.procs[name] = c
	r.mu.Unlock()
	return c
}

func (r *procRig) proc(name string) *Component {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.procs[name]
}

// procModel is what the test knows it sent, and what must come of it. Its
// workload is built so that every outcome is known in advance whatever
// the interleaving of partitions: transfers only go to accounts opened
// before, are small enough never to overdraw, and withdrawals either are
// small (accepted) or exceed all the money there is (rejected).
type procModel struct {
	mu       sync.Mutex
	want     map[pipeline.ID]string // command id -> expected outcome: event type, or "rejected:reason"
	balance  map[string]int64
	sent     []*kgo.Record // distinct commands, for re-sends
	resent   int
	accounts []string
}

func newProcModel(run string, accounts int) *procModel {
	m := &procModel{want: map[pipeline.ID]string{}, balance: map[string]int64{}}
	for i := range accounts {
		m.accounts = append(m.accounts, fmt.Sprintf("acme/p-%s-%d", run, i))
	}
	return m
}

// command encodes one command and records its expected outcome.
func (r *procRig) command(m *procModel, aggregate string, payload pipeline.Message, want string) *kgo.Record {
	r.t.Helper()
	value, err := r.serdes.Commands.Encode(context.Background(), payload)
	if err != nil {
		r.t.Fatal(err)
	}
	id := pipeline.NewCommandID()
	rec, err := kafka.CommandRecord(r.topics().Commands(), aggregate, id, payload.MessageType(), value, time.Now(), "")
	if err != nil {
		r.t.Fatal(err)
	}
	m.mu.Lock()
	m.want[id] = want
	m.sent = append(m.sent, rec)
	m.mu.Unlock()
	return rec
}

// next returns a random command of the steady workload, updating the
// model.
func (r *procRig) next(m *procModel, rng *rand.Rand, n int) *kgo.Record {
	src := m.accounts[rng.IntN(len(m.accounts))]
	tenant, self, _ := pipeline.SplitAggregateID(src)
	m.mu.Lock()
	if k := rng.IntN(100); k < 5 && len(m.sent) > 0 { // the same command again: absorbed
		rec := m.sent[rng.IntN(len(m.sent))]
		m.resent++
		m.mu.Unlock()
		return &kgo.Record{Topic: rec.Topic, Key: rec.Key, Value: rec.Value, Headers: rec.Headers, Timestamp: rec.Timestamp}
	}
	m.mu.Unlock()
	switch k := rng.IntN(100); {
	case k < 35:
		amount := int64(1 + rng.IntN(100))
		m.add(src, amount)
		return r.command(m, src, ledger.Deposit{Amount: amount}, "Deposited")
	case k < 45:
		amount := int64(1 + rng.IntN(10))
		m.add(src, -amount)
		return r.command(m, src, ledger.Withdraw{Amount: amount}, "Withdrawn")
	case k < 55:
		return r.command(m, src, ledger.Withdraw{Amount: 1 << 50}, "rejected:"+ledger.ReasonInsufficientFunds)
	case k < 90:
		dst := m.accounts[rng.IntN(len(m.accounts))]
		_, to, _ := pipeline.SplitAggregateID(dst)
		if dst == src {
			return r.command(m, src, ledger.RequestTransfer{TransferID: fmt.Sprintf("t%d", n), To: to, Amount: 1}, "rejected:"+ledger.ReasonInvalidTarget)
		}
		amount := int64(1 + rng.IntN(10))
		m.add(src, -amount)
		m.add(dst, amount)
		rec := r.command(m, src, ledger.RequestTransfer{TransferID: fmt.Sprintf("t%d", n), To: to, Amount: amount}, "TransferDebited")
		m.derived(ledger.CreditCommandID(src, idOf(rec), fmt.Sprintf("t%d", n)), "TransferCredited")
		return rec
	default: // to an account that does not exist: refused, refunded
		tid := fmt.Sprintf("t%d", n)
		rec := r.command(m, src, ledger.RequestTransfer{TransferID: tid, To: "ghost-" + self + "-" + tenant, Amount: 5}, "TransferDebited")
		credit := ledger.CreditCommandID(src, idOf(rec), tid)
		m.derived(credit, "rejected:"+ledger.ReasonUnknownAccount)
		m.derived(ledger.RefundCommandID(credit), "TransferRefunded")
		return rec
	}
}

func (m *procModel) add(account string, amount int64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.balance[account] += amount
}

func (m *procModel) derived(id pipeline.ID, want string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.want[id] = want
}

func idOf(r *kgo.Record) pipeline.ID {
	id, _ := pipeline.ParseID(header(r, pipeline.HeaderCommandID))
	return id
}

func (r *procRig) produce(ctx context.Context, recs ...*kgo.Record) error {
	return r.cl.ProduceSync(ctx, recs...).FirstErr()
}

// events reads the events topic read_committed, decoded.
func (r *procRig) events(ctx context.Context) []procEvent {
	r.t.Helper()
	recs, err := kafka.ReadTopic(ctx, r.cl, r.topics().Events(), true)
	if err != nil {
		r.t.Fatal(err)
	}
	out := make([]procEvent, 0, len(recs))
	for _, rec := range recs {
		v, err := r.serdes.Events.Decode(ctx, rec.Value)
		if err != nil {
			r.t.Fatalf("decode event %d/%d: %v", rec.Partition, rec.Offset, err)
		}
		ev := procEvent{rec: rec, payload: v.(pipeline.Message)}
		ev.id, _ = pipeline.ParseID(header(rec, pipeline.HeaderEventID))
		ev.command, _ = pipeline.ParseID(header(rec, pipeline.HeaderCommandID))
		ev.version, _ = strconv.ParseInt(header(rec, pipeline.HeaderAggregateVersion), 10, 64)
		out = append(out, ev)
	}
	return out
}

type procEvent struct {
	rec     *kgo.Record
	id      pipeline.ID
	command pipeline.ID
	version int64
	payload pipeline.Message
}

// where names the event's record and the producer that wrote it (its
// producer id and epoch): which processor's transaction.
func (e procEvent) where() string {
	return fmt.Sprintf("%d/%d by producer %d epoch %d", e.rec.Partition, e.rec.Offset, e.rec.ProducerID, e.rec.ProducerEpoch)
}

func (e procEvent) outcome() string {
	if r, ok := e.payload.(pipeline.CommandRejected); ok {
		return "rejected:" + r.Reason
	}
	return e.payload.MessageType()
}

// waitSettled waits until every command of the model has an outcome.
func (r *procRig) waitSettled(ctx context.Context, m *procModel, within time.Duration) []procEvent {
	r.t.Helper()
	var evs []procEvent
	pipelinetest.Eventually(r.t, within, func() error {
		evs = r.events(ctx)
		seen := map[pipeline.ID]bool{}
		for _, e := range evs {
			seen[e.command] = true
		}
		m.mu.Lock()
		defer m.mu.Unlock()
		missing := 0
		for id := range m.want {
			if !seen[id] {
				missing++
			}
		}
		if missing > 0 {
			return fmt.Errorf("%d of %d commands have no outcome yet", missing, len(m.want))
		}
		return nil
	})
	return evs
}

// check verifies the events topic against the model: no event id twice,
// ids derived from their command, versions without gaps, exactly the
// expected outcome of every command and nothing else, and the money: each
// account's balance is what the model says, so the total is conserved.
func (r *procRig) check(evs []procEvent, m *procModel) {
	t := r.t
	t.Helper()
	m.mu.Lock()
	defer m.mu.Unlock()
	seen := map[pipeline.ID]procEvent{}
	byCommand := map[pipeline.ID][]procEvent{}
	version := map[string]int64{}
	balance := map[string]int64{}
	for _, e := range evs {
		if first, ok := seen[e.id]; ok {
			t.Errorf("event %s (%s of command %s) appears twice: %s and %s", e.id, e.outcome(), e.command, first.where(), e.where())
		} else {
			seen[e.id] = e
		}
		byCommand[e.command] = append(byCommand[e.command], e)
		agg := string(e.rec.Key)
		want := version[agg] + 1
		if _, rejected := e.payload.(pipeline.CommandRejected); rejected {
			want--
		}
		if e.version != want {
			t.Errorf("%s: %s at version %d after %d (%s)", agg, e.outcome(), e.version, version[agg], e.where())
		}
		version[agg] = e.version
		switch p := e.payload.(type) {
		case ledger.Deposited:
			balance[agg] += p.Amount
		case ledger.Withdrawn:
			balance[agg] -= p.Amount
		case ledger.TransferDebited:
			balance[agg] -= p.Amount
		case ledger.TransferCredited:
			balance[agg] += p.Amount
		case ledger.TransferRefunded:
			balance[agg] += p.Amount
		}
	}
	var wrong int
	for id, want := range m.want {
		got := byCommand[id]
		if len(got) != 1 || got[0].outcome() != want || got[0].id != pipeline.EventID(string(got[0].rec.Key), id, 0) {
			if wrong++; wrong <= 10 {
				outcomes := make([]string, len(got))
				for i, e := range got {
					outcomes[i] = e.outcome()
				}
				t.Errorf("command %s: outcomes %v, want one %s", id, outcomes, want)
			}
		}
	}
	if len(evs) != len(m.want) {
		t.Errorf("events topic holds %d events, want %d (one per command)", len(evs), len(m.want))
	}
	var total, wantTotal int64
	for _, acc := range m.accounts {
		if balance[acc] != m.balance[acc] {
			t.Errorf("%s: balance from events %d, want %d", acc, balance[acc], m.balance[acc])
		}
		total += balance[acc]
		wantTotal += m.balance[acc]
	}
	t.Logf("%d commands (%d re-sent and absorbed), %d events, %d accounts holding %d in total (want %d)",
		len(m.want), m.resent, len(evs), len(m.accounts), total, wantTotal)
}

// opening opens the accounts with a large deposit each and waits for them,
// so the steady workload's transfers find their targets open.
func (r *procRig) opening(ctx context.Context, m *procModel) {
	r.t.Helper()
	var recs []*kgo.Record
	for _, acc := range m.accounts {
		recs = append(recs, r.command(m, acc, ledger.OpenAccount{Currency: "EUR"}, "AccountOpened"))
		recs = append(recs, r.command(m, acc, ledger.Deposit{Amount: 1_000_000}, "Deposited"))
		m.add(acc, 1_000_000)
	}
	if err := r.produce(ctx, recs...); err != nil {
		r.t.Fatal(err)
	}
	r.waitSettled(ctx, m, 60*time.Second)
}

// load produces the steady workload until stop is closed.
func (r *procRig) load(ctx context.Context, m *procModel, stop <-chan struct{}) <-chan error {
	done := make(chan error, 1)
	go func() {
		rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 9))
		for n := 0; ; {
			select {
			case <-stop:
				done <- nil
				return
			case <-time.After(10 * time.Millisecond):
			}
			recs := make([]*kgo.Record, 40)
			for i := range recs {
				recs[i] = r.next(m, rng, n)
				n++
			}
			if err := r.produce(ctx, recs...); err != nil {
				done <- err
				return
			}
		}
	}()
	return done
}

// chaos is a script of faults against the processors, run during load.
type chaos []struct {
	after  time.Duration // since the previous step
	what   string        // pause, kill
	proc   string
	resume time.Duration // pause: how long; kill: how long until restart
}

func (r *procRig) runChaos(ctx context.Context, script chaos) {
	r.t.Helper()
	var wg sync.WaitGroup
	for _, s := range script {
		time.Sleep(s.after)
		p := r.proc(s.proc)
		switch s.what {
		case "pause":
			r.t.Logf("%s SIGSTOP %s for %s (session timeout %s)", stamp(), s.proc, s.resume, procSessionTimeout)
			p.Pause()
			wg.Add(1)
			go func() {
				defer wg.Done()
				time.Sleep(s.resume)
				p.Resume()
				r.t.Logf("%s SIGCONT %s", stamp(), s.proc)
			}()
		case "kill":
			r.t.Logf("%s SIGKILL %s", stamp(), s.proc)
			p.Kill()
			time.Sleep(s.resume)
			r.start(ctx, s.proc)
			r.t.Logf("%s restarted %s", stamp(), s.proc)
		}
	}
	wg.Wait()
}

// stamp is the wall clock of a fault, to be matched with the processes'
// logs and the broker's.
func stamp() string { return time.Now().Format("15:04:05.000") }

func (r *procRig) zombieTest(t *testing.T, procs []string, script chaos) {
	ctx, cancel := context.WithTimeout(context.Background(), 110*time.Second)
	defer cancel()
	for _, name := range procs {
		r.start(ctx, name)
	}
	m := newProcModel(fmt.Sprintf("%x", rand.Uint32()), 30)
	r.opening(ctx, m)
	stop := make(chan struct{})
	loadDone := r.load(ctx, m, stop)
	r.runChaos(ctx, script)
	time.Sleep(time.Second)
	close(stop)
	if err := <-loadDone; err != nil {
		t.Fatalf("load: %v", err)
	}
	evs := r.waitSettled(ctx, m, 60*time.Second)
	r.check(evs, m)
	// Every processor is alive and serving again, zombies included.
	var restarts float64
	for _, name := range procs {
		p := r.proc(name)
		if p.Exited() {
			t.Errorf("%s exited:\n%s", name, p.Tail(30))
			continue
		}
		n, _ := p.Metric(ctx, "onceflow_processor_session_restarts_total")
		restarts += n
	}
	t.Logf("sessions restarted in-process after a fenced or unknown commit: %v", restarts)
	if recs, err := kafka.ReadTopic(ctx, r.cl, r.topics().DLQ(), true); err != nil || len(recs) != 0 {
		t.Errorf("DLQ: %d records (%v), want none", len(recs), err)
	}
}

// Two processors share the partitions under load. One is paused past the
// session timeout (its transaction is aborted by the broker, its
// partitions go to the other) and resumed as a zombie; the other is killed
// mid-transaction and restarted; then the first is killed and restarted.
// The events topic, read_committed, has each event once, none missing, and
// the money adds up.
func TestProcessorZombieAndRebalanceTwo(t *testing.T) {
	t.Parallel()
	r := newProcRig(t, context.Background())
	r.zombieTest(t, []string{"p1", "p2"}, chaos{
		{after: 2 * time.Second, what: "pause", proc: "p1", resume: 3 * procSessionTimeout},
		{after: 2 * time.Second, what: "kill", proc: "p2", resume: 500 * time.Millisecond},
		{after: 6 * time.Second, what: "kill", proc: "p1", resume: 500 * time.Millisecond},
		{after: 3 * time.Second, what: "pause", proc: "p2", resume: 2 * procSessionTimeout},
	})
}

// Three processors: one paused past the session timeout and resumed while
// the two others are killed mid-transaction and restarted in turn.
func TestProcessorZombieAndRebalanceThree(t *testing.T) {
	t.Parallel()
	r := newProcRig(t, context.Background())
	r.zombieTest(t, []string{"p1", "p2", "p3"}, chaos{
		{after: 2 * time.Second, what: "pause", proc: "p2", resume: 3 * procSessionTimeout},
		{after: 1 * time.Second, what: "kill", proc: "p3", resume: 300 * time.Millisecond},
		{after: 2 * time.Second, what: "kill", proc: "p1", resume: 300 * time.Millisecond},
		{after: 5 * time.Second, what: "kill", proc: "p2", resume: time.Second},
		{after: 2 * time.Second, what: "pause", proc: "p3", resume: 2 * procSessionTimeout},
	})
}

// A command produced by a non-Go client, kcat, with the record format
// docs/processor.md documents (Confluent-framed Avro, the schema id from
// the registry, the three headers, murmur2 partitioning), is processed.
func TestKcatProducedCommandIsProcessed(t *testing.T) {
	t.Parallel()
	kcat, err := exec.LookPath("kcat")
	if err != nil {
		t.Skip("kcat is not installed (apt-get install kcat)")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	r := newProcRig(t, ctx)
	r.start(ctx, "p1")

	// 1. The schema id, from the registry, as any client looks it up.
	resp, err := http.Get(r.RegistryURL + "/subjects/" + r.topics().Commands() + "-value/versions/latest")
	if err != nil {
		t.Fatal(err)
	}
	var latest struct {
		ID int `json:"id"`
	}
	err = json.NewDecoder(resp.Body).Decode(&latest)
	resp.Body.Close()
	if err != nil || latest.ID == 0 {
		t.Fatalf("registry: %v (id %d)", err, latest.ID)
	}
	// 2. The value, by hand: magic byte, schema id, the union branch of
	// the command (OpenAccount is branch 0, Deposit 1) and its fields.
	frame := func(branch int64, fields ...[]byte) []byte {
		b := binary.BigEndian.AppendUint32([]byte{0}, uint32(latest.ID))
		b = binary.AppendVarint(b, branch)
		for _, f := range fields {
			b = append(b, f...)
		}
		return b
	}
	avroString := func(s string) []byte { return append(binary.AppendVarint(nil, int64(len(s))), s...) }
	avroLong := func(v int64) []byte { return binary.AppendVarint(nil, v) }
	dir := t.TempDir()
	account := "acme/kcat-1"
	open, deposit := pipeline.NewCommandID(), pipeline.NewCommandID()
	for _, c := range []struct {
		id    pipeline.ID
		typ   string
		value []byte
	}{
		{open, "OpenAccount", frame(0, avroString("EUR"))},
		{deposit, "Deposit", frame(1, avroLong(4200))},
		{deposit, "Deposit", frame(1, avroLong(4200))}, // a retry: same id
	} {
		file := filepath.Join(dir, c.typ+".bin")
		if err := os.WriteFile(file, c.value, 0o644); err != nil {
			t.Fatal(err)
		}
		cmd := exec.CommandContext(ctx, kcat, "-P", "-b", r.BrokerAddr, "-t", r.topics().Commands(),
			"-X", "topic.partitioner=murmur2_random",
			"-k", account, "-H", "command-id="+c.id.String(), "-H", "tenant=acme", "-H", "command-type="+c.typ, file)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("kcat: %v\n%s", err, out)
		}
	}
	var evs []procEvent
	pipelinetest.Eventually(t, 30*time.Second, func() error {
		evs = r.events(ctx)
		if len(evs) < 2 {
			return fmt.Errorf("%d events", len(evs))
		}
		return nil
	})
	time.Sleep(500 * time.Millisecond) // let a (wrong) duplicate show up
	evs = r.events(ctx)
	if len(evs) != 2 || evs[0].outcome() != "AccountOpened" || evs[1].outcome() != "Deposited" ||
		evs[0].command != open || evs[1].command != deposit || evs[1].payload.(ledger.Deposited).Amount != 4200 {
		t.Fatalf("events: %+v", evs)
	}
	// kcat's murmur2 partitioner agrees with franz-go's.
	want := kgo.StickyKeyPartitioner(nil).ForTopic(r.topics().Events()).Partition(&kgo.Record{Key: []byte(account)}, 8)
	if evs[0].rec.Partition != int32(want) {
		t.Errorf("the account's events are on partition %d; murmur2 says %d", evs[0].rec.Partition, want)
	}
}
