package relay_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/onceflow/onceflow/pipeline/kafka"
	"github.com/onceflow/onceflow/pipeline/pipelinetest"
	"github.com/onceflow/onceflow/pipeline/relay"
)

// Scrapes within BacklogMetricsTTL, one after the other or at once, count
// the outbox once; a scrape after it counts again.
func TestBacklogMetricsCached(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, counts := pipelinetest.CountingPool(t, pipelinetest.DatabaseURL(t), "FROM outbox GROUP BY shard")

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
	if n := counts.Load(); n != 1 {
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
