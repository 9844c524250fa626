package ingest_test

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/onceflow/onceflow/pipeline/ingest"
	"github.com/onceflow/onceflow/pipeline/pipelinetest"
)

// Requests that share a transaction do not share their fate: in one batch,
// a request whose insert fails gets an error alone, a reused key gets its
// 409, a retry gets its replay, a second request with a key already in the
// batch waits for the first's commit and gets its response, and the rest
// are accepted.
func TestBatchIsolatesEachRequest(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, _ := ledgerPool(t)
	s := startServer(t, pool, ingest.Config{Committers: 1})
	key := tenant(t, pool, "acme")
	dep := func(acct, idem string, amount int) req {
		return req{path: "/v1/accounts/" + acct + "/deposits", apiKey: key, idemKey: idem, body: fmt.Sprintf(`{"amount":%d}`, amount)}
	}
	earlier := s.do(t, dep("acc", "earlier", 1))
	acceptedID(t, earlier)

	// Rows for acme/poison fail to insert.
	for _, stmt := range []string{
		`CREATE FUNCTION poison() RETURNS trigger LANGUAGE plpgsql AS $$
		 BEGIN IF NEW.key = 'acme/poison'::bytea THEN RAISE EXCEPTION 'poisoned row'; END IF; RETURN NEW; END $$`,
		`CREATE TRIGGER poison BEFORE INSERT ON outbox FOR EACH ROW EXECUTE FUNCTION poison()`,
	} {
		if _, err := pool.Exec(ctx, stmt); err != nil {
			t.Fatal(err)
		}
	}

	// Stall the only committer on a key this session holds, so the
	// requests below queue up and go into one batch.
	gate, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer gate.Release()
	if _, err := gate.Exec(ctx, `SELECT pg_advisory_lock(hashtextextended('acme/gate', 0))`); err != nil {
		t.Fatal(err)
	}
	gateDone := make(chan response, 1)
	go func() { gateDone <- s.do(t, dep("acc", "gate", 1)) }()
	pipelinetest.Eventually(t, 30*time.Second, func() error {
		var waiting int
		pool.QueryRow(ctx, `SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted`).Scan(&waiting)
		if waiting == 0 {
			return fmt.Errorf("the committer is not waiting on the gate yet")
		}
		return nil
	})

	reqs := map[string]req{
		"poison":   dep("poison", "p", 1),
		"good-1":   dep("acc", "g1", 1),
		"good-2":   dep("acc-2", "g2", 2),
		"conflict": dep("acc", "earlier", 999),
		"replay":   dep("acc", "earlier", 1),
		"dup-a":    dep("acc-3", "dup", 3),
		"dup-b":    dep("acc-3", "dup", 3),
	}
	var mu sync.Mutex
	got := map[string]response{}
	var wg sync.WaitGroup
	for name, q := range reqs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r, err := s.try(ctx, q)
			if err != nil {
				t.Error(err)
			}
			mu.Lock()
			got[name] = r
			mu.Unlock()
		}()
	}
	pipelinetest.Eventually(t, 30*time.Second, func() error {
		if n := s.Queued(); n != len(reqs) {
			return fmt.Errorf("%d requests queued, want %d", n, len(reqs))
		}
		return nil
	})
	if _, err := gate.Exec(ctx, `SELECT pg_advisory_unlock(hashtextextended('acme/gate', 0))`); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	acceptedID(t, <-gateDone)

	if r := got["poison"]; r.Status != http.StatusInternalServerError {
		t.Errorf("poison: got %s, want 500", r)
	}
	for _, name := range []string{"good-1", "good-2"} {
		if r := got[name]; r.Status != http.StatusAccepted || r.Header.Get("Idempotent-Replayed") != "" {
			t.Errorf("%s: got %s, want a new 202", name, r)
		}
	}
	if r := got["conflict"]; r.Status != http.StatusConflict {
		t.Errorf("conflict: got %s, want 409", r)
	}
	if r := got["replay"]; !bytes.Equal(r.Body, earlier.Body) || r.Header.Get("Idempotent-Replayed") != "true" {
		t.Errorf("replay: got %s, want the replay of %s", r, earlier)
	}
	a, b := got["dup-a"], got["dup-b"]
	if acceptedID(t, a) != acceptedID(t, b) || (a.Header.Get("Idempotent-Replayed") == "") == (b.Header.Get("Idempotent-Replayed") == "") {
		t.Errorf("one key twice in a batch: got %s and %s, want one command and one replay", a, b)
	}
	// earlier, gate, good-1, good-2, dup: five commands; nothing of poison.
	if n := countRows(t, pool); n != (rows{5, 5, 5}) {
		t.Errorf("stored %+v, want 5 of each", n)
	}
	var poisoned int
	pool.QueryRow(ctx, `SELECT count(*) FROM command_status WHERE aggregate_id = 'acme/poison'`).Scan(&poisoned)
	if poisoned != 0 {
		t.Errorf("the failed request left %d command_status rows", poisoned)
	}
	// And the six requests after the gate shared one transaction.
	mfs, _ := s.metrics.Gather()
	found := false
	for _, mf := range mfs {
		if mf.GetName() == "onceflow_api_accept_batch_size" {
			found = true
			h := mf.GetMetric()[0].GetHistogram()
			for _, bk := range h.GetBucket() {
				if bk.GetUpperBound() == 4 && bk.GetCumulativeCount() == h.GetSampleCount() {
					t.Errorf("no batch had more than 4 requests; the test did not exercise a shared transaction")
				}
			}
		}
	}
	if !found {
		t.Error("no onceflow_api_accept_batch_size metric: the shared transaction went unchecked")
	}
}
