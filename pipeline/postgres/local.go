package postgres

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
)

// Local is a private PostgreSQL cluster started from the installed server
// binaries, for development, tests and CI. Ensure is idempotent: it reuses a
// cluster that is already running in Dir.
type Local struct {
	// Dir is the cluster's data directory. Default ".data/postgres". When
	// running as root and the postgres user cannot reach Dir (a home
	// directory closed to others), a directory under os.TempDir() named
	// after Dir's absolute path is used instead, and Dir holds a file
	// naming it (see moved).
	Dir string
	// Port is the TCP port on 127.0.0.1. Default: the port remembered
	// beside the data directory (Dir + ".port") or DefaultPort, whichever
	// is free or already this cluster's, else a free port, which is then
	// remembered: a second checkout on the same machine gets a cluster of
	// its own. A port given here is used or refused, never changed.
	Port int
	// BinDir holds initdb and pg_ctl. Default: `pg_config --bindir`, else
	// the newest /usr/lib/postgresql/*/bin.
	BinDir string
	// Database is created if missing and named in the returned URL.
	// Default "onceflow".
	Database string
	// Logf reports what Ensure does; nil is silent.
	Logf func(format string, args ...any)
}

// DefaultPort is the port a private cluster tries first.
const DefaultPort = 54329

func (l *Local) setDefaults() {
	if l.Dir == "" {
		l.Dir = filepath.Join(".data", "postgres")
	}
	if l.Database == "" {
		l.Database = "onceflow"
	}
	if l.Logf == nil {
		l.Logf = func(string, ...any) {}
	}
}

// URL returns the URL of database db on the local cluster (on
// DefaultPort unless Port says another; Ensure returns the one it chose).
func (l Local) URL(db string) string {
	l.setDefaults()
	if l.Port == 0 {
		l.Port = DefaultPort
	}
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/%s?sslmode=disable", l.Port, db)
}

// Ensure starts the cluster unless it is already running, creates the
// database, and returns its URL. Concurrent calls (parallel test binaries)
// serialize on a lock file next to the data directory.
func (l Local) Ensure(ctx context.Context) (string, error) {
	l.setDefaults()
	dir, err := filepath.Abs(l.Dir)
	if err != nil {
		return "", err
	}
	pg, err := lookupPostgresUser()
	if err != nil {
		return "", err
	}
	var m moved
	if pg != nil && !reachableBy(dir, pg) {
		m = movedFrom(dir)
		l.Logf("postgres: the postgres user cannot reach %s; using %s", dir, m.dir)
		dir = m.dir
	}
	if pg != nil {
		l.sweepMoved(ctx, m.dir)
	}
	if err := os.MkdirAll(filepath.Dir(dir), 0o755); err != nil { // #nosec G301 -- run as root, the postgres user must reach its data directory through it
		return "", fmt.Errorf("create %s: %w", filepath.Dir(dir), err)
	}
	unlock, err := lockFile(dir + ".lock")
	if err != nil {
		return "", err
	}
	defer unlock()
	if m.dir != "" {
		if err := l.claim(ctx, m); err != nil {
			return "", err
		}
	}
	if l.Port == 0 {
		if l.Port, err = l.choosePort(ctx, dir); err != nil {
			return "", err
		}
	}

	adminURL := l.URL("postgres")
	if err := Reachable(ctx, adminURL, 2*time.Second); err != nil {
		if err := l.start(ctx, dir, pg); err != nil {
			return "", err
		}
	}
	conn, err := connectRetry(ctx, adminURL, 30*time.Second)
	if err != nil {
		return "", fmt.Errorf("connect to local postgres: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	var dataDir string
	if err := conn.QueryRow(ctx, "SHOW data_directory").Scan(&dataDir); err != nil {
		return "", err
	}
	if filepath.Clean(dataDir) != dir {
		return "", fmt.Errorf("port %d answers for data directory %s, not %s: give another port (onceflow postgres up -port N), or leave the port unset and a free one is chosen", l.Port, dataDir, dir)
	}
	var exists bool
	if err := conn.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)", l.Database).Scan(&exists); err != nil {
		return "", err
	}
	if !exists {
		if _, err := conn.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{l.Database}.Sanitize()); err != nil {
			return "", fmt.Errorf("create database %s: %w", l.Database, err)
		}
	}
	return l.URL(l.Database), nil
}

