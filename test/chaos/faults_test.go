package chaos

import (
	"cmp"
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"
)

// Fault kinds, as the summary names them.
const (
	faultKill     = "SIGKILL component"
	faultBroker   = "broker hard restart"
	faultPostgres = "postgres immediate restart"
	faultZombie   = "processor paused past session timeout"
	faultRelay    = "extra relay on the same shards"
	faultWorker   = "worker paused past its lease"
)

// faults injects a seeded schedule of faults, one at a time.
type faults struct {
	c   *cluster
	rng *rand.Rand

	// firstRound is closed once every kind has been injected once.
	firstRound chan struct{}

	mu     sync.Mutex
	counts map[string]int
	states map[string]map[string]int // kind -> the transaction state it struck -> times
	log    []string
	errs   []error
}

func newFaults(c *cluster, seed uint64) *faults {
	return &faults{c: c, rng: rand.New(rand.NewPCG(seed, 0xfa17)), counts: map[string]int{}, states: map[string]map[string]int{}, firstRound: make(chan struct{})}
}

func (f *faults) note(kind, detail string, start time.Time) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.counts[kind]++
	f.log = append(f.log, fmt.Sprintf("%s %s: %s", start.Format("15:04:05.000"), kind, detail))
}

// noteState counts a fault of kind that struck a transaction in state.
func (f *faults) noteState(kind, state string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.states[kind] == nil {
		f.states[kind] = map[string]int{}
	}
	f.states[kind][state]++
}

// statesOf returns the states faults of kind struck, with their counts,
// as "PrepareCommit 2, Ongoing 1", most first.
func (f *faults) statesOf(kind string) string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []string
	for st := range f.states[kind] {
		out = append(out, st)
	}
	sort.Slice(out, func(i, j int) bool {
		a, b := f.states[kind][out[i]], f.states[kind][out[j]]
		return a > b || a == b && out[i] < out[j]
	})
	for i, st := range out {
		out[i] = fmt.Sprintf("%s %d", st, f.states[kind][st])
	}
	return strings.Join(out, ", ")
}

func (f *faults) fail(err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.errs = append(f.errs, err)
}

type faultKind struct {
	name   string
	weight int
}

// faultKinds returns the kinds a run injects, with their weights: all of
// them, or those -chaos.faults names (to chase one kind's failure). On
// Apache Kafka (onKafka) the embedded broker's restart gives way to the
// real nodes' faults.
func faultKinds(only string, onKafka bool) []faultKind {
	all := []faultKind{{faultKill, 50}, {faultBroker, 10}, {faultPostgres, 10}, {faultZombie, 15}, {faultRelay, 15}, {faultWorker, 10}}
	short := map[string]string{"kill": faultKill, "broker": faultBroker, "postgres": faultPostgres, "zombie": faultZombie, "relay": faultRelay, "worker": faultWorker}
	names := "kill, broker, postgres, zombie, relay, worker"
	if onKafka {
		all = []faultKind{{faultKill, 40}, {faultCoordinator, 8}, {faultLeader, 8}, {faultNodePause, 6}, {faultRolling, 3},
			{faultPostgres, 8}, {faultZombie, 12}, {faultRelay, 12}, {faultWorker, 8},
			{faultPartitionCoordinator, 8}, {faultPartitionNode, 5}, {faultPartitionAsymmetric, 5}, {faultSlowLink, 5}, {faultPostgresCut, 8}}
		short = map[string]string{"kill": faultKill, "coordinator": faultCoordinator, "leader": faultLeader, "nodepause": faultNodePause,
			"rolling": faultRolling, "postgres": faultPostgres, "zombie": faultZombie, "relay": faultRelay, "worker": faultWorker,
			"partition-coordinator": faultPartitionCoordinator, "partition-node": faultPartitionNode,
			"partition-asymmetric": faultPartitionAsymmetric, "slow-link": faultSlowLink, "postgres-cut": faultPostgresCut}
		names = "kill, coordinator, leader, nodepause, rolling, postgres, zombie, relay, worker, partition-coordinator, partition-node, partition-asymmetric, slow-link, postgres-cut"
	}
	if only == "" {
		return all
	}
	var out []faultKind
	for _, name := range strings.Split(only, ",") {
		long, ok := short[strings.TrimSpace(name)]
		if !ok {
			panic(fmt.Sprintf("-chaos.faults: unknown fault kind %q (%s)", name, names))
		}
		for _, k := range all {
			if k.name == long {
				out = append(out, k)
			}
		}
	}
	return out
}

// run injects faults until ctx ends, then makes sure everything runs.
// verdict reports a run's failures: the faults that could not be
// injected, a pipeline that did not drain (derr) and the violated
// properties (vs: the bank's violations or the inventory's texts), the
// first one first, with the fault log. It returns whether the run passed
// its properties (the self-test runs only then).
func verdict[V any](t *testing.T, f *faults, seed uint64, derr error, vs []V) bool {
	t.Helper()
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, err := range f.errs {
		t.Errorf("fault injection: %v", err)
	}
	// A coordinator fault is there to strike a commit in the middle: a
	// run that injected it and never did has not tested it.
	if n := f.counts[faultCoordinator]; n > 0 && f.states[faultCoordinator]["PrepareCommit"] == 0 {
		t.Errorf("seed %d: %d coordinator faults, none struck a transaction in PrepareCommit (each hunted it for %s; states: %v)",
			seed, n, coordinatorHunt, f.states[faultCoordinator])
	}
	if derr != nil {
		t.Errorf("seed %d: pipeline did not drain within %s: %v", seed, *drainFlag, derr)
	}
	if len(vs) == 0 {
		return true
	}
	t.Errorf("seed %d: first violated property: %v", seed, vs[0])
	for _, v := range vs[1:] {
		t.Errorf("also violated: %v", v)
	}
	return false
}

