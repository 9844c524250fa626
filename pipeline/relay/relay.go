package relay

import (
	"context"
	crand "crypto/rand"
	"encoding/hex"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"slices"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"
	"golang.org/x/sync/errgroup"

	"github.com/onceflow/onceflow/pipeline/kafka"
	"github.com/onceflow/onceflow/pipeline/postgres"
	"github.com/onceflow/onceflow/pipeline/tracing"
)

// HeaderLease is the header the relay adds to every record it ships:
// "{shard}:{token}", the outbox shard and the fencing token of the lease it
// was shipped under. Within a partition, one shard's tokens never go back:
// a relay that lost a shard cannot publish after the shard's next holder.
const HeaderLease = "relay-lease"

// Relay ships outbox rows to Kafka, shard by shard, under fenced leases.
type Relay struct {
	cfg     Config
	pool    *pgxpool.Pool
	kafka   kafka.Config
	tracer  tracing.Tracer // with the Kafka clients' provider: kotel's publish spans are children of the rows' traces
	logger  *slog.Logger
	metrics *metrics
	// owner identifies this process in the lease table: the instance id
	// plus a nonce, so a restarted process never mistakes its previous
	// incarnation's leases for its own.
	owner string

	wake      chan struct{} // rows are waiting in the shards woken names
	rebalance chan struct{} // a worker stopped: the keeper should look now

	wakeMu sync.Mutex
	woken  wakeUp // the shards Wake named since the dispatcher last looked

	mu      sync.Mutex
	workers map[int]*worker
	wg      sync.WaitGroup // workers and the closing of their Kafka clients

	logMu   sync.Mutex
	lastLog map[string]time.Time

	hooks hooks
}

// hooks let tests stop a relay at the two moments fencing is about, and
// give its producers options of theirs (franz-go hooks, a partitioner).
type hooks struct {
	beforeProduce func(shard int)           // after the lease check, before producing
	beforeCommit  func(shard int)           // after the records were acked, before the Kafka commit
	afterCommit   func(shard int)           // after the Kafka commit, before the delete
	beforeKeep    func()                    // before each round of the lease keeper
	clientOpts    func(shard int) []kgo.Opt // more options of a shard's producer
}

// New returns a relay. Its Kafka producers are built from kcfg: one
// transactional producer per shard it holds.
func New(cfg Config, pool *pgxpool.Pool, kcfg kafka.Config, logger *slog.Logger, reg prometheus.Registerer) (*Relay, error) {
	cfg.setDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if kcfg.ClientID == "" {
		kcfg.ClientID = "onceflow-relay"
	}
	nonce := make([]byte, 4)
	crand.Read(nonce)
	return &Relay{
		cfg: cfg, pool: pool, kafka: kcfg, tracer: tracing.New(kcfg.TracerProvider),
		logger:    logger.With("component", "relay"),
		metrics:   newMetrics(reg, pool, cfg.BacklogMetricsTTL),
		owner:     cfg.InstanceID + "#" + hex.EncodeToString(nonce),
		wake:      make(chan struct{}, 1),
		rebalance: make(chan struct{}, 1),
		workers:   map[int]*worker{},
		lastLog:   map[string]time.Time{},
	}, nil
}

