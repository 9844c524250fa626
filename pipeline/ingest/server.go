package ingest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
	"golang.org/x/sync/singleflight"

	"github.com/onceflow/onceflow/pipeline/postgres"
	"github.com/onceflow/onceflow/pipeline/tracing"
)

// Encoder encodes a command payload into the bytes of a Kafka record value
// (the Avro serde of the commands topic).
type Encoder interface {
	Encode(ctx context.Context, v any) ([]byte, error)
}

// Server is the ingest HTTP server.
type Server struct {
	cfg      Config
	pool     *pgxpool.Pool
	logger   *slog.Logger
	metrics  *metrics
	limiter  *limiter // per tenant
	failures *limiter // failed authentications per client address
	keys     keyCache
	// learnedKey is the id of the newest API key learnKeys read.
	learnedKey int64
	badKeys    badKeyCache
	lookups    singleflight.Group
	// lookupSlots bounds the key lookups running at once (MaxKeyLookups).
	lookupSlots chan struct{}
	waits       waits
	committer   *committer
	wake        *wakeups
	mux         *http.ServeMux
	routes      []string // the API's routes, "METHOD /path", for the OpenAPI check
	providers   map[string]*inboundProvider
	byType      map[string]*Route // the first route of each command type
	tracer      tracing.Tracer
}

// New returns a server for the command routes and the queries of the
// application's domains; GET /v1/commands/{id} and GET /openapi.json are
// every server's. reg receives its metrics. Nothing runs until Run or
// Serve.
func New(cfg Config, routes []Route, queries []Query, pool *pgxpool.Pool, logger *slog.Logger, reg prometheus.Registerer) (*Server, error) {
	cfg.setDefaults()
	if cfg.Committers == 0 {
		cfg.Committers = max(1, min(2, int(pool.Config().MaxConns)/2))
	}
	if cfg.MaxKeyLookups == 0 {
		cfg.MaxKeyLookups = max(2, int(pool.Config().MaxConns)/4)
	}
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	logger = logger.With("component", "ingest")
	m := newMetrics(reg)
	s := &Server{
		cfg: cfg, pool: pool, logger: logger, metrics: m,
		limiter:     newLimiter(cfg.RateLimit, cfg.RateBurst, 0),
		failures:    newLimiter(cfg.AuthFailureRate, cfg.AuthFailureBurst, maxTrackedAddrs),
		badKeys:     badKeyCache{size: cfg.BadKeyCacheSize, ttl: cfg.BadKeyTTL},
		lookupSlots: make(chan struct{}, cfg.MaxKeyLookups),
		waits:       waits{max: cfg.MaxWaits, maxPerTenant: cfg.MaxWaitsPerTenant},
		committer:   newCommitter(pool, cfg, logger, m),
		tracer:      tracing.New(cfg.TracerProvider),
		wake:        newWakeups(pool, logger, cfg.WaitPoll),
		mux:         http.NewServeMux(),
		byType:      map[string]*Route{},
	}
	s.committer.wake = s.wake
	seen := map[string]bool{commandPattern: true}
	prepared := make([]*Route, 0, len(routes))
	for i := range routes {
		r := routes[i]
		if err := r.prepare(); err != nil {
			return nil, fmt.Errorf("ingest: %w", err)
		}
		if r.Topic == "" || r.Encoder == nil {
			return nil, fmt.Errorf("ingest: route %s: Topic and Encoder are required (the application sets them)", r.Pattern)
		}
		if seen[r.Pattern] {
			return nil, fmt.Errorf("ingest: route %s declared twice", r.Pattern)
		}
		seen[r.Pattern] = true
		prepared = append(prepared, &r)
		s.route(r.Pattern, s.accept(&r))
	}
	for _, q := range queries {
		if !strings.HasPrefix(q.Pattern, http.MethodGet+" /") || q.Get == nil {
			return nil, fmt.Errorf("ingest: query %q: want a \"GET /path\" pattern and a Get function", q.Pattern)
		}
		if seen[q.Pattern] {
			return nil, fmt.Errorf("ingest: route %s declared twice", q.Pattern)
		}
		seen[q.Pattern] = true
		s.route(q.Pattern, s.query(q))
	}
	s.route(commandPattern, s.getCommand)
	s.webhookRoutes()
	// Inbound webhooks authenticate by their signature, not an API key.
	for _, r := range prepared {
		if _, ok := s.byType[r.Command.MessageType()]; !ok {
			s.byType[r.Command.MessageType()] = r
		}
	}
	providers, err := s.prepareProviders(cfg.Providers, s.byType)
	if err != nil {
		return nil, err
	}
	s.providers = providers
	s.mux.HandleFunc(inboundPattern, s.inbound)
	doc, err := OpenAPI(routes, queries)
	if err != nil {
		return nil, fmt.Errorf("ingest: %w", err)
	}
	s.mux.HandleFunc("GET /openapi.json", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.Write(doc)
	})
	s.mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeProblem(w, problem(http.StatusNotFound, "not-found", "Not found", "no route "+r.Method+" "+r.URL.Path))
	})
	return s, nil
}