// Stop stops the cluster if it runs.
func (l Local) Stop(ctx context.Context, mode string) error {
	l.setDefaults()
	dir, err := filepath.Abs(l.Dir)
	if err != nil {
		return err
	}
	pg, err := lookupPostgresUser()
	if err != nil {
		return err
	}
	if pg != nil && !reachableBy(dir, pg) {
		dir = movedFrom(dir).dir
	}
	if mode == "" {
		mode = "fast"
	}
	return l.stopIn(ctx, pg, dir, mode)
}

// stopIn stops the cluster in dir if it runs.
func (l Local) stopIn(ctx context.Context, pg *user.User, dir, mode string) error {
	if _, err := os.Stat(filepath.Join(dir, "postmaster.pid")); err != nil {
		return nil
	}
	bin, err := l.binDir()
	if err != nil {
		return err
	}
	return run(ctx, pg, dir, filepath.Join(bin, "pg_ctl"), "-D", dir, "-m", mode, "-w", "stop")
}

// moved is a cluster kept under os.TempDir() for a data directory the
// postgres user cannot reach. The two point at each other: the data
// directory holds a file naming the cluster (movedNote), and next to the
// cluster a file names the data directory (dir + ".owner"). A cluster
// whose data directory has lost its note (removed with the data: `rm -rf
// .data`, a test's temporary directory) is stale: Ensure removes it, so
// that a data directory made anew gets a database made anew, as it gets
// an empty broker, and the hundreds of megabytes of a cluster do not stay
// behind each time.
type moved struct {
	from string // the data directory asked for
	dir  string // where the cluster is
}

// movedNote is the file in the data directory that names the cluster.
const movedNote = "ONCEFLOW_CLUSTER_MOVED"

func movedFrom(dir string) moved {
	sum := sha256.Sum256([]byte(dir))
	return moved{from: dir, dir: filepath.Join(os.TempDir(), "onceflow-postgres-"+hex.EncodeToString(sum[:6]))}
}

// claim makes m's cluster the data directory's, under m's lock: a cluster
// left by an earlier data directory of the same path is removed first (one
// from before the notes, with no owner file, is adopted as it is).
func (l Local) claim(ctx context.Context, m moved) error {
	owner := m.dir + ".owner"
	_, errOwner := os.Stat(owner)
	if _, err := os.Stat(filepath.Join(m.from, movedNote)); err != nil && errOwner == nil {
		l.Logf("postgres: %s was removed since its cluster in %s was made; making it anew", m.from, m.dir)
		if err := l.remove(ctx, m.dir); err != nil {
			return err
		}
	}
	if err := os.MkdirAll(m.from, 0o700); err != nil {
		return fmt.Errorf("create %s: %w", m.from, err)
	}
	note := fmt.Sprintf("The PostgreSQL cluster of this directory is in %s:\nthe postgres user, which runs it, cannot reach this directory.\nRemoving this file (or this directory) removes that cluster the next time one is started.\n", m.dir)
	if err := os.WriteFile(filepath.Join(m.from, movedNote), []byte(note), 0o600); err != nil {
		return err
	}
	return os.WriteFile(owner, []byte(m.from), 0o600) // #nosec G306 -- root's own bookkeeping
}

// remove stops the cluster in dir if it runs and removes it.
func (l Local) remove(ctx context.Context, dir string) error {
	pg, err := lookupPostgresUser()
	if err != nil {
		return err
	}
	if running(dir) {
		if err := l.stopIn(ctx, pg, dir, "immediate"); err != nil {
			return fmt.Errorf("stop the stale cluster in %s: %w", dir, err)
		}
	}
	if err := os.RemoveAll(dir); err != nil {
		return err
	}
	if err := os.Remove(dir + ".owner"); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return nil
}

