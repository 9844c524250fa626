package postgres

import (
	"context"
	"database/sql"
	"fmt"
	"log/slog"

	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"
	"github.com/pressly/goose/v3/lock"

	migrations "github.com/onceflow/onceflow/sql"
)

// migrationLockID is the session advisory lock goose holds while migrating,
// so components starting together migrate once and the rest wait.
const migrationLockID = 0x6f6e6365666c6f77 // "onceflow"

// newProvider returns a goose provider over the embedded migrations.
func newProvider(db *sql.DB, logger *slog.Logger) (*goose.Provider, error) {
	locker, err := lock.NewPostgresSessionLocker(lock.WithLockID(migrationLockID))
	if err != nil {
		return nil, fmt.Errorf("migration lock: %w", err)
	}
	opts := []goose.ProviderOption{goose.WithSessionLocker(locker), goose.WithDisableGlobalRegistry(true)}
	if logger != nil {
		opts = append(opts, goose.WithSlog(logger))
	}
	p, err := goose.NewProvider(goose.DialectPostgres, db, migrations.Migrations, opts...)
	if err != nil {
		return nil, fmt.Errorf("load migrations: %w", err)
	}
	return p, nil
}

func openDB(url string) (*sql.DB, error) {
	cfg, err := stdlibConfig(url)
	if err != nil {
		return nil, err
	}
	db := stdlib.OpenDB(*cfg)
	db.SetMaxOpenConns(2)
	return db, nil
}

// Migrate applies every pending migration. It is safe to call from many
// processes at once: goose holds a session advisory lock while it works.
// Its errors never quote url's password.
func Migrate(ctx context.Context, url string, logger *slog.Logger) (err error) {
	defer func() { err = redactError(url, err) }()
	db, err := openDB(url)
	if err != nil {
		return err
	}
	defer db.Close()
	p, err := newProvider(db, logger)
	if err != nil {
		return err
	}
	if _, err := p.Up(ctx); err != nil {
		return fmt.Errorf("migrate up: %w", err)
	}
	return nil
}

// MigrateDownTo rolls back every migration above version (0 rolls back all).
func MigrateDownTo(ctx context.Context, url string, version int64, logger *slog.Logger) (err error) {
	defer func() { err = redactError(url, err) }()
	db, err := openDB(url)
	if err != nil {
		return err
	}
	defer db.Close()
	p, err := newProvider(db, logger)
	if err != nil {
		return err
	}
	if _, err := p.DownTo(ctx, version); err != nil {
		return fmt.Errorf("migrate down to %d: %w", version, err)
	}
	return nil
}

// MigrationVersion returns the version the database is at and the newest
// version this binary carries.
func MigrationVersion(ctx context.Context, url string) (current, latest int64, err error) {
	defer func() { err = redactError(url, err) }()
	db, err := openDB(url)
	if err != nil {
		return 0, 0, err
	}
	defer db.Close()
	p, err := newProvider(db, nil)
	if err != nil {
		return 0, 0, err
	}
	return p.GetVersions(ctx)
}
