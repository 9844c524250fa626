// Package admin serves what every onceflow component exposes on its admin
// address: /metrics (Prometheus), /healthz (the process is alive) and
// /readyz (its dependencies answer and it has started its work).
//
// Those three only read, and answer anyone who can reach the address:
// bind it where only the scrapers and probes can (docs/security.md).
// Routes that act (unpark, redrive) are added with Act, which puts them
// behind RequireToken: they answer only requests bearing the operator
// token (ONCEFLOW_ADMIN_TOKEN), and are disabled when no token is set.
package admin

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/onceflow/onceflow/pipeline/problem"
)

// Check is one readiness check; it returns nil when ready.
type Check func(ctx context.Context) error

// Server is the admin HTTP server of one process.
type Server struct {
	addr     string
	registry *prometheus.Registry
	logger   *slog.Logger

	mu      sync.Mutex
	checks  map[string]Check
	failing Failures // the checks' failures logged
	token   string
	denied  *prometheus.CounterVec
	mux     *http.ServeMux

	readiness readiness
}

// DefaultReadyInterval is how long one run of the readiness checks
// answers /readyz when SetReadyInterval was not called.
const DefaultReadyInterval = time.Second

// readiness is the last run of the checks and when it was made. /readyz
// answers anyone who reaches the admin address and the postgres check is
// a round trip to the database, so the checks run at most once per every,
// however many ask: callers that come while a run is under way wait for
// it and share it, as /status.json's readings do (docs/security.md).
type readiness struct {
	mu     sync.Mutex // one run at a time; the others wait for it
	every  time.Duration
	ranAt  time.Time // zero: run at the next call
	result map[string]string
	ok     bool
}

// NewRegistry returns a registry with the Go runtime and process
// collectors, which every component's metrics are added to.
func NewRegistry() *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return reg
}

// DefaultAddr is the admin address when none is given: loopback only.
// /metrics, /readyz and the status page answer without credentials, so
// reaching them from elsewhere is a choice (ADMIN_ADDR=:9090, or a private
// interface), not a default (docs/security.md).
const DefaultAddr = "127.0.0.1:9090"

// New returns a server for addr (ADMIN_ADDR, default DefaultAddr).
func New(addr string, registry *prometheus.Registry, logger *slog.Logger) *Server {
	if addr == "" {
		addr = DefaultAddr
	}
	s := &Server{addr: addr, registry: registry, logger: logger, checks: map[string]Check{}, mux: http.NewServeMux()}
	s.readiness.every = DefaultReadyInterval
	s.denied = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "onceflow_admin_denied_requests_total",
		Help: "Requests to admin routes that act refused: reason disabled (no ONCEFLOW_ADMIN_TOKEN set) or unauthorized (no or a wrong token).",
	}, []string{"reason"})
	for _, r := range []string{"disabled", "unauthorized"} {
		s.denied.WithLabelValues(r)
	}
	registry.MustRegister(s.denied)
	// A collector that cannot read (a Postgres count that timed out under
	// load) leaves its series out and logs why; the scrape still serves
	// every other series. With promhttp's default a single slow query
	// answered 500 and the whole process vanished from that scrape.
	s.mux.Handle("GET /metrics", promhttp.HandlerFor(registry, promhttp.HandlerOpts{
		Registry:      registry,
		ErrorHandling: promhttp.ContinueOnError,
		ErrorLog:      scrapeLog{logger},
	}))
	s.mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		fmt.Fprintln(w, "ok")
	})
	s.mux.HandleFunc("GET /readyz", s.ready)
	return s
}

// Addr is the address Run listens on: the one New was given, or
// DefaultAddr.
func (s *Server) Addr() string { return s.addr }

// AddCheck adds a named readiness check. A component adds one per
// dependency (postgres, kafka) and one that passes once it has started.
func (s *Server) AddCheck(name string, c Check) {
	s.mu.Lock()
	s.checks[name] = c
	s.mu.Unlock()
	s.readiness.mu.Lock()
	s.readiness.ranAt = time.Time{}
	s.readiness.mu.Unlock()
}

// SetReadyInterval sets how long one run of the readiness checks answers
// /readyz (default DefaultReadyInterval, 1s): a check that starts failing
// shows within it, and callers within it cost no check. Call it before
// Serve.
func (s *Server) SetReadyInterval(d time.Duration) {
	s.readiness.mu.Lock()
	defer s.readiness.mu.Unlock()
	s.readiness.every = d
}

