package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	hdrhistogram "github.com/HdrHistogram/hdrhistogram-go"
)

// api is the ledger's HTTP API as the load generator uses it: the same
// routes on onceflow's ingest, on the Watermill peer and on the no-op
// server (docs/ingest.md#routes).
type api struct {
	base     string
	keys     []string // one API key per tenant
	accounts int      // accounts per tenant: acc-0 ... acc-(accounts-1)
	http     *http.Client
	wait     time.Duration // ?wait= of each outcome read
	seq      atomic.Int64  // Idempotency-Key sequence
	run      string        // this run's Idempotency-Key prefix
	refused  atomic.Int64  // waits answered at once with Retry-After
}

func newAPI(base string, keys []string, accounts int) *api {
	tr := &http.Transport{
		MaxIdleConns:        4096,
		MaxIdleConnsPerHost: 4096,
		IdleConnTimeout:     90 * time.Second,
	}
	return &api{
		base: base, keys: keys, accounts: accounts,
		http: &http.Client{Transport: tr, Timeout: 30 * time.Second},
		wait: 5 * time.Second,
		run:  strconv.FormatInt(time.Now().UnixNano(), 36),
	}
}

// errPending is an outcome read that came back pending after its wait.
var errPending = errors.New("still pending")

func (a *api) do(ctx context.Context, method, path, key string, body any) (int, http.Header, []byte, error) {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return 0, nil, nil, err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, a.base+path, rd)
	if err != nil {
		return 0, nil, nil, err
	}
	req.Header.Set("Authorization", "Bearer "+key)
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Idempotency-Key", a.run+"-"+strconv.FormatInt(a.seq.Add(1), 10))
	}
	resp, err := a.http.Do(req)
	if err != nil {
		return 0, nil, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header, b, err
}

// post sends a command and returns its id once it is accepted (202).
func (a *api) post(ctx context.Context, key, path string, body any) (string, error) {
	status, _, b, err := a.do(ctx, http.MethodPost, path, key, body)
	if err != nil {
		return "", err
	}
	if status != http.StatusAccepted {
		return "", fmt.Errorf("POST %s: %d %s", path, status, b)
	}
	var acc struct {
		CommandID string `json:"command_id"`
	}
	if err := json.Unmarshal(b, &acc); err != nil || acc.CommandID == "" {
		return "", fmt.Errorf("POST %s: no command_id in %s", path, b)
	}
	return acc.CommandID, nil
}

// outcome waits until the command's status is terminal and returns it.
// A wait answered pending (over, or beyond ingest's bound on waits) is
// read again at once.
func (a *api) outcome(ctx context.Context, key, id string) (string, error) {
	path := "/v1/commands/" + id + "?wait=" + a.wait.String()
	for {
		status, h, b, err := a.do(ctx, http.MethodGet, path, key, nil)
		if err != nil {
			return "", err
		}
		if status != http.StatusOK {
			return "", fmt.Errorf("GET %s: %d %s", path, status, b)
		}
		var st struct {
			Status string `json:"status"`
		}
		if err := json.Unmarshal(b, &st); err != nil {
			return "", fmt.Errorf("GET %s: %w", path, err)
		}
		if st.Status != "pending" {
			return st.Status, nil
		}
		if err := ctx.Err(); err != nil {
			return "", errPending
		}
		// Answered at once, beyond ingest's bound on waits in flight:
		// read again after 50 ms (a client would wait the Retry-After's
		// second; the benchmark keeps measuring, and counts these). Only an
		// overloaded system gets here, and its latency is already far past
		// the goal; sooner reads would only add to its load.
		if h.Get("Retry-After") != "" {
			a.refused.Add(1)
			time.Sleep(50 * time.Millisecond)
		}
	}
}

// account names the i-th operation's tenant and account: every tenant and
// account in turn.
func (a *api) account(i int) (key, account string) {
	t := i % len(a.keys)
	return a.keys[t], "acc-" + strconv.Itoa((i/len(a.keys))%a.accounts)
}