// Wake makes the relay look at the named outbox shards now, or at every
// shard when none is named (ingest calls it after each commit with the
// shards of the rows it wrote, when both run in one process). It never
// blocks.
func (r *Relay) Wake(shards ...int) {
	r.wakeMu.Lock()
	r.woken.add(shards)
	r.wakeMu.Unlock()
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

// WakeHeld is Wake for the shards of shards this relay holds, and returns the
// others (nil when it holds them all), which only a relay of another process
// ships: ingest notifies those (postgres.OutboxChannel), so in a process that
// holds every shard, as `onceflow dev` does, a commit costs no notification,
// and its shard's worker no second head read when the notification would have
// come back to it (docs/decisions/0012-waking-up-without-polling.md). A shard
// whose lease moves just after is woken by the new holder's next poll.
func (r *Relay) WakeHeld(shards ...int) (others []int) {
	var held []int
	r.mu.Lock()
	for _, s := range shards {
		if w := r.workers[s]; w != nil && !w.releasing.Load() && !w.gone.Load() {
			held = append(held, s)
		} else {
			others = append(others, s)
		}
	}
	r.mu.Unlock()
	if len(held) > 0 {
		r.Wake(held...)
	}
	return others
}

// wakeUp is the shards wake-ups named since the dispatcher last looked.
type wakeUp struct {
	all    bool
	shards map[int]struct{}
}

func (u *wakeUp) add(shards []int) {
	if len(shards) == 0 {
		u.all = true
		return
	}
	if u.shards == nil {
		u.shards = map[int]struct{}{}
	}
	for _, s := range shards {
		u.shards[s] = struct{}{}
	}
}

func (u wakeUp) names(shard int) bool {
	_, ok := u.shards[shard]
	return u.all || ok
}

// takeWakeUp returns the shards named since the last call, and forgets
// them.
func (r *Relay) takeWakeUp() wakeUp {
	r.wakeMu.Lock()
	defer r.wakeMu.Unlock()
	u := r.woken
	r.woken = wakeUp{}
	return u
}

// Owner returns the name this process holds leases under
// ("instance#nonce").
func (r *Relay) Owner() string { return r.owner }

// Run ships until ctx ends, then finishes the batches in flight, gives its
// leases back and returns nil. It returns an error only when it cannot
// start (the shard count disagrees with the outbox's).
func (r *Relay) Run(ctx context.Context) error {
	backoff := r.cfg.PollInterval
	for {
		err := r.ensureShards(ctx)
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			return nil
		}
		if !postgres.IsUnavailable(err) {
			return fmt.Errorf("relay: %w", err)
		}
		r.logLimited("outbox shards", "err", err)
		if !sleep(ctx, jitter(backoff)) {
			return nil
		}
		backoff = min(backoff*2, r.cfg.MaxBackoff)
	}
	r.logger.Info("relay started", "owner", r.owner, "shards", r.cfg.Shards, "lease", r.cfg.LeaseDuration)

	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error { return r.janitor(gctx) })
	g.Go(func() error { return r.keep(gctx) })
	g.Go(func() error { return r.dispatch(gctx) })
	g.Go(func() error { return r.vacuum(gctx) })
	// Ingest processes notify after they commit outbox rows: a relay in
	// another process wakes within a round trip instead of at its next
	// poll, which stays for notifications a lost connection missed.
	g.Go(func() error {
		return postgres.Listen(gctx, r.pool, postgres.OutboxChannel, r.logger, func(p string) {
			r.Wake(postgres.ParseOutboxPayload(p)...)
		})
	})
	err := g.Wait()

	// Workers see ctx end, finish their batch and release their leases.
	r.wg.Wait()
	lctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if _, lerr := r.pool.Exec(lctx, leaveSQL, r.owner); lerr != nil {
		r.logger.Warn("leave relay membership", "err", lerr)
	}
	r.logger.Info("relay stopped")
	return err
}

// headsSQL reads the head of each given shard that is still leased with
// the given token, with how long its lease has left: one round trip for
// every idle shard, so a wake-up costs one query before producing.
const headsSQL = `SELECT l.shard, EXTRACT(EPOCH FROM l.expires_at - now())::float8,
		o.id, o.xid, o.settled, o.topic, o.key, o.value, o.headers, o.created_at
	FROM unnest($1::int[], $2::bigint[]) AS h(shard, token)
	JOIN outbox_leases l ON l.shard = h.shard AND l.token = h.token AND l.owner = $3
	JOIN onceflow_outbox_heads($1::int[], $4) o ON o.shard = l.shard
	ORDER BY l.shard, o.xid, o.id`

