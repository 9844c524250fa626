package postgres

import (
	"context"
	"database/sql"
	"fmt"
	"io/fs"
	"log/slog"
	"strings"

	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"
	"github.com/pressly/goose/v3/lock"

	migrations "github.com/onceflow/onceflow/sql"
)

// migrationLockID is the session advisory lock goose holds while migrating,
// so components starting together migrate once and the rest wait.
const migrationLockID = 0x6f6e6365666c6f77 // "onceflow"

// Migrations is one set of goose migrations with its own version table:
// a domain's read models, applied after onceflow's own.
type Migrations struct {
	// Name names the set: its versions are in goose_db_version_{name}.
	// Lowercase letters, digits and '_'.
	Name string
	// FS holds NNNNN_name.sql files at its root.
	FS fs.FS
}

// table is the set's goose version table; the core migrations keep
// goose's default.
func (m Migrations) table() string {
	if m.Name == "" {
		return goose.DefaultTablename
	}
	return goose.DefaultTablename + "_" + strings.ReplaceAll(m.Name, "-", "_")
}

// core is onceflow's own migrations.
var core = Migrations{FS: migrations.Migrations}

// newProvider returns a goose provider over a set of migrations.
func newProvider(db *sql.DB, set Migrations, logger *slog.Logger) (*goose.Provider, error) {
	locker, err := lock.NewPostgresSessionLocker(lock.WithLockID(migrationLockID))
	if err != nil {
		return nil, fmt.Errorf("migration lock: %w", err)
	}
	opts := []goose.ProviderOption{goose.WithSessionLocker(locker), goose.WithDisableGlobalRegistry(true), goose.WithTableName(set.table())}
	if logger != nil {
		opts = append(opts, goose.WithSlog(logger))
	}
	p, err := goose.NewProvider(goose.DialectPostgres, db, set.FS, opts...)
	if err != nil {
		return nil, fmt.Errorf("load migrations %s: %w", set.table(), err)
	}
	return p, nil
}

func openDB(url string) (*sql.DB, error) {
	cfg, err := stdlibConfig(url)
	if err != nil {
		return nil, err
	}
	// A migration that moves rows works across tenants (AllTenants): under
	// the policy, FORCEd for the owner too, it would see none.
	acrossTenants(cfg)
	db := stdlib.OpenDB(*cfg)
	db.SetMaxOpenConns(2)
	return db, nil
}

// Migrate applies every pending migration: onceflow's own, then each of
// domains in order. It is safe to call from many processes at once: goose
// holds a session advisory lock while it works. Its errors never quote
// url's password.
func Migrate(ctx context.Context, url string, logger *slog.Logger, domains ...Migrations) (err error) {
	defer func() { err = redactError(url, err) }()
	db, err := openDB(url)
	if err != nil {
		return err
	}
	defer db.Close()
	applied := 0
	for _, set := range append([]Migrations{core}, domains...) {
		p, err := newProvider(db, set, logger)
		if err != nil {
			return err
		}
		res, err := p.Up(ctx)
		if err != nil {
			return fmt.Errorf("migrate up %s: %w", set.table(), err)
		}
		applied += len(res)
	}
	if applied > 0 {
		// The runtime role's access to what the migrations made, a
		// domain's new tables included (sql/00036_runtime_role.sql). Only
		// after a run that applied something: an up-to-date database needs
		// nothing, and the runtime role, which may call Migrate at start,
		// may not grant.
		if err := grantRuntime(ctx, db); err != nil {
			return fmt.Errorf("grant the runtime role: %w", err)
		}
	}
	return nil
}

// grantRuntime runs onceflow_grant_runtime under the migration lock: two
// processes granting on one table at once can fail with "tuple
// concurrently updated".
func grantRuntime(ctx context.Context, db *sql.DB) error {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	if _, err := tx.ExecContext(ctx, `SELECT pg_advisory_xact_lock($1)`, int64(migrationLockID)); err != nil {
		return err
	}
	if _, err := tx.ExecContext(ctx, `SELECT onceflow_grant_runtime()`); err != nil {
		return err
	}
	return tx.Commit()
}

// MigrateDownTo rolls back every migration above version (0 rolls back all).
func MigrateDownTo(ctx context.Context, url string, version int64, logger *slog.Logger) (err error) {
	defer func() { err = redactError(url, err) }()
	db, err := openDB(url)
	if err != nil {
		return err
	}
	defer db.Close()
	p, err := newProvider(db, core, logger)
	if err != nil {
		return err
	}
	if _, err := p.DownTo(ctx, version); err != nil {
		return fmt.Errorf("migrate down to %d: %w", version, err)
	}
	return nil
}

// SetVersion is where a database stands on one set of migrations.
type SetVersion struct {
	// Name is the set's (a domain's); "" for onceflow's own.
	Name string
	// Current is the version the database is at, Latest the newest this
	// binary carries.
	Current, Latest int64
}

// MigrationVersions returns where the database stands on onceflow's own
// migrations, then on each of domains in order.
func MigrationVersions(ctx context.Context, url string, domains ...Migrations) (_ []SetVersion, err error) {
	defer func() { err = redactError(url, err) }()
	db, err := openDB(url)
	if err != nil {
		return nil, err
	}
	defer db.Close()
	var out []SetVersion
	for _, set := range append([]Migrations{core}, domains...) {
		p, err := newProvider(db, set, nil)
		if err != nil {
			return nil, err
		}
		cur, latest, err := p.GetVersions(ctx)
		if err != nil {
			return nil, fmt.Errorf("versions of %s: %w", set.table(), err)
		}
		out = append(out, SetVersion{Name: set.Name, Current: cur, Latest: latest})
	}
	return out, nil
}
