package status_test

import (
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/onceflow/onceflow/pipeline/admin"
	"github.com/onceflow/onceflow/pipeline/admin/status"
	"github.com/onceflow/onceflow/pipeline/pipelinetest"
)

// /status.json answers anyone who reaches the admin address, so what it
// reads from the database is bounded: fifty callers at once cost one
// reading of the parked and retrying partitions (two queries), not fifty.
func TestStatusJSONReadsTheDatabaseOncePerInterval(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	_, url := pipelinetest.Pool(t)
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	queries := &countQueries{}
	cfg.ConnConfig.Tracer = queries
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	reg := admin.NewRegistry()
	adm := admin.New("", reg, slog.New(slog.DiscardHandler))
	page, err := status.New(status.Config{Gatherer: reg, Pool: pool, Components: []string{"projector"}, DatabaseInterval: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	page.Register(adm)
	srv := httptest.NewServer(adm.Handler())
	t.Cleanup(srv.Close)

	const callers = 50
	var wg sync.WaitGroup
	for range callers {
		wg.Go(func() {
			resp, err := http.Get(srv.URL + "/status.json")
			if err != nil {
				t.Error(err)
				return
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				t.Errorf("/status.json: %d", resp.StatusCode)
			}
		})
	}
	wg.Wait()
	if n := queries.n.Load(); n != 2 {
		t.Errorf("%d callers of /status.json at once ran %d queries of the parked and retrying partitions, want 2 (one reading)", callers, n)
	}
}

// countQueries counts the queries of the parked and retrying partitions.
type countQueries struct{ n atomic.Int64 }

func (c *countQueries) TraceQueryStart(ctx context.Context, _ *pgx.Conn, data pgx.TraceQueryStartData) context.Context {
	if strings.Contains(data.SQL, "projector_parked") || strings.Contains(data.SQL, "projector_retrying") {
		c.n.Add(1)
	}
	return ctx
}

func (c *countQueries) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}
