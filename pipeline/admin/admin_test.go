package admin_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/onceflow/onceflow/pipeline/admin"
	"github.com/onceflow/onceflow/pipeline/pipelinetest"
)

func get(t *testing.T, h http.Handler, method, path, auth string) (int, string) {
	t.Helper()
	req := httptest.NewRequest(method, path, nil)
	if auth != "" {
		req.Header.Set("Authorization", auth)
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	body, _ := io.ReadAll(rec.Result().Body)
	return rec.Code, string(body)
}

// The admin address answers without credentials (/metrics, /readyz, the
// status page): unless told otherwise it listens on loopback only, and
// the components listen where it says (RunConfig.AdminAddr empty).
func TestAdminListensOnLoopbackByDefault(t *testing.T) {
	t.Parallel()
	addr := admin.New("", prometheus.NewRegistry(), slog.New(slog.DiscardHandler)).Addr()
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatal(err)
	}
	if ip := net.ParseIP(host); ip == nil || !ip.IsLoopback() {
		t.Errorf("the admin address by default is %q, want a loopback address", addr)
	}
}

// /readyz names the failing check without its error's text (which can
// carry host names, users, a database's words); the text goes to the log,
// once per failure rather than once per probe, and the recovery too.
func TestReadyzHidesErrors(t *testing.T) {
	t.Parallel()
	var logs pipelinetest.Buffer
	s := admin.New("", prometheus.NewRegistry(), slog.New(slog.NewTextHandler(&logs, nil)))
	s.SetReadyInterval(time.Nanosecond) // each probe runs the checks
	var mu sync.Mutex
	dbErr := errors.New(`failed to connect to user=billing_admin database=prod: 10.1.2.3:5432: password authentication failed`)
	s.AddCheck("postgres", func(context.Context) error { mu.Lock(); defer mu.Unlock(); return dbErr })
	s.AddCheck("processor", func(context.Context) error { return nil })

	for range 3 {
		code, body := get(t, s.Handler(), "GET", "/readyz", "")
		if code != http.StatusServiceUnavailable {
			t.Errorf("/readyz with a failing check: %d, want 503", code)
		}
		if body != `{"postgres":"failed","processor":"ok"}`+"\n" {
			t.Errorf("/readyz body %q, want each check's ok or failed only", body)
		}
	}
	if n := strings.Count(logs.String(), "readiness check failed"); n != 1 {
		t.Errorf("3 failing probes logged %d failures, want 1:\n%s", n, logs.String())
	}
	if !strings.Contains(logs.String(), "billing_admin") {
		t.Errorf("the log lacks the check's error:\n%s", logs.String())
	}

	mu.Lock()
	dbErr = nil
	mu.Unlock()
	if code, body := get(t, s.Handler(), "GET", "/readyz", ""); code != http.StatusOK || !strings.Contains(body, `"postgres":"ok"`) {
		t.Errorf("/readyz once the check passes: %d %q", code, body)
	}
	if !strings.Contains(logs.String(), "readiness check passes again") {
		t.Errorf("the recovery was not logged:\n%s", logs.String())
	}
}

// A component still starting is not ready, and says so at Info: every
// start goes through it, and `onceflow dev` printed a WARN at each one.
func TestStartingIsNotAWarning(t *testing.T) {
	t.Parallel()
	var logs pipelinetest.Buffer
	s := admin.New("", prometheus.NewRegistry(), slog.New(slog.NewTextHandler(&logs, nil)))
	s.SetReadyInterval(time.Nanosecond) // each probe runs the checks
	var started atomic.Bool
	s.AddCheck("processor", func(context.Context) error {
		if !started.Load() {
			return fmt.Errorf("processor: %w", admin.ErrStarting)
		}
		return nil
	})
	if code, _ := get(t, s.Handler(), "GET", "/readyz", ""); code != http.StatusServiceUnavailable {
		t.Errorf("/readyz while starting: %d, want 503", code)
	}
	started.Store(true)
	if code, _ := get(t, s.Handler(), "GET", "/readyz", ""); code != http.StatusOK {
		t.Errorf("/readyz once started: %d, want 200", code)
	}
	if strings.Contains(logs.String(), "level=WARN") || !strings.Contains(logs.String(), "not ready yet") {
		t.Errorf("a start logged:\n%s\nwant an INFO line and no WARN", logs.String())
	}
}

