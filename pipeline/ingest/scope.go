package ingest

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/onceflow/onceflow/pipeline/postgres"
)

// DB is what a Query reads through: the request's read-only transaction,
// scoped to the caller's tenant. *pgxpool.Pool, *pgxpool.Conn and pgx.Tx
// all satisfy it, so a query's code can be called in a test with any of
// them.
type DB interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults
}

// TenantSetting is the transaction setting a read runs under: the
// caller's tenant (postgres.TenantSetting). A query that forgets its
// tenant predicate still reads nothing of another tenant's.
const TenantSetting = postgres.TenantSetting

// scopeSQL checks the request's API key again and sets the transaction's
// tenant to the key's, in one statement at the start of the read: the
// tenant of the active key with hash $1, or noTenant when there is none
// (revoked since it was cached), under which a table with row-level
// security shows no row at all.
const scopeSQL = `SELECT set_config('` + TenantSetting + `',
	coalesce((SELECT tenant FROM api_keys WHERE key_hash = $1 AND revoked_at IS NULL), '` + noTenant + `'), true)`

// noTenant is the scope of a key that is not active: no tenant has a '/'.
const noTenant = "/"

// errRevoked is a read whose key the scoped transaction found revoked.
var errRevoked = errors.New("the API key is not active")

// readScoped runs read in a read-only transaction scoped to c's tenant
// (scopeSQL), or returns errRevoked without running it. The transaction
// starts in one round trip with the scope and ends with a rollback: it
// wrote nothing.
func (s *Server) readScoped(ctx context.Context, c caller, read func(ctx context.Context, db DB) error) error {
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		return fmt.Errorf("acquire a connection: %w", err)
	}
	defer conn.Release()
	defer endRead(conn.Conn())
	b := &pgx.Batch{}
	b.Queue("BEGIN READ ONLY")
	var tenant string
	b.Queue(scopeSQL, c.keyHash).QueryRow(func(row pgx.Row) error { return row.Scan(&tenant) })
	if err := conn.SendBatch(ctx, b).Close(); err != nil {
		return fmt.Errorf("scope the read: %w", err)
	}
	if tenant != c.tenant {
		return errRevoked
	}
	return read(ctx, conn)
}

// endRead ends a read's transaction. A connection whose transaction
// cannot be ended is closed, so the pool never hands it to anyone else
// with the read's tenant still set.
func endRead(conn *pgx.Conn) {
	if conn.IsClosed() || conn.PgConn().TxStatus() == 'I' {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := conn.Exec(ctx, "ROLLBACK"); err != nil || conn.PgConn().TxStatus() != 'I' {
		conn.Close(ctx)
	}
}