// sweepMoved removes every moved cluster but keep whose data directory
// has lost its note: the clusters of removed data directories. One that
// another process holds (its lock is taken) is left for the next sweep.
func (l Local) sweepMoved(ctx context.Context, keep string) {
	owners, _ := filepath.Glob(filepath.Join(os.TempDir(), "onceflow-postgres-*.owner"))
	for _, owner := range owners {
		dir := strings.TrimSuffix(owner, ".owner")
		from, err := os.ReadFile(owner) // #nosec G304 -- our own bookkeeping under os.TempDir()
		if dir == keep || err != nil {
			continue
		}
		if _, err := os.Stat(filepath.Join(string(from), movedNote)); err == nil { // #nosec G703 -- the data directory root itself recorded, only looked at
			continue
		}
		unlock, ok := tryLockFile(dir + ".lock")
		if !ok {
			continue
		}
		l.Logf("postgres: %s was removed; removing its cluster in %s", from, dir)
		if err := l.remove(ctx, dir); err != nil {
			l.Logf("postgres: %v", err)
		}
		os.Remove(dir + ".lock")
		unlock()
	}
}

// running reports whether the server whose data directory is dir runs.
func running(dir string) bool {
	b, err := os.ReadFile(filepath.Join(dir, "postmaster.pid")) // #nosec G304 -- the cluster's own pid file
	if err != nil {
		return false
	}
	pid, err := strconv.Atoi(strings.TrimSpace(strings.SplitN(string(b), "\n", 2)[0]))
	return err == nil && pid > 0 && syscall.Kill(pid, 0) == nil
}

func (l Local) start(ctx context.Context, dir string, pg *user.User) error {
	bin, err := l.binDir()
	if err != nil {
		return err
	}
	if _, err := os.Stat(filepath.Join(dir, "PG_VERSION")); err != nil {
		l.Logf("postgres: initdb %s", dir)
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return fmt.Errorf("create %s: %w", dir, err)
		}
		if err := chown(dir, pg); err != nil {
			return err
		}
		if err := run(ctx, pg, dir, filepath.Join(bin, "initdb"),
			"-D", dir, "-U", "postgres", "--auth=trust", "-E", "UTF8", "--locale=C", "--no-instructions"); err != nil {
			return fmt.Errorf("initdb: %w", err)
		}
	}
	// Settings for a development cluster that many parallel test binaries
	// share; durability stays on (fsync, synchronous_commit) because the
	// benchmarks measure real commits. pg_stat_statements is loaded, with
	// planning counted, for make bench-e2e's bill of each statement's time
	// per command (docs/benchmarks.md#the-bill-cpu-per-command).
	opts := strings.Join([]string{
		"-c listen_addresses=127.0.0.1",
		"-p " + strconv.Itoa(l.Port),
		"-c unix_socket_directories=" + dir,
		"-c max_connections=400",
		"-c shared_buffers=256MB",
		"-c max_locks_per_transaction=256",
		"-c shared_preload_libraries=pg_stat_statements",
		"-c pg_stat_statements.track_planning=on",
	}, " ")
	l.Logf("postgres: starting on 127.0.0.1:%d (data %s)", l.Port, dir)
	if err := run(ctx, pg, dir, filepath.Join(bin, "pg_ctl"),
		"-D", dir, "-l", filepath.Join(dir, "server.log"), "-o", opts, "-w", "-t", "60", "start"); err != nil {
		log, _ := os.ReadFile(filepath.Join(dir, "server.log")) // #nosec G304 -- the cluster's own log, in the directory we run it in
		return fmt.Errorf("pg_ctl start: %w\n%s", err, tail(string(log), 2000))
	}
	return nil
}

