package compose

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/pbkdf2"
	"crypto/sha256"
	"encoding/base64"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/onceflow/onceflow/pipeline/pipelinetest"
	"github.com/onceflow/onceflow/pipeline/postgres"
)

// postgres/init.sh, which the Postgres image runs once when it makes the
// data directory, run as the image runs it against a cluster of the
// test's own: it makes the roles and the database with each password from
// its secret (the stored SCRAM verifier is the password's), and no
// password is on a command line (ps shows those to every user of the
// host; psql reads each from its file).
func TestPostgresInitReadsPasswordsFromFiles(t *testing.T) {
	if testing.Short() {
		t.Skip("runs initdb and starts PostgreSQL; skipped with -short")
	}
	if dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin/initdb"); len(dirs) == 0 {
		t.Skip("no PostgreSQL server binaries")
	}
	psql, err := exec.LookPath("psql")
	if err != nil {
		t.Skip("no psql")
	}
	ctx := context.Background()
	local := postgres.Local{Dir: filepath.Join(t.TempDir(), "pg"), Port: pipelinetest.FreePort(t), Database: "postgres"}
	url, err := local.Ensure(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { local.Stop(context.Background(), "immediate") })

	dir := t.TempDir()
	bin, secrets, calls := filepath.Join(dir, "bin"), filepath.Join(dir, "secrets"), filepath.Join(dir, "calls")
	for _, d := range []string{bin, secrets} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	wrapper := "#!/bin/sh\nfor a; do printf '%s\\t' \"$a\"; done >> \"" + calls + "\"\necho >> \"" + calls + "\"\nexec " + psql + " \"$@\"\n"
	if err := os.WriteFile(filepath.Join(bin, "psql"), []byte(wrapper), 0o755); err != nil { // #nosec G306 -- an executable script
		t.Fatal(err)
	}
	passwords := map[string]string{"onceflow_owner": "owner-" + strings.Repeat("3a", 12), "onceflow_app": "app-" + strings.Repeat("c5", 12)}
	for file, role := range map[string]string{"pg_owner": "onceflow_owner", "pg_app": "onceflow_app"} {
		if err := os.WriteFile(filepath.Join(secrets, file), []byte(passwords[role]+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	cmd := exec.Command("/bin/sh", filepath.Join("postgres", "init.sh")) // #nosec G204 -- the compose stack's script
	port := strconv.Itoa(local.Port)
	cmd.Env = []string{"PATH=" + bin + ":" + os.Getenv("PATH"), "POSTGRES_USER=postgres", "PGHOST=127.0.0.1", "PGPORT=" + port, "SECRETS_DIR=" + secrets}
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("postgres/init.sh: %v\n%s", err, out)
	}
	ran, err := os.ReadFile(calls)
	if err != nil {
		t.Fatal(err)
	}
	for role, pw := range passwords {
		if bytes.Contains(ran, []byte(pw)) {
			t.Errorf("postgres/init.sh put %s's password on psql's command line:\n%s", role, ran)
		}
	}

	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	for role, pw := range passwords {
		var verifier string
		if err := conn.QueryRow(ctx, `SELECT rolpassword FROM pg_authid WHERE rolname = $1`, role).Scan(&verifier); err != nil {
			t.Fatalf("role %s: %v", role, err)
		}
		if !scramVerifies(t, verifier, pw) {
			t.Errorf("role %s: its password is not its secret's (verifier %.20s…)", role, verifier)
		}
	}
	var owner string
	if err := conn.QueryRow(ctx, `SELECT pg_get_userbyid(datdba) FROM pg_database WHERE datname = 'onceflow'`).Scan(&owner); err != nil || owner != "onceflow_owner" {
		t.Errorf("database onceflow owned by %q (%v), want onceflow_owner", owner, err)
	}
}

// scramVerifies reports whether a SCRAM-SHA-256 verifier
// (SCRAM-SHA-256$ITER:SALT$STOREDKEY:SERVERKEY) is password's.
func scramVerifies(t *testing.T, verifier, password string) bool {
	t.Helper()
	parts := strings.Split(strings.TrimPrefix(verifier, "SCRAM-SHA-256$"), "$")
	if len(parts) != 2 {
		t.Fatalf("not a SCRAM-SHA-256 verifier: %.20s…", verifier)
	}
	iterSalt, keys := strings.Split(parts[0], ":"), strings.Split(parts[1], ":")
	iterations, err := strconv.Atoi(iterSalt[0])
	if err != nil || len(iterSalt) != 2 || len(keys) != 2 {
		t.Fatalf("not a SCRAM-SHA-256 verifier: %.20s…", verifier)
	}
	salt, err1 := base64.StdEncoding.DecodeString(iterSalt[1])
	stored, err2 := base64.StdEncoding.DecodeString(keys[0])
	if err1 != nil || err2 != nil {
		t.Fatalf("verifier: %v %v", err1, err2)
	}
	salted, err := pbkdf2.Key(sha256.New, password, salt, iterations, sha256.Size)
	if err != nil {
		t.Fatal(err)
	}
	mac := hmac.New(sha256.New, salted)
	mac.Write([]byte("Client Key"))
	want := sha256.Sum256(mac.Sum(nil))
	return bytes.Equal(stored, want[:])
}
