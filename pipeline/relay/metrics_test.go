package relay_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/onceflow/onceflow/pipeline/kafka"
	"github.com/onceflow/onceflow/pipeline/pipelinetest"
	"github.com/onceflow/onceflow/pipeline/relay"
)

// countingTracer counts the statements that count the outbox.
type countingTracer struct{ counts atomic.Int64 }

func (c *countingTracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	if strings.Contains(d.SQL, "FROM outbox GROUP BY shard") {
		c.counts.Add(1)
	}
	return ctx
}

func (c *countingTracer) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// Scrapes within BacklogMetricsTTL, one after the other or at once, count
// the outbox once; a scrape after it counts again.
func TestBacklogMetricsCached(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	cfg, err := pgxpool.ParseConfig(pipelinetest.DatabaseURL(t))
	if err != nil {
		t.Fatal(err)
	}
	tracer := &countingTracer{}
	cfg.ConnConfig.Tracer = tracer
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)

	newRelay := func(ttl time.Duration) (scrape func() float64) {
		reg := prometheus.NewRegistry()
		if _, err := relay.New(relay.Config{BacklogMetricsTTL: ttl}, pool, kafka.Config{}, slog.New(slog.NewTextHandler(io.Discard, nil)), reg); err != nil {
			t.Fatal(err)
		}
		return func() float64 {
			t.Helper()
			mfs, err := reg.Gather()
			if err != nil {
				t.Fatal(err)
			}
			for _, mf := range mfs {
				if mf.GetName() == "onceflow_outbox_backlog_rows" {
					return mf.GetMetric()[0].GetGauge().GetValue()
				}
			}
			t.Fatal("no onceflow_outbox_backlog_rows")
			return 0
		}
	}
	insert := func() {
		t.Helper()
		if _, err := pool.Exec(ctx, `INSERT INTO outbox (shard, topic, key, value, headers) VALUES (3, 't', 'k', '\x00', '{}')`); err != nil {
			t.Fatal(err)
		}
	}

	scrape := newRelay(time.Hour)
	insert()
	if got := scrape(); got != 1 {
		t.Errorf("backlog: got %v, want 1", got)
	}
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() { defer wg.Done(); scrape() }()
	}
	wg.Wait()
	insert()
	if got := scrape(); got != 1 {
		t.Errorf("backlog within the TTL: got %v, want the reading of the first scrape, 1", got)
	}
	if n := tracer.counts.Load(); n != 1 {
		t.Errorf("10 scrapes within the TTL counted the outbox %d times, want 1", n)
	}

	// Past the TTL a scrape reads again.
	scrape = newRelay(50 * time.Millisecond)
	first := scrape()
	insert()
	pipelinetest.Eventually(t, 5*time.Second, func() error {
		if got := scrape(); got != first+1 {
			return fmt.Errorf("backlog %v after the TTL, want %v", got, first+1)
		}
		return nil
	})
}
