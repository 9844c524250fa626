package ingest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/onceflow/onceflow/pipeline"
	"github.com/onceflow/onceflow/pipeline/postgres"
)

// Encoder encodes a command payload into the bytes of a Kafka record value
// (the Avro serde of the commands topic).
type Encoder interface {
	Encode(ctx context.Context, v any) ([]byte, error)
}

// Server is the ingest HTTP server.
type Server struct {
	cfg     Config
	pool    *pgxpool.Pool
	enc     Encoder
	logger  *slog.Logger
	metrics *metrics
	mux     *http.ServeMux
}

// New returns a server. reg receives its metrics.
func New(cfg Config, pool *pgxpool.Pool, enc Encoder, logger *slog.Logger, reg prometheus.Registerer) (*Server, error) {
	cfg.setDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	s := &Server{cfg: cfg, pool: pool, enc: enc, logger: logger.With("component", "ingest"), metrics: newMetrics(reg), mux: http.NewServeMux()}
	s.route("POST /v1/accounts", s.accept(parseOpenAccount))
	s.route("POST /v1/accounts/{id}/deposits", s.accept(parseDeposit))
	s.route("GET /v1/accounts/{id}", s.getAccount)
	s.route("GET /v1/commands/{id}", s.getCommand)
	s.mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeProblem(w, problem(http.StatusNotFound, "not-found", "Not found", "no route "+r.Method+" "+r.URL.Path))
	})
	return s, nil
}

// Handler returns the server's routes.
func (s *Server) Handler() http.Handler { return s.mux }

// handlerFunc is a route handler that reports failures as a *Problem.
type handlerFunc func(w http.ResponseWriter, r *http.Request, tenant string) *Problem

// route registers h behind authentication, metrics and error handling.
func (s *Server) route(pattern string, h handlerFunc) {
	s.mux.HandleFunc(pattern, func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		rec := &statusRecorder{ResponseWriter: w, status: http.StatusOK}
		defer func() {
			s.metrics.requests.WithLabelValues(pattern, strconv.Itoa(rec.status)).Inc()
			s.metrics.duration.WithLabelValues(pattern).Observe(time.Since(start).Seconds())
		}()
		tenant, err := s.authenticate(r.Context(), r.Header.Get("Authorization"))
		if err != nil {
			writeProblem(rec, s.internal(r, err))
			return
		}
		if tenant == "" {
			writeProblem(rec, errUnauthorized)
			return
		}
		if p := h(rec, r, tenant); p != nil {
			writeProblem(rec, p)
		}
	})
}

