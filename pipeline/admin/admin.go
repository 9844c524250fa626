// Package admin serves what every onceflow component exposes on its admin
// address: /metrics (Prometheus), /healthz (the process is alive) and
// /readyz (its dependencies answer and it has started its work).
package admin

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sort"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Check is one readiness check; it returns nil when ready.
type Check func(ctx context.Context) error

// Server is the admin HTTP server of one process.
type Server struct {
	addr     string
	registry *prometheus.Registry
	logger   *slog.Logger

	mu     sync.Mutex
	checks map[string]Check
	mux    *http.ServeMux
}

// NewRegistry returns a registry with the Go runtime and process
// collectors, which every component's metrics are added to.
func NewRegistry() *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return reg
}

// New returns a server for addr (ADMIN_ADDR, default ":9090").
func New(addr string, registry *prometheus.Registry, logger *slog.Logger) *Server {
	if addr == "" {
		addr = ":9090"
	}
	s := &Server{addr: addr, registry: registry, logger: logger, checks: map[string]Check{}, mux: http.NewServeMux()}
	s.mux.Handle("GET /metrics", promhttp.HandlerFor(registry, promhttp.HandlerOpts{Registry: registry}))
	s.mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		fmt.Fprintln(w, "ok")
	})
	s.mux.HandleFunc("GET /readyz", s.ready)
	return s
}

// AddCheck adds a named readiness check. A component adds one per
// dependency (postgres, kafka) and one that passes once it has started.
func (s *Server) AddCheck(name string, c Check) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.checks[name] = c
}

// Handle adds a route (the dev stack serves the schema registry here too).
func (s *Server) Handle(pattern string, h http.Handler) { s.mux.Handle(pattern, h) }

// Handler returns the server's routes, for tests.
func (s *Server) Handler() http.Handler { return s.mux }

func (s *Server) ready(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	names := make([]string, 0, len(s.checks))
	for n := range s.checks {
		names = append(names, n)
	}
	checks := make(map[string]Check, len(s.checks))
	for n, c := range s.checks {
		checks[n] = c
	}
	s.mu.Unlock()
	sort.Strings(names)

	ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
	defer cancel()
	result := make(map[string]string, len(names))
	ok := true
	for _, n := range names {
		if err := checks[n](ctx); err != nil {
			result[n] = err.Error()
			ok = false
		} else {
			result[n] = "ok"
		}
	}
	w.Header().Set("Content-Type", "application/json")
	if !ok {
		w.WriteHeader(http.StatusServiceUnavailable)
	}
	json.NewEncoder(w).Encode(result)
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
		return err
	}
	return nil
}
