package apiclient_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/onceflow/onceflow/examples/ledger"
	"github.com/onceflow/onceflow/examples/ledger/accounts"
	"github.com/onceflow/onceflow/pipeline/apiclient"
	"github.com/onceflow/onceflow/pipeline/avro"
	"github.com/onceflow/onceflow/pipeline/ingest"
	"github.com/onceflow/onceflow/pipeline/ingest/ingesttest"
	"github.com/onceflow/onceflow/pipeline/pipelinetest"
	"github.com/onceflow/onceflow/pipeline/postgres"
)

// fault is what the faulty server in front of ingest does to the n-th
// request (0-based) it sees; nil forwards it as it is.
type fault func(n int, w http.ResponseWriter, r *http.Request, forward func() (*http.Response, []byte)) bool

// faulty is a real ingest (the ledger's routes, a real Postgres) behind a
// proxy that misbehaves as told.
type faulty struct {
	url      string
	ingest   string
	requests atomic.Int64
	mu       sync.Mutex
	fault    fault
	key      string
}

func newFaulty(t *testing.T) *faulty {
	t.Helper()
	ctx := context.Background()
	pool, _ := pipelinetest.Pool(t, postgres.Migrations{Name: "ledger", FS: accounts.Migrations})
	serde, err := avro.NewSerde(avro.NewEmbedded(), avro.ValueSubject("ledger.commands"), ledger.CommandsSchema, ledger.CommandTypes())
	if err != nil {
		t.Fatal(err)
	}
	srv, err := ingest.New(ingest.Config{RateLimit: -1}, ledgerRoutes("ledger.commands", serde), ledgerQueries(), pool,
		slog.New(slog.DiscardHandler), prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	base, _ := ingesttest.Serve(t, srv)
	key := ingest.NewAPIKey()
	if err := ingest.CreateAPIKey(ctx, pool, "acme", "test", key); err != nil {
		t.Fatal(err)
	}
	f := &faulty{ingest: base, key: key}
	target, _ := url.Parse(f.ingest)
	proxy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := int(f.requests.Add(1) - 1)
		body, _ := io.ReadAll(r.Body)
		forward := func() (*http.Response, []byte) {
			req, _ := http.NewRequest(r.Method, target.String()+r.URL.RequestURI(), bytes.NewReader(body))
			req.Header = r.Header.Clone()
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Errorf("proxy: %v", err)
				return nil, nil
			}
			defer resp.Body.Close()
			b, _ := io.ReadAll(resp.Body)
			return resp, b
		}
		f.mu.Lock()
		fl := f.fault
		f.mu.Unlock()
		if fl != nil && fl(n, w, r, forward) {
			return
		}
		resp, b := forward()
		if resp == nil {
			return
		}
		for k, v := range resp.Header {
			w.Header()[k] = v
		}
		w.WriteHeader(resp.StatusCode)
		w.Write(b)
	}))
	t.Cleanup(proxy.Close)
	f.url = proxy.URL
	return f
}

func (f *faulty) with(fl fault) *apiclient.Client {
	f.mu.Lock()
	f.fault = fl
	f.mu.Unlock()
	f.requests.Store(0)
	return &apiclient.Client{BaseURL: f.url, APIKey: f.key}
}

// commandID is the command a deposit's key names: ingest's stored answer
// to it, replayed.
func (f *faulty) commandID(t *testing.T, key string) string {
	t.Helper()
	c := &apiclient.Client{BaseURL: f.ingest, APIKey: f.key}
	acc, resp, err := c.Post(context.Background(), "/v1/accounts/acc-1/deposits", key, map[string]int64{"amount": 5})
	if err != nil || !resp.Replayed() {
		t.Fatalf("replay of %s: %v (replayed %v)", key, err, resp != nil && resp.Replayed())
	}
	return acc.CommandID
}

