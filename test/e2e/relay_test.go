package e2e

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/onceflow/onceflow/examples/ledger"
	"github.com/onceflow/onceflow/pipeline"
	"github.com/onceflow/onceflow/pipeline/avro"
	"github.com/onceflow/onceflow/pipeline/pipelinetest"
	"github.com/onceflow/onceflow/pipeline/relay"
)

// relayRig is a broker and relay processes over one database, and a writer
// that puts commands into the outbox as ingest does.
type relayRig struct {
	*Pipeline
	t      *testing.T
	pool   *pgxpool.Pool
	serde  *avro.Serde
	mu     sync.Mutex
	relays map[string]*Component
	env    map[string]string
	broker *crashableBroker

	sentMu sync.Mutex
	sent   map[string][]string // aggregate -> command ids in the order they were committed
}

func newRelayRig(t *testing.T, ctx context.Context, env map[string]string) *relayRig {
	t.Helper()
	if testing.Short() {
		t.Skip("multi-process end-to-end test; skipped with -short")
	}
	pool, url := pipelinetest.Pool(t)
	pl := newPipeline(t, url)
	rig := &relayRig{Pipeline: pl, t: t, pool: pool, relays: map[string]*Component{}, env: env, sent: map[string][]string{}}
	if _, err := pl.StartBroker(ctx); err != nil {
		t.Fatal(err)
	}
	rig.serde = registrySerdes(t, ctx, pl).Commands
	return rig
}

// newCrashableRelayRig is newRelayRig on a broker the test crashes
// (startCrashableBroker).
func newCrashableRelayRig(t *testing.T, ctx context.Context, env map[string]string) *relayRig {
	t.Helper()
	if testing.Short() {
		t.Skip("multi-process end-to-end test; skipped with -short")
	}
	pool, url := pipelinetest.Pool(t)
	pl := newPipeline(t, url)
	rig := &relayRig{Pipeline: pl, t: t, pool: pool, relays: map[string]*Component{}, env: env, sent: map[string][]string{}}
	rig.broker = startCrashableBroker(t, ctx, pl)
	rig.serde = registrySerdes(t, ctx, pl).Commands
	return rig
}

func (r *relayRig) startRelay(ctx context.Context, name string) {
	r.t.Helper()
	c, err := r.StartComponent(ctx, "relay", name, r.env)
	if err != nil {
		r.t.Fatal(err)
	}
	r.mu.Lock()
	r.relays[name] = c
	r.mu.Unlock()
}

func (r *relayRig) relay(name string) *Component {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.relays[name]
}

// write commits one deposit for agg into the outbox, in its own
// transaction, with ingest's encoding, shard function and headers.
func (r *relayRig) write(ctx context.Context, agg string, amount int64, padding int) error {
	value, err := r.serde.Encode(ctx, ledger.Deposit{Amount: amount})
	if err != nil {
		return err
	}
	if padding > 0 {
		// Not a valid command any more; only the relay sees it.
		value = append(value, make([]byte, padding)...)
	}
	id := pipeline.NewCommandID()
	headers := map[string]string{
		pipeline.HeaderCommandID:   id.String(),
		pipeline.HeaderTenant:      strings.SplitN(agg, "/", 2)[0],
		pipeline.HeaderCommandType: ledger.Deposit{}.MessageType(),
	}
	_, err = r.pool.Exec(ctx, `INSERT INTO outbox (shard, topic, key, value, headers) VALUES ($1, $2, $3, $4, $5)`,
		pipeline.OutboxShard(agg, pipeline.DefaultOutboxShards), r.Prefix+".commands", []byte(agg), value, headers)
	if err != nil {
		return err
	}
	if padding == 0 {
		r.sentMu.Lock()
		r.sent[agg] = append(r.sent[agg], id.String())
		r.sentMu.Unlock()
	}
	return nil
}