// handlerFunc is a route handler that reports failures as a *Problem.
type handlerFunc func(w http.ResponseWriter, r *http.Request, c caller) *Problem

// route registers h behind metrics, authentication and the tenant's rate
// limit. h checks the key again in the transaction that serves the
// request (see authenticate).
func (s *Server) route(pattern string, h handlerFunc) {
	s.routes = append(s.routes, pattern)
	s.mux.HandleFunc(pattern, func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		rec := &statusRecorder{ResponseWriter: w, status: http.StatusOK}
		defer func() {
			s.metrics.requests.WithLabelValues(pattern, strconv.Itoa(rec.status)).Inc()
			s.metrics.duration.WithLabelValues(pattern).Observe(time.Since(start).Seconds())
		}()
		c, p := s.authenticate(r)
		if p != nil {
			writeProblem(rec, p)
			return
		}
		if ok, retry := s.limiter.allow(c.tenant, time.Now()); !ok {
			writeProblem(rec, errRateLimited(retry))
			return
		}
		if p := h(rec, r, c); p != nil {
			writeProblem(rec, p)
		}
	})
}

// internal maps an unexpected error to 503 when the database is away or
// slow, or 500 (logged) otherwise.
func (s *Server) internal(r *http.Request, err error) *Problem {
	switch {
	case postgres.IsUnavailable(err) || errors.Is(err, context.DeadlineExceeded) || errors.Is(err, errOverloaded) || errors.Is(err, errShuttingDown):
		s.logger.Warn("database unavailable", "route", r.Pattern, "err", err)
		return errUnavailable("the database is unavailable; retry with the same Idempotency-Key")
	case errors.Is(err, context.Canceled) && r.Context().Err() != nil:
		// The client went away; nobody reads this answer.
		return problem(499, "client-closed-request", "Client closed request", "")
	}
	s.logger.Error("request failed", "route", r.Pattern, "err", err)
	return problem(http.StatusInternalServerError, "internal", "Internal error", "retry with the same Idempotency-Key")
}

type statusRecorder struct {
	http.ResponseWriter
	status int
}

func (r *statusRecorder) WriteHeader(code int) {
	r.status = code
	r.ResponseWriter.WriteHeader(code)
}

// Unwrap lets http.ResponseController reach the connection (a wait's
// write deadline).
func (r *statusRecorder) Unwrap() http.ResponseWriter { return r.ResponseWriter }

// traceparentRe is the W3C Trace Context header (version 00 and later):
// anything else is dropped rather than carried into Kafka headers.
var traceparentRe = regexp.MustCompile(`^[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$`)

// accept is the handler of a command route: validate, then accept once per
// (tenant, Idempotency-Key) in a shared transaction (see the package doc).
func (s *Server) accept(route *Route) handlerFunc {
	return func(w http.ResponseWriter, r *http.Request, c caller) *Problem {
		start := time.Now()
		key, body, p := keyedBody(r, s.cfg.MaxBodyBytes)
		if p != nil {
			return p
		}
		cmd, p := route.parse(r, body, s.cfg.MaxStringBytes)
		if p != nil {
			return p
		}
		value, err := route.Encoder.Encode(r.Context(), cmd.payload)
		if err != nil {
			return s.internal(r, fmt.Errorf("encode %s: %w", cmd.payload.MessageType(), err))
		}
		it := &acceptItem{
			ctx: r.Context(), arrived: start, tenant: c.tenant, keyHash: c.keyHash, key: key, route: r.Pattern,
			hash: requestHash(cmd), localID: cmd.localID, commandType: cmd.payload.MessageType(), topic: route.Topic, value: value,
		}
		if tp := r.Header.Get("traceparent"); traceparentRe.MatchString(tp) {
			it.traceparent = tp
		}
		// The outbox insert's span, a child of otelhttp's (when tracing is
		// on): the command goes on in its trace from there.
		ctx, span := s.tracer.Child(r.Context(), "onceflow.ingest.outbox_insert")
		if span.IsRecording() {
			it.ctx, it.traceparent = ctx, tracing.Traceparent(ctx)
		}
		res := s.committer.do(it)
		endAccept(span, res)
		switch {
		case res.err != nil:
			return s.internal(r, res.err)
		case res.outcome == outcomeUnauthorized:
			return s.revoked(r, c)
		case res.outcome == outcomeConflict:
			s.metrics.conflicts.WithLabelValues(r.Pattern).Inc()
			return errKeyReused
		case res.outcome == outcomeReplayed:
			s.metrics.hits.WithLabelValues(r.Pattern).Inc()
			w.Header().Set("Idempotent-Replayed", "true")
		}
		for k, v := range res.resp.Headers {
			w.Header().Set(k, v)
		}
		w.WriteHeader(res.resp.Status)
		w.Write(res.resp.Body)
		return nil
	}
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(v)
}

