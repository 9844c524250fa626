package relay

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"
)

// Config configures the relay. Zero values mean the defaults.
type Config struct {
	// BatchSize is how many rows are read, produced and deleted at once.
	// Default 500.
	BatchSize int
	// PollInterval is how often an idle relay looks at the outbox when
	// nothing wakes it. Default 100ms.
	PollInterval time.Duration
	// MaxBackoff caps the wait between attempts while Kafka or Postgres is
	// unavailable. Default 5s.
	MaxBackoff time.Duration
	// IdempotencyRetention is how long idempotency keys are kept (must
	// match ingest's). Default 24h.
	IdempotencyRetention time.Duration
	// JanitorInterval is how often partitions are created and dropped.
	// Default 1h.
	JanitorInterval time.Duration
}

func (c *Config) setDefaults() {
	if c.BatchSize == 0 {
		c.BatchSize = 500
	}
	if c.PollInterval == 0 {
		c.PollInterval = 100 * time.Millisecond
	}
	if c.MaxBackoff == 0 {
		c.MaxBackoff = 5 * time.Second
	}
	if c.IdempotencyRetention == 0 {
		c.IdempotencyRetention = 24 * time.Hour
	}
	if c.JanitorInterval == 0 {
		c.JanitorInterval = time.Hour
	}
}

// Relay ships outbox rows to Kafka.
type Relay struct {
	cfg     Config
	pool    *pgxpool.Pool
	client  *kgo.Client
	logger  *slog.Logger
	metrics *metrics
	wake    chan struct{}
}

// New returns a relay. client must be an idempotent producer (franz-go's
// default); the relay does not close it.
func New(cfg Config, pool *pgxpool.Pool, client *kgo.Client, logger *slog.Logger, reg prometheus.Registerer) *Relay {
	cfg.setDefaults()
	return &Relay{
		cfg: cfg, pool: pool, client: client,
		logger:  logger.With("component", "relay"),
		metrics: newMetrics(reg, pool),
		wake:    make(chan struct{}, 1),
	}
}

// Wake makes an idle relay look at the outbox now. It never blocks.
func (r *Relay) Wake() {
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

// leaderLockID is the advisory lock the shipping relay holds.
const leaderLockID = 0x6f6e63655f726c79 // "once_rly"

// Run ships until ctx ends. It returns nil when asked to stop.
func (r *Relay) Run(ctx context.Context) error {
	errc := make(chan error, 1)
	go func() { errc <- r.janitor(ctx) }()
	err := r.ship(ctx)
	if jerr := <-errc; err == nil {
		err = jerr
	}
	return err
}

// ship takes the leader lock, then ships until ctx ends; when the lock's
// connection is lost it goes back to waiting for the lock.
func (r *Relay) ship(ctx context.Context) error {
	backoff := r.cfg.PollInterval
	for ctx.Err() == nil {
		err := r.lead(ctx)
		if ctx.Err() != nil {
			return nil
		}
		r.logger.Warn("relay lost its leadership, retrying", "err", err, "backoff", backoff)
		sleep(ctx, jitter(backoff))
		backoff = min(backoff*2, r.cfg.MaxBackoff)
	}
	return nil
}

func (r *Relay) lead(ctx context.Context) error {
	conn, err := r.pool.Acquire(ctx)
	if err != nil {
		return fmt.Errorf("acquire leader connection: %w", err)
	}
	// The lock lives as long as this session; hijack the connection so it
	// never goes back to the pool still holding the lock.
	pc := conn.Hijack()
	defer pc.Close(context.WithoutCancel(ctx))
	for {
		var got bool
		if err := pc.QueryRow(ctx, `SELECT pg_try_advisory_lock($1)`, int64(leaderLockID)).Scan(&got); err != nil {
			return fmt.Errorf("take relay lock: %w", err)
		}
		if got {
			break
		}
		if !sleep(ctx, jitter(r.cfg.PollInterval*10)) {
			return ctx.Err()
		}
	}
	r.logger.Info("relay shipping")
	backoff := r.cfg.PollInterval
	for {
		n, err := r.runOnce(ctx)
		switch {
		case ctx.Err() != nil:
			return ctx.Err()
		case err != nil:
			r.logger.Warn("ship outbox batch", "err", err, "backoff", backoff)
			r.metrics.errors.Inc()
			if !sleep(ctx, jitter(backoff)) {
				return ctx.Err()
			}
			backoff = min(backoff*2, r.cfg.MaxBackoff)
			// The lock's session must still be ours before we go on.
			if err := pc.Ping(ctx); err != nil {
				return fmt.Errorf("relay lock connection: %w", err)
			}
			continue
		}
		backoff = r.cfg.PollInterval
		if n == r.cfg.BatchSize {
			continue // page until a short batch
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-r.wake:
		case <-time.After(jitter(r.cfg.PollInterval)):
		}
		if err := pc.Ping(ctx); err != nil {
			return fmt.Errorf("relay lock connection: %w", err)
		}
	}
}

type outboxRow struct {
	id        int64
	topic     string
	key       []byte
	value     []byte
	headers   map[string]string
	createdAt time.Time
}

const (
	selectBatchSQL = `SELECT id, topic, key, value, headers, created_at FROM outbox ORDER BY id LIMIT $1`
	deleteBatchSQL = `DELETE FROM outbox WHERE id = ANY($1)`
)

// runOnce ships one batch and returns how many rows it shipped.
func (r *Relay) runOnce(ctx context.Context) (int, error) {
	rows, err := r.pool.Query(ctx, selectBatchSQL, r.cfg.BatchSize)
	if err != nil {
		return 0, fmt.Errorf("read outbox: %w", err)
	}
	batch, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (outboxRow, error) {
		var b outboxRow
		err := row.Scan(&b.id, &b.topic, &b.key, &b.value, &b.headers, &b.createdAt)
		return b, err
	})
	if err != nil {
		return 0, fmt.Errorf("read outbox: %w", err)
	}
	if len(batch) == 0 {
		return 0, nil
	}
	start := time.Now()
	records := make([]*kgo.Record, len(batch))
	ids := make([]int64, len(batch))
	for i, b := range batch {
		rec := &kgo.Record{Topic: b.topic, Key: b.key, Value: b.value, Timestamp: b.createdAt}
		for k, v := range b.headers {
			rec.Headers = append(rec.Headers, kgo.RecordHeader{Key: k, Value: []byte(v)})
		}
		records[i] = rec
		ids[i] = b.id
	}
	if err := r.client.ProduceSync(ctx, records...).FirstErr(); err != nil {
		return 0, fmt.Errorf("produce %d outbox rows: %w", len(records), err)
	}
	r.metrics.publish.Observe(time.Since(start).Seconds())
	if _, err := r.pool.Exec(ctx, deleteBatchSQL, ids); err != nil {
		// Shipped but not deleted: the rows go out again next time.
		return 0, fmt.Errorf("delete %d shipped outbox rows: %w", len(ids), err)
	}
	r.metrics.shipped.Add(float64(len(batch)))
	return len(batch), nil
}

// jitter returns a duration in [d/2, d) so relays do not poll in lockstep.
func jitter(d time.Duration) time.Duration {
	if d <= 1 {
		return d
	}
	return d/2 + rand.N(d/2)
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