// open opens every account of every tenant and waits for the outcomes.
func (a *api) open(ctx context.Context) error {
	openOne := func(key string, n int) error {
		var id string
		var err error
		// Setup only: a 503 (ingest looking up many new keys at once) is
		// sent again.
		for range 50 {
			id, err = a.post(ctx, key, "/v1/accounts", map[string]any{"account_id": "acc-" + strconv.Itoa(n), "currency": "EUR"})
			if err == nil || !strings.Contains(err.Error(), ": 503 ") {
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
		if err != nil {
			return err
		}
		st, err := a.outcome(ctx, key, id)
		if err == nil && st != "accepted" {
			err = fmt.Errorf("open acc-%d: %s", n, st)
		}
		return err
	}
	// Each tenant's first request alone, so its key is looked up once.
	for _, key := range a.keys {
		if err := openOne(key, 0); err != nil {
			return err
		}
	}
	sem := make(chan struct{}, 32)
	errs := make(chan error, len(a.keys)*a.accounts)
	var wg sync.WaitGroup
	for _, key := range a.keys {
		for n := 1; n < a.accounts; n++ {
			wg.Add(1)
			sem <- struct{}{}
			go func() {
				defer wg.Done()
				defer func() { <-sem }()
				if err := openOne(key, n); err != nil {
					errs <- err
				}
			}()
		}
	}
	wg.Wait()
	close(errs)
	return <-errs
}

// sample is one operation's figures, in nanoseconds from its intended
// start.
type sample struct {
	accepted time.Duration // the 202
	visible  time.Duration // its outcome read back
	err      error
}

// deposit is the measured operation: a deposit of 1 into the i-th
// account, then its outcome read with ?wait=. Both figures count from
// intended, the time the timetable meant the request to leave.
func (a *api) deposit(ctx context.Context, i int, intended time.Time) sample {
	key, acc := a.account(i)
	id, err := a.post(ctx, key, "/v1/accounts/"+acc+"/deposits", map[string]any{"amount": 1})
	s := sample{accepted: time.Since(intended)}
	if err != nil {
		s.err = err
		return s
	}
	st, err := a.outcome(ctx, key, id)
	s.visible = time.Since(intended)
	if err == nil && st != "accepted" {
		err = fmt.Errorf("deposit %s: %s", id, st)
	}
	s.err = err
	return s
}

// result is one load step's figures.
type result struct {
	Rate     float64 // asked for (open loop) or achieved (closed loop), operations/s
	Achieved float64 // operations completed per second of the step
	Clients  int     // closed loop only
	N, Errs  int
	FirstErr string
	Accepted latencies // POST -> 202
	Visible  latencies // POST -> outcome visible
	Stages   []stage   // per-stage breakdown from /metrics (deltas)
	Work     []stage   // each stage's batches over the step (deltas)
	Seconds  float64   // the step's length, drained
	CPU      cpuUse    // cores used over the step
	// Statements are what the target's database ran over the step
	// (pg_stat_statements), or StatementsErr why they are unknown.
	Statements    []statement
	StatementsErr string
	Held          bool // p99 of Visible <= the goal
}

// latencies are a distribution's quantiles, in milliseconds.
type latencies struct{ P50, P99, P999, Max, Mean float64 }

func newHist() *hdrhistogram.Histogram {
	return hdrhistogram.New(1, int64(120*time.Second/time.Microsecond), 3) // µs, 1 µs to 120 s
}

func quantiles(h *hdrhistogram.Histogram) latencies {
	ms := func(v int64) float64 { return float64(v) / 1000 }
	return latencies{
		P50: ms(h.ValueAtQuantile(50)), P99: ms(h.ValueAtQuantile(99)), P999: ms(h.ValueAtQuantile(99.9)),
		Max: ms(h.Max()), Mean: h.Mean() / 1000,
	}
}

// recorder gathers samples into the two histograms.
type recorder struct {
	mu                sync.Mutex
	accepted, visible *hdrhistogram.Histogram
	n, errs           int
	firstErr          error
}

func newRecorder() *recorder { return &recorder{accepted: newHist(), visible: newHist()} }

func (r *recorder) add(s sample) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.n++
	if s.err != nil {
		r.errs++
		if r.firstErr == nil {
			r.firstErr = s.err
		}
		return
	}
	r.accepted.RecordValue(s.accepted.Microseconds())
	r.visible.RecordValue(s.visible.Microseconds())
}

func (r *recorder) result() result {
	res := result{N: r.n, Errs: r.errs, Accepted: quantiles(r.accepted), Visible: quantiles(r.visible)}
	if r.firstErr != nil {
		res.FirstErr = r.firstErr.Error()
	}
	return res
}

// maxInFlight bounds the operations an open-loop step has outstanding.
// Past it the next send waits, and its latency, counted from its intended
// time, includes the wait: the bound protects the machine, not the
// figures.
const maxInFlight = 4096

// openLoop sends rate operations per second for d on a fixed timetable
// (operation i is due at start + i/rate, whether or not earlier ones have
// answered) and measures each from its due time, so a stall shows in every
// operation it delays (no coordinated omission).
func openLoop(ctx context.Context, rate float64, d time.Duration, op func(ctx context.Context, i int, intended time.Time) sample) result {
	n := int(rate * d.Seconds())
	rec := newRecorder()
	sem := make(chan struct{}, maxInFlight)
	var wg sync.WaitGroup
	start := time.Now().Add(10 * time.Millisecond)
	interval := float64(time.Second) / rate
	for i := range n {
		due := start.Add(time.Duration(float64(i) * interval))
		if w := time.Until(due); w > 0 {
			select {
			case <-ctx.Done():
				return rec.result()
			case <-time.After(w):
			}
		}
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			rec.add(op(ctx, i, due))
		}()
	}
	wg.Wait()
	res := rec.result()
	res.Rate = rate
	res.Achieved = float64(n) / time.Since(start).Seconds()
	return res
}

// closedLoop runs clients that each send an operation as soon as their
// previous one completed, for d, and reports the rate they achieved.
func closedLoop(ctx context.Context, clients int, d time.Duration, op func(ctx context.Context, i int, intended time.Time) sample) result {
	rec := newRecorder()
	var next atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	end := start.Add(d)
	for range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Now().Before(end) && ctx.Err() == nil {
				rec.add(op(ctx, int(next.Add(1)), time.Now()))
			}
		}()
	}
	wg.Wait()
	res := rec.result()
	res.Clients = clients
	res.Achieved = float64(res.N-res.Errs) / time.Since(start).Seconds()
	res.Rate = res.Achieved
	return res
}
