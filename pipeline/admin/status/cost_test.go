package status_test

import (
	"log/slog"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/onceflow/onceflow/pipeline/admin"
	"github.com/onceflow/onceflow/pipeline/admin/status"
	"github.com/onceflow/onceflow/pipeline/pipelinetest"
)

// /status.json answers anyone who reaches the admin address, so what it
// reads from the database is bounded: fifty callers at once cost one
// reading of the parked and retrying partitions (two queries), not fifty.
func TestStatusJSONReadsTheDatabaseOncePerInterval(t *testing.T) {
	t.Parallel()
	_, url := pipelinetest.Pool(t)
	pool, queries := pipelinetest.CountingPool(t, url, "projector_parked", "projector_retrying")
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
	if n := queries.Load(); n != 2 {
		t.Errorf("%d callers of /status.json at once ran %d queries of the parked and retrying partitions, want 2 (one reading)", callers, n)
	}
}

// countQueries counts the queries of the parked and retrying partitions.