// Handle adds a route that only reads: anyone who reaches the admin
// address may call it. Routes that change anything use Act.
func (s *Server) Handle(pattern string, h http.Handler) { s.mux.Handle(pattern, h) }

// SetToken sets the operator token the routes added with Act require
// (ONCEFLOW_ADMIN_TOKEN). Call it before Serve; empty (the default)
// disables those routes.
func (s *Server) SetToken(token string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.token = token
}

// ActsEnabled reports whether the routes added with Act answer: an
// operator token is set. A page says so rather than offering actions that
// can only be refused.
func (s *Server) ActsEnabled() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.token != ""
}

// Act adds a route that acts (unparks, redrives, changes state): it
// answers only requests bearing the operator token (see RequireToken).
func (s *Server) Act(pattern string, h http.Handler) {
	s.mux.Handle(pattern, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.mu.Lock()
		token := s.token
		s.mu.Unlock()
		requireToken(token, s.denied, h).ServeHTTP(w, r)
	}))
}

// RequireToken returns h behind the operator token: a request must carry
// "Authorization: Bearer <token>" or it gets 401 and h is not called. The
// comparison takes the same time whatever the bytes and length of the
// token sent (both sides are hashed first, then compared in constant
// time), so a caller cannot guess it byte by byte. An empty token disables
// h: every request gets 403, because a route that acts with no credential
// set would be open to anyone who reaches the port.
func RequireToken(token string, h http.Handler) http.Handler {
	return requireToken(token, nil, h)
}

func requireToken(token string, denied *prometheus.CounterVec, h http.Handler) http.Handler {
	want := sha256.Sum256([]byte(token))
	deny := func(w http.ResponseWriter, status int, reason, detail string) {
		if denied != nil {
			denied.WithLabelValues(reason).Inc()
		}
		if status == http.StatusUnauthorized {
			w.Header().Set("WWW-Authenticate", `Bearer realm="onceflow admin"`)
		}
		problem.Write(w, problem.New(status, "admin-"+reason, http.StatusText(status), detail))
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if token == "" {
			deny(w, http.StatusForbidden, "disabled", "disabled: set ONCEFLOW_ADMIN_TOKEN to enable the admin routes that act")
			return
		}
		got, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		sum := sha256.Sum256([]byte(got))
		if subtle.ConstantTimeCompare(sum[:], want[:]) != 1 || !ok {
			deny(w, http.StatusUnauthorized, "unauthorized", "unauthorized: send Authorization: Bearer <ONCEFLOW_ADMIN_TOKEN>")
			return
		}
		h.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), identityKey{}, TokenIdentity)))
	})
}

// TokenIdentity is who an action done with the operator token is recorded
// as. One token is shared by every operator it is given to, so all it
// proves is that the caller holds it: every holder is this one identity.
// A name the caller sends (an operator field) is its claim, recorded as
// such next to it (Who), never as who acted. Neither the token nor a hash
// of it is recorded: a hash of a weak token would let whoever reads the
// audit try guesses offline.
const TokenIdentity = "admin-token"

type identityKey struct{}

// Identity is who r was authenticated as by a route added with Act
// (TokenIdentity), or "" for a route that reads.
func Identity(r *http.Request) string {
	id, _ := r.Context().Value(identityKey{}).(string)
	return id
}

// maxClaimBytes bounds the name a caller claims in Who.
const maxClaimBytes = 64

// Who is what the audit of an action records as who did it: r's
// Identity, and the name the caller claims, quoted and cut to 64 bytes,
// when it sent one: `admin-token (operator says "alice")`.
func Who(r *http.Request, claimed string) string {
	who := Identity(r)
	if claimed == "" {
		return who
	}
	claimed = strings.ToValidUTF8(claimed, "\ufffd")
	if len(claimed) > maxClaimBytes {
		n := maxClaimBytes
		for n > 0 && !utf8.RuneStart(claimed[n]) {
			n--
		}
		claimed = claimed[:n]
	}
	return fmt.Sprintf("%s (operator says %s)", who, strconv.Quote(claimed))
}

// Handler returns the server's routes, for tests.
func (s *Server) Handler() http.Handler { return s.mux }

func (s *Server) ready(w http.ResponseWriter, r *http.Request) {
	result, ok := s.runChecks(r.Context())
	w.Header().Set("Content-Type", "application/json")
	if !ok {
		w.WriteHeader(http.StatusServiceUnavailable)
	}
	json.NewEncoder(w).Encode(result)
}