func (f *faults) run(ctx context.Context) {
	kinds := faultKinds(*faultsFlag, f.c.kafka != nil)
	total := 0
	for _, k := range kinds {
		total += k.weight
	}
	order := f.rng.Perm(len(kinds))
	// A rolling restart, the longest fault by far, comes last in the
	// first round, so that a short run meets the others first.
	slices.SortStableFunc(order, func(a, b int) int {
		return cmp.Compare(b2i(kinds[a].name == faultRolling), b2i(kinds[b].name == faultRolling))
	})
	for n := 0; ; {
		wait := time.Duration(1500+f.rng.IntN(3000)) * time.Millisecond
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
		// The first faults are every kind once, in a seeded order, so even
		// a short run meets each; then kinds are drawn by weight.
		var kind string
		if n < len(order) {
			kind = kinds[order[n]].name
		} else {
			pick := f.rng.IntN(total)
			for _, k := range kinds {
				if pick < k.weight {
					kind = k.name
					break
				}
				pick -= k.weight
			}
		}
		n++
		// Draw every random choice before acting, so a seed gives the same
		// schedule however long each fault takes.
		victim := instances[f.rng.IntN(len(instances))].name
		zombie := fmt.Sprintf("processor-%d", 1+f.rng.IntN(2))
		if kind == faultWorker {
			zombie = fmt.Sprintf("worker-%d", 1+f.rng.IntN(2))
		}
		down := time.Duration(200+f.rng.IntN(1800)) * time.Millisecond
		pick := f.rng.IntN(1 << 20)
		switch kind {
		case faultCoordinator, faultLeader, faultNodePause, faultRolling:
			// A fault's own steps run to completion even if the run is
			// ending; a rolling restart of three nodes takes minutes.
			fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Minute)
			f.injectKafka(fctx, kind, fmt.Sprintf("processor-%d", 1+pick%2), pick)
			cancel()
		case faultPartitionCoordinator, faultPartitionNode, faultPartitionAsymmetric, faultSlowLink, faultPostgresCut:
			fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Minute)
			f.injectNet(fctx, kind, pick)
			cancel()
		default:
			f.inject(ctx, kind, victim, zombie, down)
		}
		if n == len(order) {
			close(f.firstRound)
		}
	}
}

func (f *faults) inject(ctx context.Context, kind, victim, zombie string, down time.Duration) {
	start := time.Now()
	// A fault's own steps run to completion even if the run is ending.
	fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Minute)
	defer cancel()
	switch kind {
	case faultKill:
		f.c.comp(victim).Kill()
		time.Sleep(down)
		f.restart(fctx, victim)
		f.note(kind, victim, start)
	case faultBroker:
		if err := f.c.restartBroker(fctx); err != nil {
			f.fail(fmt.Errorf("restart broker: %w", err))
		}
		f.note(kind, "", start)
	case faultPostgres:
		if err := f.c.restartPostgres(fctx); err != nil {
			f.fail(fmt.Errorf("restart postgres: %w", err))
		}
		f.note(kind, "", start)
	case faultZombie:
		p := f.c.comp(zombie)
		p.Pause()
		time.Sleep(sessionTimeout + 2*time.Second)
		p.Resume()
		f.note(kind, zombie, start)
	case faultWorker:
		// Mid-delivery, holding jobs' leases: River gives them to the other
		// worker, and this one's late attempts are fenced when it wakes.
		p := f.c.comp(zombie)
		p.Pause()
		time.Sleep(workerLease + 2*time.Second)
		p.Resume()
		f.note(kind, zombie, start)
	case faultRelay:
		f.c.kinds["relay-extra"] = "relay"
		if err := f.c.start(fctx, "relay-extra"); err != nil {
			f.fail(err)
			return
		}
		time.Sleep(2*time.Second + down)
		f.c.comp("relay-extra").Kill()
		f.note(kind, "relay-extra for "+time.Since(start).Round(time.Millisecond).String(), start)
	}
}

// restart starts an instance again, retrying while its dependencies are
// themselves restarting.
func (f *faults) restart(ctx context.Context, name string) {
	for {
		err := f.c.start(ctx, name)
		if err == nil {
			return
		}
		if ctx.Err() != nil {
			f.fail(fmt.Errorf("restart %s: %w", name, err))
			return
		}
		time.Sleep(500 * time.Millisecond)
	}
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

// summary returns the counts by kind, sorted.
func (f *faults) summary() ([]string, map[string]int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	kinds := make([]string, 0, len(f.counts))
	for k := range f.counts {
		kinds = append(kinds, k)
	}
	sort.Strings(kinds)
	out := make(map[string]int, len(f.counts))
	for k, v := range f.counts {
		out[k] = v
	}
	return kinds, out
}
