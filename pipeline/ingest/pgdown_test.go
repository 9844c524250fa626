package ingest_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/onceflow/onceflow/pipeline/ingest"
	"github.com/onceflow/onceflow/pipeline/pipelinetest"
	"github.com/onceflow/onceflow/pipeline/postgres"
)

// ownCluster starts a PostgreSQL cluster of the test's own (never the
// shared one: this test stops it) and returns it with its URL.
func ownCluster(t *testing.T) (postgres.Local, string) {
	t.Helper()
	dir := t.TempDir()
	// As root the server runs as postgres, which must reach the data
	// directory; keep it inside the test's directory so it is removed.
	for d := dir; d != os.TempDir() && d != "/"; d = filepath.Dir(d) {
		os.Chmod(d, 0o755)
	}
	pg := postgres.Local{Dir: filepath.Join(dir, "pg"), Port: pipelinetest.FreePort(t), Database: "ingest"}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	url, err := pg.Ensure(ctx)
	if err != nil {
		t.Fatalf("start a private cluster: %v", err)
	}
	t.Cleanup(func() { pg.Stop(context.Background(), "immediate") })
	if err := postgres.Migrate(ctx, url, nil); err != nil {
		t.Fatal(err)
	}
	return pg, url
}

// Stopping Postgres under load: requests get 503 with Retry-After (never a
// 500, never a hang), nothing half-written remains, and ingest recovers by
// itself when the database is back. Clients retry with the same key until
// accepted; in the end every key has exactly one command, and the command
// each client was told is the one stored.
func TestPostgresDown(t *testing.T) {
	if testing.Short() {
		t.Skip("starts and stops a PostgreSQL cluster; skipped with -short")
	}
	t.Parallel()
	ctx := context.Background()
	pg, url := ownCluster(t)
	pool, err := postgres.Connect(ctx, url, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	s := startServer(t, pool, ingest.Config{RequestTimeout: 2 * time.Second})
	key := tenant(t, pool, "acme")

	const workers, perWorker = 8, 60
	var accepted, unavailable atomic.Int64
	told := make([][]string, workers) // the command id each key's client was told
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w := range workers {
		told[w] = make([]string, perWorker)
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < perWorker; {
				select {
				case <-stop:
					return
				default:
				}
				q := req{path: fmt.Sprintf("/v1/accounts/acc-%d/deposits", w), apiKey: key,
					idemKey: fmt.Sprintf("w%d-%d", w, i), body: `{"amount":1}`}
				rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
				r, err := s.try(rctx, q)
				cancel()
				switch {
				case err != nil:
					t.Errorf("%s: %v (a request must not hang while the database is down)", q.idemKey, err)
					return
				case r.Status == http.StatusAccepted:
					told[w][i] = acceptedIDNoFail(r)
					accepted.Add(1)
					i++
				case r.Status == http.StatusServiceUnavailable:
					if r.Header.Get("Retry-After") == "" {
						t.Errorf("503 without Retry-After: %s", r)
						return
					}
					unavailable.Add(1)
					time.Sleep(50 * time.Millisecond)
				default:
					t.Errorf("%s: got %s; while the database is away only 202 and 503 are right", q.idemKey, r)
					return
				}
			}
		}()
	}
	defer func() {
		close(stop)
		wg.Wait()
	}()

	waitFor := func(what string, cond func() bool) {
		t.Helper()
		pipelinetest.Eventually(t, 90*time.Second, func() error {
			if t.Failed() {
				t.FailNow()
			}
			if !cond() {
				return errors.New(what)
			}
			return nil
		})
	}
	waitFor("some requests accepted", func() bool { return accepted.Load() >= 40 })
	if err := pg.Stop(ctx, "immediate"); err != nil {
		t.Fatalf("stop postgres: %v", err)
	}
	t.Logf("postgres stopped after %d accepted requests", accepted.Load())
	waitFor("503s while the database is down", func() bool { return unavailable.Load() >= int64(workers) })
	downAt := accepted.Load()
	if _, err := pg.Ensure(ctx); err != nil {
		t.Fatalf("start postgres again: %v", err)
	}
	t.Logf("postgres back after %d 503s", unavailable.Load())
	waitFor("every key accepted", func() bool { return accepted.Load() == workers*perWorker })
	if accepted.Load() <= downAt {
		t.Fatalf("nothing accepted after the database came back")
	}

	// Exactly one command per key, each with all its rows, and the one
	// its client was told.
	var keys, complete int
	err = pool.QueryRow(ctx, `SELECT count(*),
			count(*) FILTER (WHERE EXISTS (SELECT 1 FROM outbox o WHERE o.headers->>'command-id' = k.command_id::text)
			                   AND EXISTS (SELECT 1 FROM command_status c WHERE c.command_id = k.command_id))
		FROM idempotency_keys k`).Scan(&keys, &complete)
	if err != nil {
		t.Fatal(err)
	}
	if n := countRows(t, pool); keys != workers*perWorker || complete != keys || n != (rows{keys, keys, keys}) {
		t.Fatalf("after the outage: %d key records, %d complete, rows %+v; want %d of each", keys, complete, n, workers*perWorker)
	}
	for w := range workers {
		for i := range perWorker {
			var stored string
			pool.QueryRow(ctx, `SELECT command_id::text FROM idempotency_keys WHERE tenant = 'acme' AND key = $1`, fmt.Sprintf("w%d-%d", w, i)).Scan(&stored)
			if stored != told[w][i] {
				t.Fatalf("key w%d-%d: client was told %s, stored %s", w, i, told[w][i], stored)
			}
		}
	}
}

func acceptedIDNoFail(r response) string {
	loc := r.Header.Get("Location")
	return loc[len("/v1/commands/"):]
}