// stream writes commands for aggregates at about rate per second until
// ctx ends, each aggregate's commands one after the other (the next only
// once the previous committed, like a client waiting for its 202).
func (r *relayRig) stream(ctx context.Context, aggregates, rate int) <-chan error {
	const writers = 8
	done := make(chan error, writers)
	for w := range writers {
		go func() {
			rng := rand.New(rand.NewPCG(uint64(w), 11))
			tick := time.NewTicker(time.Duration(writers) * time.Second / time.Duration(rate))
			defer tick.Stop()
			for {
				select {
				case <-ctx.Done():
					done <- nil
					return
				case <-tick.C:
				}
				agg := fmt.Sprintf("acme/acc-%d", w+writers*rng.IntN(aggregates/writers))
				if err := r.write(context.WithoutCancel(ctx), agg, int64(1+rng.IntN(1000)), 0); err != nil {
					done <- err
					return
				}
			}
		}()
	}
	out := make(chan error, 1)
	go func() {
		var first error
		for range writers {
			if err := <-done; err != nil && first == nil {
				first = err
			}
		}
		out <- first
	}()
	return out
}

func (r *relayRig) backlog(ctx context.Context) (int, error) {
	var n int
	err := r.pool.QueryRow(ctx, `SELECT count(*) FROM outbox`).Scan(&n)
	return n, err
}

func (r *relayRig) waitDrained(ctx context.Context, within time.Duration) {
	r.t.Helper()
	pipelinetest.Eventually(r.t, within, func() error {
		n, err := r.backlog(ctx)
		if err != nil {
			return err
		}
		if n > 0 {
			return fmt.Errorf("%d rows still in the outbox", n)
		}
		return nil
	})
}

// check reads {prefix}.commands read_committed and checks that every
// command committed into the outbox is there, that each aggregate's
// commands first appear in the order they were committed, and that within
// a partition a shard's lease tokens never go back (no relay published
// after the shard's next holder). It returns the number of duplicates.
func (r *relayRig) check(ctx context.Context) (records, dups int) {
	r.t.Helper()
	recs := readEvents(r.t, ctx, r.BrokerAddr, r.Prefix+".commands")
	seen := map[string]bool{}
	next := map[string]int{}
	type pk struct {
		partition int32
		shard     string
	}
	tokens := map[pk]int64{}
	for _, rec := range recs {
		shard, tok, ok := strings.Cut(header(rec, relay.HeaderLease), ":")
		if !ok {
			r.t.Fatalf("record at %d/%d has no %s header", rec.Partition, rec.Offset, relay.HeaderLease)
		}
		token, _ := strconv.ParseInt(tok, 10, 64)
		k := pk{rec.Partition, shard}
		if token < tokens[k] {
			r.t.Errorf("partition %d offset %d: shard %s published under token %d after token %d: a relay shipped a shard it had lost",
				rec.Partition, rec.Offset, shard, token, tokens[k])
		}
		tokens[k] = max(tokens[k], token)

		id := header(rec, pipeline.HeaderCommandID)
		if seen[id] {
			dups++
			continue
		}
		seen[id] = true
		agg := string(rec.Key)
		i := next[agg]
		if i >= len(r.sent[agg]) || r.sent[agg][i] != id {
			r.t.Fatalf("%s: command %s arrived where #%d of %d was expected: out of order or unknown", agg, id, i, len(r.sent[agg]))
		}
		next[agg] = i + 1
	}
	total := 0
	for agg, ids := range r.sent {
		total += len(ids)
		if next[agg] != len(ids) {
			r.t.Errorf("%s: %d of %d commands reached Kafka", agg, next[agg], len(ids))
		}
	}
	if len(seen) != total {
		r.t.Errorf("%d distinct commands in Kafka, %d committed to the outbox", len(seen), total)
	}
	return len(recs), dups
}