// internal maps an unexpected error to 503 when the database is away, or
// 500 (logged) otherwise.
func (s *Server) internal(r *http.Request, err error) *Problem {
	if postgres.IsUnavailable(err) || errors.Is(err, context.DeadlineExceeded) {
		s.logger.Warn("database unavailable", "route", r.Pattern, "err", err)
		return errUnavailable("the database is unavailable; retry with the same Idempotency-Key")
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

// accepted is the body of a 202.
type accepted struct {
	CommandID string `json:"command_id"`
	Status    string `json:"status"`
}

// storedResponse is what idempotency_keys keeps of the response.
type storedResponse struct {
	Status  int
	Headers map[string]string
	Body    []byte
}

func (s *Server) accept(parse func(*http.Request, int64) (command, *Problem)) handlerFunc {
	return func(w http.ResponseWriter, r *http.Request, tenant string) *Problem {
		key := r.Header.Get("Idempotency-Key")
		if key == "" {
			return problem(http.StatusBadRequest, "idempotency-key-missing", "Idempotency-Key missing",
				"every POST needs an Idempotency-Key header; use a new random value per operation and resend it on retries")
		}
		if len(key) > MaxIdempotencyKeyLen {
			return problem(http.StatusBadRequest, "idempotency-key-invalid", "Idempotency-Key too long",
				fmt.Sprintf("the key must be at most %d characters", MaxIdempotencyKeyLen))
		}
		cmd, p := parse(r, s.cfg.MaxBodyBytes)
		if p != nil {
			return p
		}
		resp, replayed, p := s.acceptOnce(r, tenant, key, cmd)
		if p != nil {
			return p
		}
		if replayed {
			s.metrics.hits.WithLabelValues(r.Pattern).Inc()
			w.Header().Set("Idempotent-Replayed", "true")
		} else if s.cfg.OnAccept != nil {
			s.cfg.OnAccept()
		}
		for k, v := range resp.Headers {
			w.Header().Set(k, v)
		}
		w.WriteHeader(resp.Status)
		w.Write(resp.Body)
		return nil
	}
}

const (
	lockKeySQL   = `SELECT pg_advisory_xact_lock(hashtextextended($1 || '/' || $2, 0))`
	lookupKeySQL = `SELECT request_hash, response_status, response_headers, response_body
		FROM idempotency_keys
		WHERE tenant = $1 AND key = $2 AND created_at > now() - make_interval(secs => $3)
		ORDER BY created_at DESC LIMIT 1`
	insertOutboxSQL = `INSERT INTO outbox (shard, topic, key, value, headers) VALUES ($1, $2, $3, $4, $5)`
	insertStatusSQL = `INSERT INTO command_status (command_id, tenant, aggregate_id, command_type, status)
		VALUES ($1, $2, $3, $4, 'pending')`
	insertKeySQL = `INSERT INTO idempotency_keys
		(tenant, key, route, request_hash, command_id, response_status, response_headers, response_body)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8)`
)

// acceptOnce runs the idempotent accept transaction (see the package doc).
func (s *Server) acceptOnce(r *http.Request, tenant, key string, cmd command) (storedResponse, bool, *Problem) {
	ctx := r.Context()
	hash := requestHash(cmd)
	var resp storedResponse
	var replayed bool
	var conflict bool
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, lockKeySQL, tenant, key); err != nil {
			return err
		}
		var storedHash []byte
		err := tx.QueryRow(ctx, lookupKeySQL, tenant, key, s.cfg.IdempotencyRetention.Seconds()).
			Scan(&storedHash, &resp.Status, &resp.Headers, &resp.Body)
		if err == nil {
			if string(storedHash) != string(hash) {
				conflict = true
			}
			replayed = true
			return nil
		}
		if !errors.Is(err, pgx.ErrNoRows) {
			return err
		}

		id := pipeline.NewCommandID()
		aggregateID := pipeline.AggregateID(tenant, cmd.localID)
		value, err := s.enc.Encode(ctx, cmd.payload)
		if err != nil {
			return fmt.Errorf("encode %s: %w", cmd.payload.MessageType(), err)
		}
		headers := map[string]string{
			pipeline.HeaderCommandID:   id.String(),
			pipeline.HeaderTenant:      tenant,
			pipeline.HeaderCommandType: cmd.payload.MessageType(),
		}
		if tp := r.Header.Get("traceparent"); tp != "" && len(tp) <= 128 {
			headers[pipeline.HeaderTraceparent] = tp
		}
		shard := pipeline.OutboxShard(aggregateID, s.cfg.Shards)
		if _, err := tx.Exec(ctx, insertOutboxSQL, shard, s.cfg.CommandsTopic, []byte(aggregateID), value, headers); err != nil {
			return fmt.Errorf("insert outbox row: %w", err)
		}
		if _, err := tx.Exec(ctx, insertStatusSQL, id.String(), tenant, aggregateID, cmd.payload.MessageType()); err != nil {
			return fmt.Errorf("insert command status: %w", err)
		}
		body, _ := json.Marshal(accepted{CommandID: id.String(), Status: "pending"})
		resp = storedResponse{
			Status: http.StatusAccepted,
			Headers: map[string]string{
				"Content-Type": "application/json",
				"Location":     "/v1/commands/" + id.String(),
			},
			Body: append(body, '\n'),
		}
		if _, err := tx.Exec(ctx, insertKeySQL, tenant, key, r.Pattern, hash, id.String(), resp.Status, resp.Headers, resp.Body); err != nil {
			return fmt.Errorf("insert idempotency key: %w", err)
		}
		return nil
	})
	if err != nil {
		return storedResponse{}, false, s.internal(r, err)
	}
	if conflict {
		s.metrics.conflicts.WithLabelValues(r.Pattern).Inc()
		return storedResponse{}, false, problem(http.StatusConflict, "idempotency-key-reused", "Idempotency-Key reused",
			"this Idempotency-Key was already used with a different request; use a new key for a new operation")
	}
	if !replayed {
		s.metrics.accepted.Inc()
	}
	return resp, replayed, nil
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(v)
}