func (l Local) binDir() (string, error) {
	if l.BinDir != "" {
		return l.BinDir, nil
	}
	if out, err := exec.Command("pg_config", "--bindir").Output(); err == nil {
		dir := strings.TrimSpace(string(out))
		if _, err := os.Stat(filepath.Join(dir, "initdb")); err == nil {
			return dir, nil
		}
	}
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	sort.Slice(dirs, func(i, j int) bool { return versionOf(dirs[i]) > versionOf(dirs[j]) })
	for _, d := range dirs {
		if _, err := os.Stat(filepath.Join(d, "initdb")); err == nil {
			return d, nil
		}
	}
	if p, err := exec.LookPath("initdb"); err == nil {
		return filepath.Dir(p), nil
	}
	return "", errors.New("no PostgreSQL server binaries found (initdb): install postgresql or set DATABASE_URL")
}

func versionOf(binDir string) int {
	v, _ := strconv.Atoi(filepath.Base(filepath.Dir(binDir)))
	return v
}

// lookupPostgresUser returns the user to run the server as when we are
// root (initdb refuses to run as root), or nil to run as ourselves.
func lookupPostgresUser() (*user.User, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	u, err := user.Lookup("postgres")
	if err != nil {
		return nil, fmt.Errorf("running as root needs a postgres user to run the server as: %w", err)
	}
	return u, nil
}

// reachableBy reports whether u can traverse every ancestor of dir.
func reachableBy(dir string, u *user.User) bool {
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	for p := filepath.Dir(dir); ; p = filepath.Dir(p) {
		fi, err := os.Stat(p)
		if err != nil {
			// Not created yet: MkdirAll makes it 0755, and what matters
			// is the ancestors that exist.
			if p == "/" {
				return true
			}
			continue
		}
		st := fi.Sys().(*syscall.Stat_t)
		mode := fi.Mode().Perm()
		ok := mode&0o001 != 0 ||
			int(st.Uid) == uid && mode&0o100 != 0 ||
			int(st.Gid) == gid && mode&0o010 != 0
		if !ok {
			return false
		}
		if p == "/" {
			return true
		}
	}
}

func chown(dir string, u *user.User) error {
	if u == nil {
		return nil
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	if err := os.Chown(dir, uid, gid); err != nil {
		return fmt.Errorf("chown %s to postgres: %w", dir, err)
	}
	return nil
}

// run runs a server binary, as u when u is not nil, in its own session so
// the server it may start outlives us and our terminal's signals.
func run(ctx context.Context, u *user.User, dir, name string, args ...string) error {
	cmd := exec.CommandContext(ctx, name, args...) // #nosec G204 -- the PostgreSQL binaries found next to initdb, with arguments of our own
	cmd.Dir = dir
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	cmd.Env = append(os.Environ(), "LC_ALL=C.UTF-8")
	if u != nil {
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		cmd.SysProcAttr.Credential = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
		cmd.Env = append(cmd.Env, "HOME="+u.HomeDir, "USER=postgres", "LOGNAME=postgres")
	}
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s %s: %w\n%s", filepath.Base(name), strings.Join(args, " "), err, tail(string(out), 2000))
	}
	return nil
}

// tryLockFile takes the lock at path if no one holds it.
func tryLockFile(path string) (func(), bool) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o600) // #nosec G304 -- the lock next to a cluster's own data directory
	if err != nil {
		return nil, false
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		return nil, false
	}
	return func() {
		syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
		f.Close()
	}, true
}

func lockFile(path string) (func(), error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o600) // #nosec G304 -- the lock next to the cluster's own data directory
	if err != nil {
		return nil, fmt.Errorf("open lock %s: %w", path, err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		f.Close()
		return nil, fmt.Errorf("lock %s: %w", path, err)
	}
	return func() {
		syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
		f.Close()
	}, nil
}

