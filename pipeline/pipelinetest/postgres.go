// Package pipelinetest holds test helpers shared by onceflow's packages: a
// fresh migrated Postgres database per test, an in-process Kafka broker per
// test, and polling helpers. Everything here is real (a real PostgreSQL
// server, franz-go's kfake broker speaking the Kafka protocol).
package pipelinetest

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io/fs"
	neturl "net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/onceflow/onceflow/pipeline/postgres"
	migrations "github.com/onceflow/onceflow/sql"
)

var server struct {
	once sync.Once
	url  string // the maintenance database of the server tests use
	err  error
}

// ServerURL returns the URL of the server tests create their databases on:
// DATABASE_URL when it answers, else the repository's local cluster
// (started if needed, shared by every test binary).
func ServerURL(t testing.TB) string {
	t.Helper()
	server.once.Do(func() {
		ctx := context.Background()
		local := postgres.Local{Dir: filepath.Join(repoRoot(), ".data", "postgres"), Logf: func(f string, a ...any) {
			fmt.Fprintf(os.Stderr, f+"\n", a...)
		}}
		server.url, server.err = postgres.Resolve(ctx, os.Getenv("DATABASE_URL"), local)
	})
	if server.err != nil {
		t.Fatalf("postgres for tests: %v", server.err)
	}
	return server.url
}

// EmptyDatabaseURL creates an empty database for the test and drops it when
// the test ends.
func EmptyDatabaseURL(t testing.TB) string {
	t.Helper()
	return createDatabase(t, "")
}

// DatabaseURL creates a database with every migration applied for the test
// (onceflow's own and domains') and drops it when the test ends.
// Databases are cloned from a template migrated once per migration set, so
// this costs one CREATE DATABASE.
func DatabaseURL(t testing.TB, domains ...postgres.Migrations) string {
	t.Helper()
	return createDatabase(t, template(t, domains))
}

// Pool is DatabaseURL opened as a pool that closes when the test ends.
func Pool(t testing.TB, domains ...postgres.Migrations) (*pgxpool.Pool, string) {
	t.Helper()
	url := DatabaseURL(t, domains...)
	pool, err := postgres.Connect(context.Background(), url, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool, url
}

// roles numbers the login roles RuntimeURL makes.
var roles atomic.Int64

// RuntimeURL returns url connecting as a login role of its own that is a
// member of onceflow_runtime and nothing else: the components' role
// under least privilege (sql/00036_runtime_role.sql). The role is dropped
// when the test ends; close its pools before then (t.Cleanup runs last
// registered first).
func RuntimeURL(t testing.TB, url string) string {
	t.Helper()
	ctx := context.Background()
	base := ServerURL(t) // a superuser: roles are the cluster's
	conn := connect(t, base)
	defer conn.Close(ctx)
	name := fmt.Sprintf("test_runtime_%d_%d", os.Getpid(), roles.Add(1))
	if _, err := conn.Exec(ctx, "CREATE ROLE "+pgx.Identifier{name}.Sanitize()+" LOGIN IN ROLE onceflow_runtime"); err != nil {
		t.Fatalf("create the runtime login role: %v", err)
	}
	t.Cleanup(func() {
		c, err := pgx.Connect(ctx, base)
		if err != nil {
			return
		}
		defer c.Close(ctx)
		c.Exec(ctx, "DROP ROLE IF EXISTS "+pgx.Identifier{name}.Sanitize())
	})
	u, err := neturl.Parse(url)
	if err != nil {
		t.Fatal(err)
	}
	u.User = neturl.User(name)
	return u.String()
}

// LeastPrivilege returns the URLs of a new database deployed as
// docs/security.md#database-roles says: owned and migrated (onceflow's
// migrations and domains') by a migration role that is no superuser, and
// served by a runtime login role, a member of onceflow_runtime. Both roles
// and the database are dropped when the test ends.
func LeastPrivilege(t testing.TB, domains ...postgres.Migrations) (ownerURL, runtimeURL string) {
	t.Helper()
	ctx := context.Background()
	base := ServerURL(t)
	conn := connect(t, base)
	defer conn.Close(ctx)
	n := roles.Add(1)
	owner := fmt.Sprintf("test_owner_%d_%d", os.Getpid(), n)
	db := fmt.Sprintf("test_lp_%d_%d_%d", os.Getpid(), n, time.Now().UnixNano())
	// The cluster-wide group role, which the migration makes only where the
	// migration role may make roles.
	// Two test processes may make it at once: the loser sees
	// unique_violation rather than duplicate_object.
	if _, err := conn.Exec(ctx, `DO $$ BEGIN CREATE ROLE onceflow_runtime NOLOGIN; EXCEPTION WHEN duplicate_object OR unique_violation THEN NULL; END $$`); err != nil {
		t.Fatalf("create role onceflow_runtime: %v", err)
	}
	for _, stmt := range []string{
		"CREATE ROLE " + pgx.Identifier{owner}.Sanitize() + " LOGIN",
		"CREATE DATABASE " + pgx.Identifier{db}.Sanitize() + " OWNER " + pgx.Identifier{owner}.Sanitize(),
	} {
		if _, err := conn.Exec(ctx, stmt); err != nil {
			t.Fatalf("%s: %v", stmt, err)
		}
	}
	t.Cleanup(func() {
		c, err := pgx.Connect(ctx, base)
		if err != nil {
			return
		}
		defer c.Close(ctx)
		c.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{db}.Sanitize()+" WITH (FORCE)")
		c.Exec(ctx, "DROP ROLE IF EXISTS "+pgx.Identifier{owner}.Sanitize())
	})
	u, err := neturl.Parse(withDatabase(t, base, db))
	if err != nil {
		t.Fatal(err)
	}
	u.User = neturl.User(owner)
	ownerURL = u.String()
	if err := postgres.Migrate(ctx, ownerURL, nil, domains...); err != nil {
		t.Fatalf("migrate as %s: %v", owner, err)
	}
	return ownerURL, RuntimeURL(t, ownerURL)
}

