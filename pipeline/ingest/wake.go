package ingest

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/onceflow/onceflow/pipeline"
	"github.com/onceflow/onceflow/pipeline/postgres"
)

// wakeups are ingest's two ends of the components' notifications
// (docs/decisions/0012-waking-up-without-polling.md): after a transaction
// commits outbox rows it tells the relays (OutboxChannel), and it listens
// for the projector's committed outcomes (OutcomesChannel) to answer
// GET /v1/commands/{id}?wait= as soon as the outcome is in command_status.
type wakeups struct {
	pool   *pgxpool.Pool
	logger *slog.Logger

	committed chan struct{} // a commit to tell the relays about; 1 slot: commits coalesce

	shardsMu sync.Mutex
	shards   map[int]struct{} // the shards of the commits not told yet

	mu      sync.Mutex
	waiters map[pipeline.ID]map[chan struct{}]struct{}
	// fresh are the commands this process accepted within freshFor whose
	// outcome no notification has named since (freshQueue: in the order
	// they were accepted, for expiry).
	fresh      map[pipeline.ID]freshCommand
	freshQueue []freshEntry
	freshFor   time.Duration

	// listened is set once the outcome listener has connected: a command
	// accepted before then cannot be fresh (an outcome notified before
	// the LISTEN is not heard), so the first connection forgets them all.
	listened atomic.Bool
}

// freshCommand is what ingest knows of a command it just accepted: the
// row it wrote is pending, for this tenant and aggregate.
type freshCommand struct {
	tenant, aggregate string
	at                time.Time
}

type freshEntry struct {
	id pipeline.ID
	at time.Time
}

// maxFresh bounds the fresh commands kept (a burst beyond it only costs
// the oldest ones' waits a read each).
const maxFresh = 1 << 16

func newWakeups(pool *pgxpool.Pool, logger *slog.Logger, freshFor time.Duration) *wakeups {
	return &wakeups{pool: pool, logger: logger, committed: make(chan struct{}, 1), shards: map[int]struct{}{},
		waiters: map[pipeline.ID]map[chan struct{}]struct{}{},
		fresh:   map[pipeline.ID]freshCommand{}, freshFor: freshFor}
}

// run notifies the relays of commits and listens for outcomes until ctx
// ends.
func (w *wakeups) run(ctx context.Context) {
	var wg sync.WaitGroup
	wg.Go(func() { w.notifyCommits(ctx) })
	wg.Go(func() { postgres.Listen(ctx, w.pool, postgres.OutcomesChannel, w.logger, w.outcomes) })
	wg.Wait()
}

// accepted records that a transaction committed outbox rows to shards. It
// never blocks: while a notification is on its way, later commits share
// the next one, so a burst of commits costs the relays one wake-up, and
// the accept transaction itself never notifies (which would serialize
// commits).
func (w *wakeups) accepted(shards ...int) {
	w.shardsMu.Lock()
	for _, s := range shards {
		w.shards[s] = struct{}{}
	}
	w.shardsMu.Unlock()
	select {
	case w.committed <- struct{}{}:
	default:
	}
}

// notifyCommits tells the relays which shards got rows: a relay reads only
// those shards' heads, and a worker busy with another shard is left alone
// (docs/decisions/0012-waking-up-without-polling.md).
func (w *wakeups) notifyCommits(ctx context.Context) {
	var shards []int
	for {
		select {
		case <-ctx.Done():
			return
		case <-w.committed:
		}
		w.shardsMu.Lock()
		shards = shards[:0]
		for s := range w.shards {
			shards = append(shards, s)
		}
		clear(w.shards)
		w.shardsMu.Unlock()
		if len(shards) == 0 {
			continue // told with an earlier commit's notification
		}
		if err := postgres.Notify(ctx, w.pool, postgres.OutboxChannel, postgres.OutboxPayload(shards)); err != nil && ctx.Err() == nil && !errors.Is(err, context.Canceled) {
			// The relays poll as well: a lost notification costs them a poll
			// interval, not a command.
			w.logger.Debug("notify the relays", "err", err)
		}
	}
}