// dispatch hands work to idle workers, every PollInterval and on Wake:
// it claims the idle workers (on Wake, those of the shards it named),
// reads the head of their shards in one query and gives each its rows.
// One query for all shards costs less than every worker polling on its
// own, and a woken shard starts producing after a single round trip to
// Postgres. A wake-up leaves word only with the busy workers of the shards
// it names: the others have no rows of its commit to read, and a word
// costs a head read (docs/decisions/0012-waking-up-without-polling.md).
func (r *Relay) dispatch(ctx context.Context) error {
	t := time.NewTimer(jitter(r.cfg.PollInterval))
	defer t.Stop()
	for {
		var woken *wakeUp // nil: the poll, every idle shard
		select {
		case <-ctx.Done():
			return nil
		case <-r.wake:
			u := r.takeWakeUp()
			woken = &u
		case <-t.C:
		}
		t.Reset(jitter(r.cfg.PollInterval))
		var claimed []*worker
		for _, w := range r.heldShards() {
			if woken != nil && !woken.names(w.shard) {
				continue
			}
			if w.turn.claim(woken != nil) {
				claimed = append(claimed, w)
			}
		}
		if len(claimed) == 0 {
			continue
		}
		if err := r.handOut(ctx, claimed); err != nil && ctx.Err() == nil {
			r.logLimited("read outbox heads", "err", err)
		}
	}
}

// handOut reads the claimed workers' shards and gives each worker its
// rows; a worker with nothing to do is idle again.
func (r *Relay) handOut(ctx context.Context, claimed []*worker) error {
	given := make(map[int]bool, len(claimed))
	defer func() {
		for _, w := range claimed {
			if !given[w.shard] {
				w.turn.free()
			}
		}
	}()
	shards := make([]int32, len(claimed))
	tokens := make([]int64, len(claimed))
	byShard := make(map[int]*worker, len(claimed))
	for i, w := range claimed {
		shards[i], tokens[i] = int32(w.shard), w.token
		byShard[w.shard] = w
	}
	sent := time.Now()
	rows, err := r.pool.Query(ctx, headsSQL, shards, tokens, r.owner, r.cfg.BatchSize)
	if err != nil {
		return err
	}
	defer rows.Close()
	batches := map[int][]outboxRow{}
	remaining := map[int]float64{}
	var (
		shard int
		rem   float64
		scan  rowScan
	)
	dst := scan.targets(&shard, &rem)
	for rows.Next() {
		if err := rows.Scan(dst...); err != nil {
			return err
		}
		row, _ := scan.row() // never a row of NULLs: the heads are joined, not outer-joined
		batches[shard] = append(batches[shard], row)
		remaining[shard] = rem
	}
	if err := rows.Err(); err != nil {
		return err
	}
	for shard, batch := range batches {
		w := byShard[shard]
		w.setDeadline(sent.Add(seconds(remaining[shard])))
		given[shard] = true
		w.work <- batch // the claimed worker waits for it; the buffer holds one
	}
	return nil
}

// heldShards returns this process's workers in shard order.
func (r *Relay) heldShards() []*worker {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]*worker, 0, len(r.workers))
	for _, w := range r.workers {
		out = append(out, w)
	}
	slices.SortFunc(out, func(a, b *worker) int { return a.shard - b.shard })
	return out
}

// holding returns the workers that are not giving their shard back.
func (r *Relay) holding() []*worker {
	held := r.heldShards()
	out := held[:0]
	for _, w := range held {
		if !w.releasing.Load() {
			out = append(out, w)
		}
	}
	return out
}

// logLimited logs a warning at most once a second per message, so a loop
// that fails fast (Kafka down) does not flood the log.
func (r *Relay) logLimited(msg string, args ...any) {
	r.logMu.Lock()
	last := r.lastLog[msg]
	now := time.Now()
	if now.Sub(last) < time.Second {
		r.logMu.Unlock()
		return
	}
	r.lastLog[msg] = now
	r.logMu.Unlock()
	r.logger.Warn(msg, args...)
}

// jitter returns a duration in [d/2, d) so relays do not poll in lockstep.
func jitter(d time.Duration) time.Duration {
	if d <= 1 {
		return d
	}
	return d/2 + rand.N(d/2) // #nosec G404 -- jitter of a poll interval: nothing to guess
}

// sleep waits d or until ctx ends; it reports whether it waited the full d.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
