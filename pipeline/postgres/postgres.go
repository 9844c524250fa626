package postgres

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"time"

	"github.com/exaring/otelpgx"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/trace"

	"github.com/onceflow/onceflow/pipeline/tracing"
)

// TenantSetting is the transaction setting that scopes a transaction to
// one tenant: onceflow's row-level security policies (and those a
// domain's migrations add with onceflow_tenant_rls) show a transaction in
// which it is set only that tenant's rows (docs/security.md#row-level-security).
// Ingest's reads and a domain job's completion set it for their
// transaction. Unset or empty, a session sees no row and writes none
// (the policy fails closed); AllTenants is how work across tenants says
// so.
const TenantSetting = "onceflow.tenant"

// AllTenants is TenantSetting's value for work across tenants: the
// pipeline's writers (ingest's accepts, the relay, the projector, the
// worker's own jobs), the operator commands, migrations and rebuilds. No
// tenant is "*". Connect sets it for every session of its pool, as a
// startup parameter (pg_stat_activity's backend reads it with
// current_setting); a transaction serving one tenant sets its own for
// itself, which holds until it ends. A connection made another way (psql,
// another program, as the runtime role) sees nothing until it says which
// tenant, or all (docs/security.md#row-level-security).
const AllTenants = "*"

// Connect opens a pool to url and checks that the server answers.
// maxConns of zero keeps pgx's default (the larger of 4 and the CPU count).
// Its errors never quote url's password.
func Connect(ctx context.Context, url string, maxConns int32) (*pgxpool.Pool, error) {
	return ConnectTraced(ctx, url, maxConns, nil, "")
}

// ConnectTraced is Connect with otelpgx's query tracer on tp
// (docs/observability.md): a span for each statement, batch and
// transaction run in a trace (its context carries a span), and none for
// the others (polls, leases). A nil tp traces nothing. The connections
// are named name in pg_stat_activity (application_name) unless url or
// PGAPPNAME names them.
func ConnectTraced(ctx context.Context, url string, maxConns int32, tp trace.TracerProvider, name string) (*pgxpool.Pool, error) {
	pool, err := connect(ctx, url, maxConns, tp, name)
	return pool, redactError(url, err)
}

func connect(ctx context.Context, url string, maxConns int32, tp trace.TracerProvider, name string) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, err
	}
	if maxConns > 0 {
		cfg.MaxConns = maxConns
	}
	if _, set := cfg.ConnConfig.RuntimeParams["application_name"]; !set && name != "" {
		cfg.ConnConfig.RuntimeParams["application_name"] = name
	}
	acrossTenants(cfg.ConnConfig)
	if tp != nil {
		// The pool's acquire spans are left out: a command's statements
		// are what its trace shows.
		cfg.ConnConfig.Tracer = otelpgx.NewTracer(otelpgx.WithTracerProvider(tracing.ChildOnly(tp)),
			otelpgx.WithDisableAcquireTracer())
	}
	cfg.ConnConfig.ConnectTimeout = 5 * time.Second
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("open pool: %w", err)
	}
	pingCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := pool.Ping(pingCtx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("connect to postgres at %s: %w", redact(cfg.ConnConfig), err)
	}
	return pool, nil
}

// acrossTenants makes cfg's sessions work across tenants (AllTenants),
// unless the URL named a scope of its own (?onceflow.tenant=...).
func acrossTenants(cfg *pgx.ConnConfig) {
	if _, set := cfg.RuntimeParams[TenantSetting]; !set {
		cfg.RuntimeParams[TenantSetting] = AllTenants
	}
}

// Reachable reports whether a server answers at url within timeout. Its
// errors never quote url's password.
func Reachable(ctx context.Context, url string, timeout time.Duration) error {
	return redactError(url, reachable(ctx, url, timeout))
}

func reachable(ctx context.Context, url string, timeout time.Duration) error {
	cfg, err := pgx.ParseConfig(url)
	if err != nil {
		return err
	}
	cfg.ConnectTimeout = timeout
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return err
	}
	return conn.Close(ctx)
}

func redact(c *pgx.ConnConfig) string {
	return fmt.Sprintf("%s@%s/%s", c.User, net.JoinHostPort(c.Host, fmt.Sprint(c.Port)), c.Database)
}

// IsUnavailable reports whether err means the database could not be
// reached or went away (connection refused or reset, server shutting down,
// too many connections) as opposed to a problem with the statement itself.
// Callers answer it with 503 and Retry-After, or back off and retry.
func IsUnavailable(err error) bool {
	if err == nil {
		return false
	}
	if errors.Is(err, context.Canceled) {
		return false
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		if len(pgErr.Code) != 5 {
			return false // not a SQLSTATE (FuzzClassify found the panic)
		}
		switch pgErr.Code[:2] {
		case "08", // connection exception
			"53", // insufficient resources (too many connections, out of memory, disk full)
			"57": // operator intervention (admin shutdown, crash shutdown, cannot connect now)
			return pgErr.Code != "57014" // query_canceled is the caller's own deadline
		}
		return false
	}
	var connErr *pgconn.ConnectError
	if errors.As(err, &connErr) {
		return true
	}
	var netErr net.Error
	if errors.As(err, &netErr) {
		return true
	}
	// A connection lost mid-statement surfaces as an I/O error that pgconn
	// knows nothing was sent for, or as a closed connection.
	return pgconn.SafeToRetry(err) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF)
}

// IsInsufficientPrivilege reports whether err is Postgres refusing a
// statement to the role (SQLSTATE 42501): the runtime role trying what
// only the migration role may do.
func IsInsufficientPrivilege(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "42501"
}

// IsMissingPartition reports whether err is an insert into the
// partitioned table that found no partition for its row (no daily
// partition for today yet). It goes by the error's code and table, not
// its text, which the server's lc_messages translates.
func IsMissingPartition(err error, table string) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "23514" && pgErr.ConstraintName == "" &&
		pgErr.TableName == table
}

// IsSerialization reports whether err is a serialization failure or a
// deadlock: the transaction can be retried as a whole.
func IsSerialization(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && (pgErr.Code == "40001" || pgErr.Code == "40P01")
}