// runChecks returns each check's "ok" or "failed" and whether all passed,
// running the checks again at most once per the ready interval. The run is
// not the caller's: a caller that goes away does not fail it for the
// others waiting on it.
func (s *Server) runChecks(ctx context.Context) (map[string]string, bool) {
	rd := &s.readiness
	rd.mu.Lock()
	defer rd.mu.Unlock()
	if !rd.ranAt.IsZero() && time.Since(rd.ranAt) < rd.every {
		return rd.result, rd.ok
	}
	s.mu.Lock()
	checks := make(map[string]Check, len(s.checks))
	for n, c := range s.checks {
		checks[n] = c
	}
	s.mu.Unlock()
	names := make([]string, 0, len(checks))
	for n := range checks {
		names = append(names, n)
	}
	sort.Strings(names)

	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
	defer cancel()
	// The answer says only which check failed: an error's text (a
	// database's, a host name, a user) is for the operator's logs, not for
	// whoever reaches the port. Each failure is logged when it starts or
	// changes, not at every probe.
	result := make(map[string]string, len(names))
	ok := true
	for _, n := range names {
		err := checks[n](ctx)
		s.noteCheck(n, err)
		if err != nil {
			result[n] = "failed"
			ok = false
		} else {
			result[n] = "ok"
		}
	}
	rd.result, rd.ok, rd.ranAt = result, ok, time.Now()
	return result, ok
}

// ErrStarting is what a component's own readiness check answers until it
// has started: not ready, and not a failure either.
var ErrStarting = errors.New("starting")

// noteCheck logs a check's failure when it starts or its error changes, and
// its recovery. A component still starting is said at Info: every start
// goes through it, and a warning there reads as a problem.
func (s *Server) noteCheck(name string, err error) {
	switch {
	case !s.failing.Changed(name, err):
	case errors.Is(err, ErrStarting):
		s.logger.Info("not ready yet", "check", name, "reason", err)
	case err != nil:
		s.logger.Warn("readiness check failed", "check", name, "err", err)
	default:
		s.logger.Info("readiness check passes again", "check", name)
	}
}

// Failures remembers which of a set of named sources (readiness checks,
// what the status page reads) are failing and with what, so that their
// logs say a failure when it starts or its error changes and a recovery
// once, not a line per attempt. The zero value is ready to use.
type Failures struct {
	mu      sync.Mutex
	failing map[string]string // name -> the error last logged for it
}

// Changed records name's latest result, err or nil, and reports whether it
// is worth a log line: a new or changed failure, or a recovery.
func (f *Failures) Changed(name string, err error) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	last, was := f.failing[name]
	switch {
	case err != nil && (!was || last != err.Error()):
		if f.failing == nil {
			f.failing = map[string]string{}
		}
		f.failing[name] = err.Error()
		return true
	case err == nil && was:
		delete(f.failing, name)
		return true
	}
	return false
}

// Run serves until ctx ends, then shuts down gracefully.
func (s *Server) Run(ctx context.Context) error {
	ln, err := net.Listen("tcp", s.addr)
	if err != nil {
		return fmt.Errorf("admin listen on %s: %w", s.addr, err)
	}
	return s.Serve(ctx, ln)
}

// Serve is Run on an existing listener.
func (s *Server) Serve(ctx context.Context, ln net.Listener) error {
	srv := &http.Server{Handler: s.mux, ReadHeaderTimeout: 5 * time.Second}
	s.logger.Info("admin listening", "addr", ln.Addr().String())
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return fmt.Errorf("admin server: %w", err)
	case <-ctx.Done():
	}
	shutdownCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if err := srv.Shutdown(shutdownCtx); err != nil && !errors.Is(err, http.ErrServerClosed) {
		// A scrape or a status page still reading after the grace period
		// (a loaded machine): nothing the admin address serves is work
		// to finish, so its connections are closed and the process stops
		// as asked, rather than ending with the timeout as its error.
		s.logger.Warn("admin server: requests still open at shutdown were cut", "err", err)
		srv.Close()
	}
	return nil
}

// scrapeLog passes promhttp's errors (a collector that failed) to the
// process's log.
type scrapeLog struct{ l *slog.Logger }

func (s scrapeLog) Println(v ...any) {
	if s.l != nil {
		s.l.Warn("metrics: a collector failed; its series are left out of this scrape", "err", fmt.Sprint(v...))
	}
}
