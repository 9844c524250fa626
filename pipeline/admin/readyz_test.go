package admin_test

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/onceflow/onceflow/pipeline/admin"
	"github.com/onceflow/onceflow/pipeline/pipelinetest"
)

// pingCheck is the postgres check a component adds (run.go), counting
// its pings.
func pingCheck(pool *pgxpool.Pool, pings *atomic.Int64) admin.Check {
	return func(ctx context.Context) error {
		pings.Add(1)
		return pool.Ping(ctx)
	}
}

// /readyz answers anyone who reaches the admin address, so what its
// checks cost the database is bounded: fifty callers at once cost one run
// of the checks (one ping), not fifty.
func TestReadyzPingsOncePerInterval(t *testing.T) {
	t.Parallel()
	pool, _ := pipelinetest.Pool(t)
	s := admin.New("", admin.NewRegistry(), slog.New(slog.DiscardHandler))
	var pings atomic.Int64
	s.AddCheck("postgres", pingCheck(pool, &pings))
	srv := httptest.NewServer(s.Handler())
	t.Cleanup(srv.Close)

	const callers = 50
	var wg sync.WaitGroup
	for range callers {
		wg.Go(func() {
			resp, err := http.Get(srv.URL + "/readyz")
			if err != nil {
				t.Error(err)
				return
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				t.Errorf("/readyz: %d, want 200", resp.StatusCode)
			}
		})
	}
	wg.Wait()
	// Two when the interval (1 s) ran out while the callers came, on a
	// machine slow enough for that.
	if n := pings.Load(); n > 2 {
		t.Errorf("%d callers of /readyz at once cost %d pings, want at most 2", callers, n)
	}
}

// Readiness stays honest under the bound: a check that starts failing
// shows at /readyz within the interval, and its recovery too.
func TestReadyzShowsAFailureWithinTheInterval(t *testing.T) {
	t.Parallel()
	s := admin.New("", admin.NewRegistry(), slog.New(slog.DiscardHandler))
	const every = 200 * time.Millisecond
	s.SetReadyInterval(every)
	var failing atomic.Bool
	s.AddCheck("postgres", func(context.Context) error {
		if failing.Load() {
			return errors.New("connection refused")
		}
		return nil
	})
	if code, _ := get(t, s.Handler(), "GET", "/readyz", ""); code != http.StatusOK {
		t.Fatalf("/readyz: %d, want 200", code)
	}
	for _, tc := range []struct {
		fail bool
		want int
	}{{true, http.StatusServiceUnavailable}, {false, http.StatusOK}} {
		failing.Store(tc.fail)
		changed := time.Now()
		for {
			code, _ := get(t, s.Handler(), "GET", "/readyz", "")
			if code == tc.want {
				break
			}
			// An interval and a margin for a loaded machine.
			if time.Since(changed) > every+time.Second {
				t.Fatalf("/readyz still %d %v after the check changed, want %d within %v", code, time.Since(changed), tc.want, every)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
}

// BenchmarkReadyz measures /readyz called by many at once against a real
// Postgres ping, with the checks run at each call (the baseline, as it
// was) and run once per interval (the default): requests per second and
// pings per request.
func BenchmarkReadyz(b *testing.B) {
	pool, _ := pipelinetest.Pool(b)
	for _, bc := range []struct {
		name  string
		every time.Duration
	}{{"baseline-each-call-pings", time.Nanosecond}, {"once-per-interval", admin.DefaultReadyInterval}} {
		b.Run(bc.name, func(b *testing.B) {
			s := admin.New("", admin.NewRegistry(), slog.New(slog.DiscardHandler))
			s.SetReadyInterval(bc.every)
			var pings atomic.Int64
			s.AddCheck("postgres", pingCheck(pool, &pings))
			h := s.Handler()
			b.SetParallelism(8)
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					rec := httptest.NewRecorder()
					h.ServeHTTP(rec, httptest.NewRequest("GET", "/readyz", nil))
					if rec.Code != http.StatusOK {
						b.Errorf("/readyz: %d", rec.Code)
					}
				}
			})
			b.ReportMetric(float64(pings.Load())/float64(b.N), "pings/op")
		})
	}
}