func createDatabase(t testing.TB, tmpl string) string {
	t.Helper()
	ctx := context.Background()
	base := ServerURL(t)
	conn := connect(t, base)
	defer conn.Close(ctx)
	name := fmt.Sprintf("test_%d_%d", os.Getpid(), time.Now().UnixNano())
	stmt := "CREATE DATABASE " + pgx.Identifier{name}.Sanitize()
	if tmpl != "" {
		stmt += " TEMPLATE " + pgx.Identifier{tmpl}.Sanitize()
	}
	// Two clones of one template at the same instant can fail with "source
	// database is being accessed by other users"; retry briefly.
	var err error
	for i := 0; i < 50; i++ {
		if _, err = conn.Exec(ctx, stmt); err == nil {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err != nil {
		t.Fatalf("create test database: %v", err)
	}
	t.Cleanup(func() {
		c, err := pgx.Connect(ctx, base)
		if err != nil {
			return // the server is gone (a test stopped it); nothing to clean
		}
		defer c.Close(ctx)
		c.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)")
	})
	return withDatabase(t, base, name)
}

var templates sync.Map // name -> *sync.Once-guarded result

const (
	templatePrefix = "onceflow_tmpl_"
	templateDay    = "20060102"
)

// template returns the name of a database migrated to the current migration
// set today, creating it the first time any test binary asks for it. The
// day (UTC) is part of the name: the migrations create daily partitions
// around the day they run, so a template migrated yesterday is a database
// a day old, and a test of the partitions would see yesterday's.
func template(t testing.TB, domains []postgres.Migrations) string {
	t.Helper()
	h := sha256.New()
	for _, set := range append([]postgres.Migrations{{FS: migrations.Migrations}}, domains...) {
		h.Write([]byte(set.Name + "\x00"))
		fs.WalkDir(set.FS, ".", func(path string, d fs.DirEntry, err error) error {
			if err == nil && !d.IsDir() {
				b, _ := fs.ReadFile(set.FS, path)
				h.Write([]byte(path))
				h.Write(b)
			}
			return nil
		})
	}
	name := templatePrefix + time.Now().UTC().Format(templateDay) + "_" + hex.EncodeToString(h.Sum(nil))[:16]
	v, _ := templates.LoadOrStore(name, new(templateOnce))
	o := v.(*templateOnce)
	o.Do(func() { o.err = ensureTemplate(ServerURL(t), name, domains) })
	if o.err != nil {
		t.Fatalf("migrated template database: %v", o.err)
	}
	return name
}

type templateOnce struct {
	sync.Once
	err error
}

func ensureTemplate(base, name string, domains []postgres.Migrations) error {
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, base)
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	// Serialize template creation across test binaries.
	if _, err := conn.Exec(ctx, "SELECT pg_advisory_lock(hashtextextended('onceflow_test_template', 0))"); err != nil {
		return err
	}
	defer conn.Exec(ctx, "SELECT pg_advisory_unlock(hashtextextended('onceflow_test_template', 0))")
	var ready bool
	err = conn.QueryRow(ctx, "SELECT datistemplate FROM pg_database WHERE datname = $1", name).Scan(&ready)
	if err == nil && ready {
		return nil
	}
	if err == nil { // a half-made template from a crashed run
		if _, err := conn.Exec(ctx, "DROP DATABASE "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)"); err != nil {
			return err
		}
	}
	dropOldTemplates(ctx, conn)
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil {
		return err
	}
	url, err := replaceDatabase(base, name)
	if err != nil {
		return err
	}
	if err := postgres.Migrate(ctx, url, nil, domains...); err != nil {
		return err
	}
	_, err = conn.Exec(ctx, "ALTER DATABASE "+pgx.Identifier{name}.Sanitize()+" WITH IS_TEMPLATE true")
	return err
}