// One intention is one command, whatever the server does to its attempts:
// it drops the connection after committing, answers 503 with Retry-After,
// or answers after the client stopped waiting. Every attempt carries the
// same key, so the retries find the command the first attempt created.
func TestSendOneCommandPerIntention(t *testing.T) {
	t.Parallel()
	f := newFaulty(t)
	ctx := context.Background()
	deposit := func(key string) apiclient.Intention {
		return apiclient.Intention{Path: "/v1/accounts/acc-1/deposits", Body: map[string]int64{"amount": 5}, Key: key}
	}
	policy := apiclient.Retry{Attempt: 300 * time.Millisecond, BaseDelay: 10 * time.Millisecond, MaxDelay: 100 * time.Millisecond}
	for _, tc := range []struct {
		name         string
		fault        fault
		wantAttempts int
		atLeast      time.Duration
	}{
		{"dropped after committing", func(n int, w http.ResponseWriter, r *http.Request, forward func() (*http.Response, []byte)) bool {
			if n > 0 {
				return false
			}
			forward() // ingest commits and answers; the client never hears it
			conn, _, _ := w.(http.Hijacker).Hijack()
			conn.Close()
			return true
		}, 2, 0},
		{"503 with Retry-After", func(n int, w http.ResponseWriter, r *http.Request, _ func() (*http.Response, []byte)) bool {
			if n > 0 {
				return false
			}
			w.Header().Set("Retry-After", "1")
			w.WriteHeader(http.StatusServiceUnavailable)
			return true
		}, 2, time.Second},
		{"429 with an HTTP-date Retry-After", func(n int, w http.ResponseWriter, r *http.Request, _ func() (*http.Response, []byte)) bool {
			if n > 0 {
				return false
			}
			w.Header().Set("Retry-After", time.Now().Add(2*time.Second).UTC().Format(http.TimeFormat))
			w.WriteHeader(http.StatusTooManyRequests)
			return true
		}, 2, time.Second},
		{"slower than the attempt's timeout", func(n int, w http.ResponseWriter, r *http.Request, forward func() (*http.Response, []byte)) bool {
			if n > 0 {
				return false
			}
			forward()
			time.Sleep(time.Second) // the client gave up on this attempt
			return true
		}, 2, 0},
	} {
		key := apiclient.NewKey()
		c := f.with(tc.fault)
		start := time.Now()
		sent, err := c.Send(ctx, deposit(key), policy)
		took := time.Since(start)
		if err != nil {
			t.Errorf("%s: %v", tc.name, err)
			continue
		}
		if sent.Attempts != tc.wantAttempts || took < tc.atLeast {
			t.Errorf("%s: %d attempts in %v; want %d, after at least %v", tc.name, sent.Attempts, took, tc.wantAttempts, tc.atLeast)
		}
		if want := f.commandID(t, key); sent.Accepted.CommandID != want {
			t.Errorf("%s: Send got command %s; the key names %s", tc.name, sent.Accepted.CommandID, want)
		}
	}

	// A definite refusal is not retried: the key used for another
	// request, an invalid body.
	key := apiclient.NewKey()
	c := f.with(nil)
	if _, err := c.Send(ctx, deposit(key), policy); err != nil {
		t.Fatal(err)
	}
	other := deposit(key)
	other.Body = map[string]int64{"amount": 6}
	if sent, err := c.Send(ctx, other, policy); !apiclient.IsStatus(err, http.StatusConflict) || sent.Attempts != 1 {
		t.Errorf("the key reused: %v after %d attempts, want a 409 at once", err, sent.Attempts)
	}
	bad := apiclient.Intention{Path: "/v1/accounts/acc-1/deposits", Body: map[string]int64{"amount": -1}, Key: apiclient.NewKey()}
	if sent, err := c.Send(ctx, bad, policy); !apiclient.IsStatus(err, http.StatusUnprocessableEntity) || sent.Attempts != 1 {
		t.Errorf("an invalid body: %v after %d attempts, want a 422 at once", err, sent.Attempts)
	}
	// A server that never answers well: Send stops at its deadline and
	// says the operation may or may not have happened.
	down := f.with(func(int, http.ResponseWriter, *http.Request, func() (*http.Response, []byte)) bool {
		panic(http.ErrAbortHandler)
	})
	start := time.Now()
	sent, err := down.Send(ctx, deposit(apiclient.NewKey()), apiclient.Retry{Deadline: 700 * time.Millisecond, BaseDelay: 10 * time.Millisecond, MaxDelay: 50 * time.Millisecond})
	if !errors.Is(err, apiclient.ErrDeadline) || sent.Attempts < 3 || time.Since(start) > 5*time.Second {
		t.Errorf("a server that drops every request: %v after %d attempts in %v, want ErrDeadline after several", err, sent.Attempts, time.Since(start))
	}
}

// WaitCommand asks again after what may pass (a 503, a 429, a 404 for a
// command not known yet) and returns at once what will not: a wrong key's
// 401 does not become an outcome by waiting, and its caller learns so
// before its deadline. A wait that runs out says what the last answer
// was.
func TestWaitCommandRetriesOnlyWhatMayPass(t *testing.T) {
	t.Parallel()
	f := newFaulty(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	c := f.with(nil)
	c.APIKey = "not-a-key"
	_, err := c.WaitCommand(ctx, "01890000-0000-7000-8000-000000000000")
	if !apiclient.IsStatus(err, http.StatusUnauthorized) || ctx.Err() != nil {
		t.Fatalf("a wrong key: %v (deadline passed: %v), want its 401 at once", err, ctx.Err())
	}

	short, cancelShort := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancelShort()
	_, err = f.with(nil).WaitCommand(short, "01890000-0000-7000-8000-000000000000")
	if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "the last answer: 404") {
		t.Fatalf("a command not known (yet): %v, want the deadline and the last answer, its 404", err)
	}

	c = f.with(func(n int, w http.ResponseWriter, r *http.Request, _ func() (*http.Response, []byte)) bool {
		switch n {
		case 0:
			w.Header().Set("Retry-After", "0")
			w.WriteHeader(http.StatusServiceUnavailable)
		case 1:
			w.WriteHeader(http.StatusTooManyRequests)
		default:
			w.Header().Set("Content-Type", "application/json")
			io.WriteString(w, `{"command_id":"01890000-0000-7000-8000-000000000001","status":"accepted","event_ids":[]}`)
		}
		return true
	})
	cmd, err := c.WaitCommand(ctx, "01890000-0000-7000-8000-000000000001")
	if err != nil || cmd.Status != "accepted" {
		t.Fatalf("after a 503 and a 429: %+v %v, want the outcome", cmd, err)
	}
	if n := f.requests.Load(); n != 3 {
		t.Errorf("%d requests, want 3 (503, 429, the answer)", n)
	}
}