// commandPattern is the route of every command's outcome.
const commandPattern = "GET /v1/commands/{id}"

// query answers a Query route, in a read-only transaction scoped to the
// caller's tenant (readScoped).
func (s *Server) query(q Query) handlerFunc {
	return func(w http.ResponseWriter, r *http.Request, c caller) *Problem {
		ctx, cancel := context.WithTimeout(r.Context(), s.cfg.RequestTimeout)
		defer cancel()
		var v any
		err := s.readScoped(ctx, c, func(ctx context.Context, db DB) error {
			var err error
			v, err = q.Get(ctx, db, c.tenant, r.WithContext(ctx))
			return err
		})
		switch {
		case errors.Is(err, errRevoked):
			return s.revoked(r, c)
		case errors.Is(err, ErrNotFound):
			return errNotFound
		case err != nil:
			return s.internal(r, err)
		}
		writeJSON(w, http.StatusOK, v)
		return nil
	}
}

// Run serves on Config.Addr until ctx ends (see Serve).
func (s *Server) Run(ctx context.Context) error {
	ln, err := net.Listen("tcp", s.cfg.Addr)
	if err != nil {
		return fmt.Errorf("ingest listen on %s: %w", s.cfg.Addr, err)
	}
	return s.Serve(ctx, ln)
}

// Serve serves on ln until ctx ends, then stops taking requests, lets
// those in flight finish (up to 10s) and their transactions commit, and
// returns.
func (s *Server) Serve(ctx context.Context, ln net.Listener) error {
	if _, err := postgres.EnsureDailyPartitions(ctx, s.pool, "idempotency_keys", 7); err != nil {
		ln.Close()
		return err
	}
	if err := s.learnKeys(ctx); err != nil {
		// Not fatal: each key is then learned at its first request.
		s.logger.Warn("cannot read the API keys at start; each is looked up at its first request", "err", err)
	}
	srv := &http.Server{
		Handler:           s.handler(),
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       30 * time.Second,
		WriteTimeout:      s.cfg.WriteTimeout,
		IdleTimeout:       2 * time.Minute,
		BaseContext:       func(net.Listener) context.Context { return context.WithoutCancel(ctx) },
	}
	// The committers outlive the HTTP server's shutdown: requests in
	// flight wait for their transactions.
	cctx, stopCommitters := context.WithCancel(context.WithoutCancel(ctx))
	var wg sync.WaitGroup
	wg.Go(func() { s.committer.run(cctx) })
	if len(s.providers) > 0 {
		wg.Go(func() { s.expireInbound(cctx) })
	}
	wg.Go(func() { s.wake.run(cctx) })
	if s.cfg.KeyRefresh > 0 {
		wg.Go(func() { s.refreshKeys(cctx) })
	}
	defer func() {
		stopCommitters()
		wg.Wait()
	}()

	s.logger.Info("ingest listening", "addr", ln.Addr().String())
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return fmt.Errorf("ingest server: %w", err)
	case <-ctx.Done():
	}
	shutdownCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	if err := srv.Shutdown(shutdownCtx); err != nil {
		return fmt.Errorf("ingest shutdown: %w", err)
	}
	return nil
}

// handler is the server's routes, under otelhttp's server span when
// tracing is on: a child of the request's traceparent, named by the
// route's pattern once it is known.
func (s *Server) handler() http.Handler {
	if s.cfg.TracerProvider == nil {
		return s.mux
	}
	return otelhttp.NewHandler(s.mux, "ingest",
		otelhttp.WithTracerProvider(s.cfg.TracerProvider), otelhttp.WithPropagators(tracing.Propagator),
		otelhttp.WithSpanNameFormatter(func(op string, r *http.Request) string {
			if r.Pattern != "" {
				return r.Pattern
			}
			return op
		}))
}

// endAccept ends an outbox insert's span with its outcome.
func endAccept(span trace.Span, res acceptResult) {
	if !span.IsRecording() {
		return
	}
	switch {
	case res.err != nil:
		span.SetStatus(codes.Error, res.err.Error())
	case res.outcome == outcomeAccepted:
		span.SetAttributes(attribute.String("onceflow.outcome", "accepted"), attribute.String("onceflow.command_id", res.command.String()))
	case res.outcome == outcomeReplayed:
		span.SetAttributes(attribute.String("onceflow.outcome", "replayed"))
	case res.outcome == outcomeConflict:
		span.SetAttributes(attribute.String("onceflow.outcome", "conflict"))
	case res.outcome == outcomeUnauthorized:
		span.SetAttributes(attribute.String("onceflow.outcome", "unauthorized"))
	}
	span.End()
}