// outcomes wakes the waiters of the commands a payload names (all of
// them for "*" or a fresh connection).
func (w *wakeups) outcomes(payload string) {
	ids, err := postgres.ParseOutcomePayload(payload)
	w.mu.Lock()
	defer w.mu.Unlock()
	if errors.Is(err, postgres.ErrAllOutcomes) {
		if payload == "" {
			w.listened.Store(true)
		}
		for id, chs := range w.waiters {
			wakeAll(chs)
			delete(w.waiters, id)
		}
		clear(w.fresh)
		w.freshQueue = w.freshQueue[:0]
		return
	}
	for _, id := range ids {
		delete(w.fresh, id)
		if chs, ok := w.waiters[id]; ok {
			wakeAll(chs)
			delete(w.waiters, id)
		}
	}
}

// accepting records commands whose rows this process committed as
// pending; it is called before their 202s are sent, so the client's first
// ?wait= finds them (takeFresh).
func (w *wakeups) accepting(cmds map[pipeline.ID]freshCommand) {
	now := time.Now()
	w.mu.Lock()
	defer w.mu.Unlock()
	w.expire(now)
	for id, c := range cmds {
		if len(w.freshQueue) >= maxFresh {
			w.forgetFresh(w.freshQueue[0])
			w.freshQueue = w.freshQueue[1:]
		}
		c.at = now
		w.fresh[id] = c
		w.freshQueue = append(w.freshQueue, freshEntry{id, now})
	}
}

// expire forgets the fresh commands accepted more than freshFor ago.
func (w *wakeups) expire(now time.Time) {
	for len(w.freshQueue) > 0 && now.Sub(w.freshQueue[0].at) > w.freshFor {
		w.forgetFresh(w.freshQueue[0])
		w.freshQueue = w.freshQueue[1:]
	}
}

// forgetFresh forgets e's command unless it was accepted again since (an
// id is minted for each command, so only a test repeats one).
func (w *wakeups) forgetFresh(e freshEntry) {
	if c, ok := w.fresh[e.id]; ok && c.at.Equal(e.at) {
		delete(w.fresh, e.id)
	}
}

// takeFresh reports, once, whether id is a command of tenant (and of
// aggregate, when one is named) that this process accepted within
// freshFor and whose outcome no notification has named since: its row is
// then known to be pending, and a wait registered before this call
// (wait) is woken by the notification that ends it, so the wait need not
// read the row first.
func (w *wakeups) takeFresh(id pipeline.ID, tenant string, aggregate *string) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	c, ok := w.fresh[id]
	if !ok {
		return false
	}
	delete(w.fresh, id)
	return c.tenant == tenant && (aggregate == nil || *aggregate == c.aggregate) && time.Since(c.at) <= w.freshFor
}

// wakeAll closes the channels of chs that are still open: a waiter's
// channel is registered under each of the commands it waits for, and
// the first of them to be named closes it.
func wakeAll(chs map[chan struct{}]struct{}) {
	for ch := range chs {
		select {
		case <-ch:
		default:
			close(ch)
		}
	}
}

// wait returns a channel closed when an outcome of one of ids may have
// been committed, and a function that forgets the waiter. Register before
// reading the commands' rows, so an outcome committed between the read and
// the wait is not missed.
func (w *wakeups) wait(ids ...pipeline.ID) (<-chan struct{}, func()) {
	ch := make(chan struct{})
	w.mu.Lock()
	for _, id := range ids {
		if w.waiters[id] == nil {
			w.waiters[id] = map[chan struct{}]struct{}{}
		}
		w.waiters[id][ch] = struct{}{}
	}
	w.mu.Unlock()
	return ch, func() {
		w.mu.Lock()
		defer w.mu.Unlock()
		for _, id := range ids {
			if chs, ok := w.waiters[id]; ok {
				delete(chs, ch)
				if len(chs) == 0 {
					delete(w.waiters, id)
				}
			}
		}
	}
}