// account is the body of GET /v1/accounts/{id}.
type account struct {
	AccountID string `json:"account_id"`
	Balance   int64  `json:"balance"`
	Currency  string `json:"currency"`
	Status    string `json:"status"`
	Version   int64  `json:"version"`
}

const getAccountSQL = `SELECT balance, currency, status, version FROM accounts WHERE tenant = $1 AND account_id = $2`

func (s *Server) getAccount(w http.ResponseWriter, r *http.Request, tenant string) *Problem {
	a := account{AccountID: r.PathValue("id")}
	err := s.pool.QueryRow(r.Context(), getAccountSQL, tenant, a.AccountID).Scan(&a.Balance, &a.Currency, &a.Status, &a.Version)
	if errors.Is(err, pgx.ErrNoRows) {
		return errNotFound
	}
	if err != nil {
		return s.internal(r, err)
	}
	writeJSON(w, http.StatusOK, a)
	return nil
}

// commandStatus is the body of GET /v1/commands/{id}.
type commandStatus struct {
	CommandID   string   `json:"command_id"`
	Status      string   `json:"status"`
	CommandType string   `json:"command_type"`
	AggregateID string   `json:"aggregate_id"`
	Reason      *string  `json:"reason,omitempty"`
	Detail      *string  `json:"detail,omitempty"`
	EventIDs    []string `json:"event_ids"`
}

const getCommandSQL = `SELECT status, command_type, aggregate_id, reason, detail, event_ids::text[]
	FROM command_status WHERE command_id = $1 AND tenant = $2`

func (s *Server) getCommand(w http.ResponseWriter, r *http.Request, tenant string) *Problem {
	id, err := pipeline.ParseID(r.PathValue("id"))
	if err != nil {
		return errNotFound
	}
	c := commandStatus{CommandID: id.String()}
	err = s.pool.QueryRow(r.Context(), getCommandSQL, id.String(), tenant).
		Scan(&c.Status, &c.CommandType, &c.AggregateID, &c.Reason, &c.Detail, &c.EventIDs)
	if errors.Is(err, pgx.ErrNoRows) {
		return errNotFound
	}
	if err != nil {
		return s.internal(r, err)
	}
	if c.EventIDs == nil {
		c.EventIDs = []string{}
	}
	writeJSON(w, http.StatusOK, c)
	return nil
}

// Run serves until ctx ends, then stops taking requests and lets those in
// flight finish (up to 10s).
func (s *Server) Run(ctx context.Context) error {
	ln, err := net.Listen("tcp", s.cfg.Addr)
	if err != nil {
		return fmt.Errorf("ingest listen on %s: %w", s.cfg.Addr, err)
	}
	return s.Serve(ctx, ln)
}

// Serve is Run on an existing listener.
func (s *Server) Serve(ctx context.Context, ln net.Listener) error {
	if _, err := postgres.EnsureDailyPartitions(ctx, s.pool, "idempotency_keys", 7); err != nil {
		return err
	}
	srv := &http.Server{
		Handler:           s.mux,
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       30 * time.Second,
		IdleTimeout:       2 * time.Minute,
		BaseContext:       func(net.Listener) context.Context { return context.WithoutCancel(ctx) },
	}
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