// Three relay processes are killed (SIGKILL) and stopped (SIGTERM) at
// random and restarted, under a steady stream of commands for 300
// aggregates. Afterwards the commands topic holds every command, each
// aggregate's in the order they were committed; duplicates are allowed
// and counted.
func TestRelayOrderUnderKills(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	rig := newRelayRig(t, ctx, map[string]string{"ONCEFLOW_RELAY_LEASE": "1500ms", "ONCEFLOW_RELAY_BATCH_SIZE": "100"})
	names := []string{"relay-1", "relay-2", "relay-3"}
	for _, n := range names {
		rig.startRelay(ctx, n)
	}

	sctx, stop := context.WithTimeout(ctx, 40*time.Second)
	defer stop()
	streamDone := rig.stream(sctx, 300, 300)

	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 3))
	var kills, stops int
	for sctx.Err() == nil {
		select {
		case <-sctx.Done():
		case <-time.After(time.Duration(700+rng.IntN(1800)) * time.Millisecond):
		}
		if sctx.Err() != nil {
			break
		}
		// One relay, sometimes two at once.
		victims := []string{names[rng.IntN(3)]}
		if rng.IntN(4) == 0 {
			victims = append(victims, names[rng.IntN(3)])
		}
		var wg sync.WaitGroup
		for _, name := range victims {
			c := rig.relay(name)
			if c == nil || c.Exited() {
				continue
			}
			if rng.IntN(3) == 0 {
				stops++
				if err := c.Stop(15 * time.Second); err != nil {
					t.Errorf("%s: graceful stop: %v", name, err)
				}
			} else {
				kills++
				c.Kill()
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				time.Sleep(time.Duration(200+rng.IntN(1300)) * time.Millisecond)
				rig.startRelay(ctx, name)
			}()
		}
		wg.Wait()
	}
	if err := <-streamDone; err != nil {
		t.Fatalf("writing the outbox: %v", err)
	}
	for _, n := range names {
		if c := rig.relay(n); c.Exited() {
			rig.startRelay(ctx, n)
		}
	}
	rig.waitDrained(ctx, 60*time.Second)
	records, dups := rig.check(ctx)
	committed := 0
	for _, ids := range rig.sent {
		committed += len(ids)
	}
	t.Logf("%d commands for %d aggregates, %d kills and %d graceful stops: %d records, %d duplicates",
		committed, len(rig.sent), kills, stops, records, dups)
	if kills == 0 {
		t.Error("no relay was killed: the test proved nothing")
	}
}

// A relay stopped with SIGSTOP past its lease loses its shards to the other
// relay; when it continues, it neither deletes nor publishes anything of
// those shards (the commands topic shows no shard's lease token going
// back, and nothing is missing or out of order), and it notices it lost
// them. Three pause cycles under a steady stream, so that the relay is
// caught in the middle of a batch.
func TestRelayPausedPastLease(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	lease := 1500 * time.Millisecond
	rig := newRelayRig(t, ctx, map[string]string{"ONCEFLOW_RELAY_LEASE": lease.String(), "ONCEFLOW_RELAY_BATCH_SIZE": "50"})
	rig.startRelay(ctx, "relay-1")
	rig.startRelay(ctx, "relay-2")
	sctx, stop := context.WithCancel(ctx)
	defer stop()
	streamDone := rig.stream(sctx, 100, 400)

	owners := func() (map[string]int, error) {
		st, err := relay.ReadStatus(ctx, rig.pool, 0)
		if err != nil {
			return nil, err
		}
		out := map[string]int{}
		for _, s := range st.Shards {
			if !s.Free() {
				out[s.Instance]++
			}
		}
		return out, nil
	}
	for cycle := range 3 {
		pipelinetest.Eventually(t, 20*time.Second, func() error {
			o, err := owners()
			if err != nil {
				return err
			}
			if o["relay-1"] != 8 || o["relay-2"] != 8 {
				return fmt.Errorf("shards per relay %v, want 8 each", o)
			}
			return nil
		})
		time.Sleep(time.Duration(rand.IntN(300)) * time.Millisecond)
		r1 := rig.relay("relay-1")
		r1.Pause()
		pipelinetest.Eventually(t, 4*lease+5*time.Second, func() error {
			o, err := owners()
			if err != nil {
				return err
			}
			if o["relay-2"] != 16 {
				return fmt.Errorf("cycle %d: shards per relay %v while relay-1 is stopped, want 16 for relay-2", cycle, o)
			}
			return nil
		})
		time.Sleep(lease) // relay-2 ships relay-1's shards meanwhile
		r1.Resume()
		pipelinetest.Eventually(t, 10*time.Second, func() error {
			lost, err := r1.Metric(ctx, `onceflow_outbox_lease_changes_total{change="lost"}`)
			if err != nil {
				return err
			}
			if lost < float64(8*(cycle+1)) {
				return fmt.Errorf("relay-1 noticed %v lost leases, want %d", lost, 8*(cycle+1))
			}
			return nil
		})
	}
	stop()
	if err := <-streamDone; err != nil {
		t.Fatalf("writing the outbox: %v", err)
	}
	rig.waitDrained(ctx, 30*time.Second)
	records, dups := rig.check(ctx)
	fenced := 0.0
	for _, stage := range []string{"check", "renew", "delete", "kafka"} {
		v, _ := rig.relay("relay-1").Metric(ctx, fmt.Sprintf(`onceflow_outbox_fenced_total{stage=%q}`, stage))
		t.Logf("relay-1 fenced at %s: %v", stage, v)
		fenced += v
	}
	t.Logf("%d records, %d duplicates", records, dups)
	if fenced < 24 {
		t.Errorf("relay-1 was fenced %v times, want at least 24 (8 shards x 3 pauses)", fenced)
	}
}

