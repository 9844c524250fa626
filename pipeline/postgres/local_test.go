package postgres_test

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/onceflow/onceflow/pipeline/pipelinetest"
	"github.com/onceflow/onceflow/pipeline/postgres"
)

// A private cluster whose data directory the postgres user cannot reach
// (as root, under a home or a test's directory closed to others) lives
// under the temporary directory, and follows its data directory: removed
// with it (`rm -rf .data`), the next start makes a new database instead
// of reusing the old one beside an empty broker, and the old cluster is
// removed, stopped first if it still runs, rather than left behind.
func TestMovedClusterFollowsItsDataDirectory(t *testing.T) {
	if testing.Short() {
		t.Skip("runs initdb and starts PostgreSQL three times; skipped with -short")
	}
	if os.Geteuid() != 0 {
		t.Skip("a cluster moves under the temporary directory only when run as root (the server then runs as postgres)")
	}
	if _, err := user.Lookup("postgres"); err != nil {
		t.Skip("no postgres user to run the server as")
	}
	if _, err := exec.LookPath("pg_config"); err != nil {
		if dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin/initdb"); len(dirs) == 0 {
			t.Skip("no PostgreSQL server binaries")
		}
	}
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	// t.TempDir() is 0700: the postgres user cannot reach inside it.
	data := filepath.Join(t.TempDir(), ".data")
	l := postgres.Local{Dir: filepath.Join(data, "postgres"), Port: pipelinetest.FreePort(t), Database: "app"}
	url := ensure(t, ctx, l)
	where := movedTo(t, l.Dir)
	t.Cleanup(func() { stopAndRemove(l, where) })
	exec1(t, ctx, url, "CREATE TABLE kept (id int); INSERT INTO kept VALUES (1)")

	// Started again with its data directory in place: the same database.
	if err := l.Stop(ctx, "fast"); err != nil {
		t.Fatal(err)
	}
	url = ensure(t, ctx, l)
	exec1(t, ctx, url, "SELECT id FROM kept")

	// The data directory removed while its cluster runs: the next start
	// stops it and makes a new one, without the old tables.
	if err := os.RemoveAll(data); err != nil {
		t.Fatal(err)
	}
	url = ensure(t, ctx, l)
	if got := movedTo(t, l.Dir); got != where {
		t.Fatalf("the cluster moved to %s, then to %s", where, got)
	}
	if err := execErr(ctx, url, "SELECT id FROM kept"); err == nil || !strings.Contains(err.Error(), "does not exist") {
		t.Fatalf("a removed data directory's table, read in its new cluster: got %v, want it not to exist", err)
	}

	// Another data directory, removed with its cluster stopped (a test's
	// temporary directory): any cluster's next start removes its cluster.
	other := postgres.Local{Dir: filepath.Join(t.TempDir(), "pg"), Port: pipelinetest.FreePort(t)}
	ensure(t, ctx, other)
	otherAt := movedTo(t, other.Dir)
	t.Cleanup(func() { stopAndRemove(other, otherAt) })
	if err := other.Stop(ctx, "fast"); err != nil {
		t.Fatal(err)
	}
	if err := os.RemoveAll(filepath.Dir(other.Dir)); err != nil {
		t.Fatal(err)
	}
	if err := l.Stop(ctx, "fast"); err != nil {
		t.Fatal(err)
	}
	ensure(t, ctx, l)
	for _, p := range []string{otherAt, otherAt + ".owner", otherAt + ".lock"} {
		if _, err := os.Stat(p); err == nil {
			t.Errorf("%s is still there after its data directory was removed and another cluster started", p)
		}
	}
	if _, err := os.Stat(where); err != nil {
		t.Errorf("the cluster in use was swept: %v", err)
	}
}

// A second checkout on the same machine: the default port is another
// cluster's (or anything's), so the cluster of a data directory with no
// port given takes a free one, remembers it beside the data directory,
// and gets it again at its next start.
func TestSecondClusterTakesAFreePortAndKeepsIt(t *testing.T) {
	if testing.Short() {
		t.Skip("runs initdb and starts PostgreSQL twice; skipped with -short")
	}
	if os.Geteuid() != 0 {
		t.Skip("as root the server runs as the postgres user, which this test's cleanup assumes")
	}
	if dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin/initdb"); len(dirs) == 0 {
		t.Skip("no PostgreSQL server binaries")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	// The default port is taken: by the repository's own cluster when it
	// runs, else by this listener.
	if ln, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", postgres.DefaultPort)); err == nil {
		defer ln.Close()
	}
	l := postgres.Local{Dir: filepath.Join(t.TempDir(), ".data", "postgres")}
	url := ensure(t, ctx, l)
	t.Cleanup(func() { stopAndRemove(l, movedTo(t, l.Dir)) })
	exec1(t, ctx, url, "CREATE TABLE kept (id int); INSERT INTO kept VALUES (1)")
	if strings.Contains(url, fmt.Sprintf(":%d/", postgres.DefaultPort)) {
		t.Fatalf("the second cluster's URL %s is on the default port, which is taken", url)
	}
	remembered, err := os.ReadFile(l.Dir + ".port")
	if err != nil || !strings.Contains(url, ":"+strings.TrimSpace(string(remembered))+"/") {
		t.Errorf("the port remembered beside the data directory: %q (%v), want the one of %s", remembered, err, url)
	}
	if err := l.Stop(ctx, "fast"); err != nil {
		t.Fatal(err)
	}
	if again := ensure(t, ctx, l); again != url {
		t.Errorf("started again: %s, want %s", again, url)
	}
	exec1(t, ctx, url, "SELECT id FROM kept")
}

func ensure(t *testing.T, ctx context.Context, l postgres.Local) string {
	t.Helper()
	l.Logf = t.Logf
	url, err := l.Ensure(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return url
}

// movedTo returns where the cluster of data directory dir is, from the
// note left in dir, and checks a cluster is there.
func movedTo(t *testing.T, dir string) string {
	t.Helper()
	note, err := os.ReadFile(filepath.Join(dir, "ONCEFLOW_CLUSTER_MOVED"))
	if err != nil {
		t.Fatalf("no note of where the cluster went: %v", err)
	}
	first, _, _ := strings.Cut(string(note), "\n")
	where := strings.TrimSuffix(first[strings.LastIndex(first, " ")+1:], ":")
	if !strings.HasPrefix(where, os.TempDir()) {
		t.Fatalf("the note names %q, not a directory under %s:\n%s", where, os.TempDir(), note)
	}
	if _, err := os.Stat(filepath.Join(where, "PG_VERSION")); err != nil {
		t.Fatalf("no cluster where the note says: %v", err)
	}
	return where
}

func stopAndRemove(l postgres.Local, where string) {
	l.Stop(context.Background(), "immediate")
	for _, p := range []string{where, where + ".owner", where + ".lock"} {
		os.RemoveAll(p)
	}
}

func exec1(t *testing.T, ctx context.Context, url, sql string) {
	t.Helper()
	if err := execErr(ctx, url, sql); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

func execErr(ctx context.Context, url, sql string) error {
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	_, err = conn.Exec(ctx, sql)
	return err
}