// A route added with Act answers only the operator token; with no token
// configured it is disabled. The routes that only read need no token.
func TestActRequiresToken(t *testing.T) {
	t.Parallel()
	for _, token := range []string{"", "op-token-123"} {
		reg := prometheus.NewRegistry()
		s := admin.New("", reg, slog.New(slog.DiscardHandler))
		s.SetToken(token)
		calls := 0
		s.Act("POST /unpark", http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { calls++ }))

		for _, tc := range []struct {
			auth string
			want int
		}{
			{"", http.StatusUnauthorized},
			{"Bearer ", http.StatusUnauthorized},
			{"Bearer op-token-12", http.StatusUnauthorized},   // a prefix
			{"Bearer op-token-1234", http.StatusUnauthorized}, // longer
			{"Basic op-token-123", http.StatusUnauthorized},
			{"op-token-123", http.StatusUnauthorized},
			{"Bearer OP-TOKEN-123", http.StatusUnauthorized},
			{"Bearer op-token-123", http.StatusOK},
		} {
			want := tc.want
			if token == "" {
				want = http.StatusForbidden // disabled, whatever is sent
			}
			before := calls
			code, _ := get(t, s.Handler(), "POST", "/unpark", tc.auth)
			if code != want {
				t.Errorf("token %q, Authorization %q: %d, want %d", token, tc.auth, code, want)
			}
			if called := calls > before; called != (want == http.StatusOK) {
				t.Errorf("token %q, Authorization %q: handler called %v", token, tc.auth, called)
			}
		}
		for _, path := range []string{"/metrics", "/healthz", "/readyz"} {
			if code, _ := get(t, s.Handler(), "GET", path, ""); code != http.StatusOK {
				t.Errorf("GET %s without a token: %d, want 200", path, code)
			}
		}
		denied := `
# HELP onceflow_admin_denied_requests_total Requests to admin routes that act refused: reason disabled (no ONCEFLOW_ADMIN_TOKEN set) or unauthorized (no or a wrong token).
# TYPE onceflow_admin_denied_requests_total counter
onceflow_admin_denied_requests_total{reason="disabled"} 8
onceflow_admin_denied_requests_total{reason="unauthorized"} 0
`
		if token != "" {
			denied = strings.NewReplacer(`"disabled"} 8`, `"disabled"} 0`, `"unauthorized"} 0`, `"unauthorized"} 7`).Replace(denied)
		}
		if err := testutil.GatherAndCompare(reg, strings.NewReader(denied), "onceflow_admin_denied_requests_total"); err != nil {
			t.Errorf("token %q: %v", token, err)
		}
	}
}

// RequireToken guards any handler the same way, for routes served
// elsewhere than the admin server.
func TestRequireToken(t *testing.T) {
	t.Parallel()
	h := admin.RequireToken("s3cret", http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusNoContent) }))
	if code, _ := get(t, h, "POST", "/", "Bearer s3cret"); code != http.StatusNoContent {
		t.Errorf("right token: %d, want 204", code)
	}
	code, body := get(t, h, "POST", "/", "Bearer s3cre")
	if code != http.StatusUnauthorized {
		t.Errorf("wrong token: %d, want 401", code)
	}
	if strings.Contains(body, "s3cret") {
		t.Errorf("the answer quotes the token: %q", body)
	}
	if code, _ := get(t, admin.RequireToken("", h), "POST", "/", "Bearer "); code != http.StatusForbidden {
		t.Errorf("no token configured, empty token sent: %d, want 403", code)
	}
}

// failing is a collector whose read fails, as the outbox count does when
// Postgres does not answer in time.
type failing struct{ desc *prometheus.Desc }

func (f failing) Describe(ch chan<- *prometheus.Desc) { ch <- f.desc }
func (f failing) Collect(ch chan<- prometheus.Metric) {
	ch <- prometheus.NewInvalidMetric(f.desc, errors.New("timeout: context deadline exceeded"))
}

// A collector that cannot read leaves its series out of /metrics and says
// why in the log; every other series is still served, with 200, so one
// slow query does not take the whole process out of a scrape.
func TestMetricsServeWhatCanBeRead(t *testing.T) {
	reg := prometheus.NewRegistry()
	logs := &pipelinetest.Buffer{}
	s := admin.New("127.0.0.1:0", reg, slog.New(slog.NewTextHandler(logs, nil)))
	ok := prometheus.NewGauge(prometheus.GaugeOpts{Name: "onceflow_test_ok", Help: "A series that reads."})
	ok.Set(7)
	reg.MustRegister(ok, failing{prometheus.NewDesc("onceflow_test_pending", "A series whose read fails.", nil, nil)})
	code, body := get(t, s.Handler(), http.MethodGet, "/metrics", "")
	if code != http.StatusOK {
		t.Fatalf("GET /metrics: %d, want 200; body:\n%s", code, body)
	}
	if !strings.Contains(body, "onceflow_test_ok 7") {
		t.Errorf("/metrics lacks the series that reads:\n%s", body)
	}
	if strings.Contains(body, "onceflow_test_pending") {
		t.Errorf("/metrics serves the series whose read failed:\n%s", body)
	}
	if !strings.Contains(logs.String(), "onceflow_test_pending") || !strings.Contains(logs.String(), "context deadline exceeded") {
		t.Errorf("the log does not say which series failed and why: %q", logs.String())
	}
}

// A request still open when the admin server stops (a scrape or a status
// page on a loaded machine) is cut after the grace period: the server
// stops as asked, with no error, and says so in the log. It returned the
// timeout as its error, and with it the whole process (TestStatusPage's
// 'onceflow dev: context deadline exceeded' at load 38).
func TestServeStopsDespiteAnOpenRequest(t *testing.T) {
	logs := &pipelinetest.Buffer{}
	s := admin.New("127.0.0.1:0", prometheus.NewRegistry(), slog.New(slog.NewTextHandler(logs, nil)))
	entered, release := make(chan struct{}), make(chan struct{})
	defer close(release)
	s.Handle("GET /slow", http.HandlerFunc(func(http.ResponseWriter, *http.Request) {
		close(entered)
		<-release
	}))
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Serve(ctx, ln) }()
	go http.Get("http://" + ln.Addr().String() + "/slow")
	<-entered
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("Serve: %v, want nil", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Serve did not return within 30 s of its context ending")
	}
	if !strings.Contains(logs.String(), "requests still open at shutdown were cut") {
		t.Errorf("the log does not say requests were cut: %q", logs.String())
	}
}