// The broker is killed in the middle of a stream (a row too large for it
// among the commands) and started again on the same address and data: the
// relay backs off, loses nothing, the backlog (and its oldest age) grows
// meanwhile and drains once the broker is back; the too-large row is in
// outbox_dead and `onceflow outbox status` shows it.
func TestRelayBrokerRestart(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute) // two starts of Apache Kafka's JVM on Apache Kafka
	defer cancel()
	rig := newCrashableRelayRig(t, ctx, nil)
	rig.startRelay(ctx, "relay-1")
	sctx, stop := context.WithCancel(ctx)
	defer stop()
	streamDone := rig.stream(sctx, 50, 200)

	time.Sleep(2 * time.Second)
	if err := rig.write(ctx, "acme/acc-big", 1, 1_100_000); err != nil { // over 1 MB: no broker takes it
		t.Fatal(err)
	}
	time.Sleep(time.Second)
	rig.broker.Crash()
	var during atomic.Int64
	pipelinetest.Eventually(t, 20*time.Second, func() error {
		n, err := rig.backlog(ctx)
		if err != nil {
			return err
		}
		during.Store(int64(n))
		age, err := rig.relay("relay-1").Metric(ctx, "onceflow_outbox_oldest_age_seconds")
		if err != nil {
			return err
		}
		if n < 200 || age < 2 {
			return fmt.Errorf("backlog %d rows, oldest %vs: not growing while the broker is down", n, age)
		}
		return nil
	})
	if rig.relay("relay-1").Exited() {
		t.Fatal("the relay exited while the broker was down")
	}
	if err := rig.broker.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	time.Sleep(2 * time.Second)
	stop()
	if err := <-streamDone; err != nil {
		t.Fatalf("writing the outbox: %v", err)
	}
	rig.waitDrained(ctx, 60*time.Second)
	records, dups := rig.check(ctx)
	t.Logf("backlog while the broker was down: %d rows; %d records, %d duplicates", during.Load(), records, dups)

	cmd := exec.CommandContext(ctx, filepath.Join(binDir, "onceflow"), "outbox", "status")
	cmd.Env = []string{"DATABASE_URL=" + rig.DatabaseURL}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("onceflow outbox status: %v\n%s", err, out)
	}
	for _, want := range []string{"dead rows: 1", "MESSAGE_TOO_LARGE", "acme/acc-big", "relay-1"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("onceflow outbox status lacks %q:\n%s", want, out)
		}
	}
}