func connectRetry(ctx context.Context, url string, within time.Duration) (*pgx.Conn, error) {
	deadline := time.Now().Add(within)
	for {
		c, err := pgx.Connect(ctx, url)
		if err == nil {
			return c, nil
		}
		if time.Now().After(deadline) {
			return nil, err
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func tail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}

func stdlibConfig(url string) (*pgx.ConnConfig, error) {
	cfg, err := pgx.ParseConfig(url)
	if err != nil {
		return nil, redactError(url, err)
	}
	return cfg, nil
}

// Resolve returns databaseURL when a server answers there, and otherwise
// ensures the local cluster and returns its URL. It is what `onceflow dev`,
// `make test`, `make demo` and CI use; components in production take
// DATABASE_URL as given.
func Resolve(ctx context.Context, databaseURL string, local Local) (string, error) {
	local.setDefaults()
	if databaseURL != "" {
		err := Reachable(ctx, databaseURL, 3*time.Second)
		if err == nil {
			return databaseURL, nil
		}
		local.Logf("postgres: DATABASE_URL does not answer (%v); starting the local cluster instead", err)
	}
	return local.Ensure(ctx)
}

// choosePort returns the port of the cluster in dir: the one remembered
// beside the data directory, else DefaultPort, if it is free or this
// cluster answers on it; else a free port, remembered for the next start.
func (l Local) choosePort(ctx context.Context, dir string) (int, error) {
	file, err := filepath.Abs(l.Dir + ".port")
	if err != nil {
		return 0, err
	}
	remembered := 0
	if b, err := os.ReadFile(file); err == nil { // #nosec G304 -- our own bookkeeping beside the data directory
		remembered, _ = strconv.Atoi(strings.TrimSpace(string(b)))
	}
	for _, port := range []int{remembered, DefaultPort} {
		if port > 0 && l.portFor(ctx, port, dir) {
			if port != remembered {
				return port, os.WriteFile(file, []byte(strconv.Itoa(port)+"\n"), 0o600)
			}
			return port, nil
		}
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("find a free port: %w", err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	l.Logf("postgres: port %d is another cluster's or taken; using %d, remembered in %s", max(remembered, DefaultPort), port, file)
	return port, os.WriteFile(file, []byte(strconv.Itoa(port)+"\n"), 0o600)
}

// portFor reports whether the cluster in dir can use port: nothing
// listens on it, or the cluster itself does.
func (l Local) portFor(ctx context.Context, port int, dir string) bool {
	answered, ours := clusterOn(ctx, port, dir)
	if answered {
		return ours
	}
	ln, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port))
	if err != nil {
		return false
	}
	ln.Close()
	return true
}

// clusterOn reports whether a PostgreSQL server answers on port, and
// whether it is the cluster whose data directory is dir.
func clusterOn(ctx context.Context, port int, dir string) (answered, ours bool) {
	url := fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable&connect_timeout=2", port)
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return false, false
	}
	defer conn.Close(context.WithoutCancel(ctx))
	var dataDir string
	return true, conn.QueryRow(ctx, "SHOW data_directory").Scan(&dataDir) == nil && filepath.Clean(dataDir) == dir
}

// Running returns the URL of Database on the cluster of Dir if that
// cluster runs, and "" if it does not; it starts nothing. Operator
// commands find `onceflow dev`'s database with it.
func (l Local) Running(ctx context.Context) (string, error) {
	l.setDefaults()
	dir, err := filepath.Abs(l.Dir)
	if err != nil {
		return "", err
	}
	ports := []int{l.Port}
	if l.Port == 0 {
		ports = []int{DefaultPort}
		if b, err := os.ReadFile(dir + ".port"); err == nil { // #nosec G304 -- our own bookkeeping beside the data directory
			if p, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil {
				ports = []int{p, DefaultPort}
			}
		}
	}
	if pg, err := lookupPostgresUser(); err == nil && pg != nil && !reachableBy(dir, pg) {
		dir = movedFrom(dir).dir
	}
	if _, err := os.Stat(filepath.Join(dir, "PG_VERSION")); err != nil {
		return "", nil // never made
	}
	for _, port := range ports {
		if _, ours := clusterOn(ctx, port, dir); ours {
			l.Port = port
			return l.URL(l.Database), nil
		}
	}
	return "", nil
}