// dropOldTemplates drops the templates of days before yesterday, so a
// long-lived server keeps two days' worth; yesterday's may still be cloned
// by a run that started before midnight. It is tidying: an error leaves
// the template for the next time.
func dropOldTemplates(ctx context.Context, conn *pgx.Conn) {
	rows, err := conn.Query(ctx, "SELECT datname FROM pg_database WHERE datname LIKE $1", templatePrefix+"%")
	if err != nil {
		return
	}
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return
	}
	keep := time.Now().UTC().AddDate(0, 0, -1).Format(templateDay)
	for _, name := range names {
		day, _, _ := strings.Cut(strings.TrimPrefix(name, templatePrefix), "_")
		if len(day) != len(templateDay) || day >= keep {
			continue
		}
		db := pgx.Identifier{name}.Sanitize()
		if _, err := conn.Exec(ctx, "ALTER DATABASE "+db+" WITH IS_TEMPLATE false"); err == nil {
			conn.Exec(ctx, "DROP DATABASE "+db+" WITH (FORCE)")
		}
	}
}

func connect(t testing.TB, url string) *pgx.Conn {
	t.Helper()
	c, err := pgx.Connect(context.Background(), url)
	if err != nil {
		t.Fatalf("connect %s: %v", url, err)
	}
	return c
}

func withDatabase(t testing.TB, url, db string) string {
	t.Helper()
	u, err := replaceDatabase(url, db)
	if err != nil {
		t.Fatal(err)
	}
	return u
}

// replaceDatabase returns url naming database db instead. DATABASE_URL must
// be a URL (postgres://...), not a key=value string.
func replaceDatabase(raw, db string) (string, error) {
	u, err := neturl.Parse(raw)
	if err != nil || (u.Scheme != "postgres" && u.Scheme != "postgresql") {
		return "", fmt.Errorf("DATABASE_URL must be a postgres:// URL for tests")
	}
	u.Path = "/" + db
	u.RawPath = ""
	return u.String(), nil
}

// repoRoot walks up from the working directory to the directory holding
// go.mod, so every test binary shares one local cluster.
func repoRoot() string {
	dir, _ := os.Getwd()
	for d := dir; ; d = filepath.Dir(d) {
		if _, err := os.Stat(filepath.Join(d, "go.mod")); err == nil {
			return d
		}
		if d == filepath.Dir(d) {
			return dir
		}
	}
}

// CountingPool is a pool on url that counts the statements whose SQL
// contains one of match: what a test of a read's cost asserts.
func CountingPool(t testing.TB, url string, match ...string) (*pgxpool.Pool, *atomic.Int64) {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	c := &countingTracer{match: match}
	cfg.ConnConfig.Tracer = c
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool, &c.n
}

type countingTracer struct {
	match []string
	n     atomic.Int64
}

func (c *countingTracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, data pgx.TraceQueryStartData) context.Context {
	for _, m := range c.match {
		if strings.Contains(data.SQL, m) {
			c.n.Add(1)
			break
		}
	}
	return ctx
}

func (c *countingTracer) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}
