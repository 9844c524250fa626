// Package tutorial follows docs/your-first-domain.md as a new user would:
// every block that names a file is written into a module of its own
// (example.com/rooms, with a replace of github.com/onceflow/onceflow by
// this repository), its tests run, its binary is built and started with
// `dev` (on free ports and the test's Postgres), and every `sh run` block
// runs in bash, its answer checked against the `output` block after it.
package tutorial

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/onceflow/onceflow/pipeline/pipelinetest"
	"github.com/onceflow/onceflow/test/e2e"
)

// block is one fenced code block of the page.
type block struct {
	lang  string
	attrs map[string]string // file=PATH, run, output
	body  string
	line  int
}

func parse(t *testing.T, path string) []block {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []block
	var cur *block
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		switch {
		case cur == nil && strings.HasPrefix(line, "```"):
			fields := strings.Fields(strings.TrimPrefix(line, "```"))
			cur = &block{attrs: map[string]string{}, line: n}
			for i, f := range fields {
				if i == 0 {
					cur.lang = f
					continue
				}
				k, v, _ := strings.Cut(f, "=")
				cur.attrs[k] = v
			}
		case cur != nil && line == "```":
			out = append(out, *cur)
			cur = nil
		case cur != nil:
			cur.body += line + "\n"
		}
	}
	if cur != nil {
		t.Fatalf("%s:%d: a code block is not closed", path, cur.line)
	}
	return out
}

func repoRoot(t *testing.T) string {
	_, file, _, _ := runtime.Caller(0)
	root, err := filepath.Abs(filepath.Join(filepath.Dir(file), "..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	return root
}

// goCmd runs the go command in dir.
func goCmd(t *testing.T, ctx context.Context, dir string, args ...string) {
	t.Helper()
	cmd := exec.CommandContext(ctx, "go", args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GOFLAGS=-mod=mod", "GOWORK=off")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go %s: %v\n%s", strings.Join(args, " "), err, out)
	}
}

func TestTutorial(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a module and runs its binary; skipped with -short")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	root := repoRoot(t)
	page := filepath.Join(root, "docs", "your-first-domain.md")
	blocks := parse(t, page)

	// Step 1: the module. `go get` of the repository's module is a
	// replace here, and its go.sum the repository's.
	dir := t.TempDir()
	goVersion := regexp.MustCompile(`(?m)^go (\S+)$`).FindSubmatch(mustRead(t, filepath.Join(root, "go.mod")))
	gomod := fmt.Sprintf("module example.com/rooms\n\ngo %s\n\nrequire github.com/onceflow/onceflow v0.0.0\n\nreplace github.com/onceflow/onceflow => %s\n", goVersion[1], root)
	write(t, filepath.Join(dir, "go.mod"), []byte(gomod))
	write(t, filepath.Join(dir, "go.sum"), mustRead(t, filepath.Join(root, "go.sum")))
	files := 0
	for _, b := range blocks {
		if name := b.attrs["file"]; name != "" {
			write(t, filepath.Join(dir, filepath.FromSlash(name)), []byte(b.body))
			files++
		}
	}
	if files < 8 {
		t.Fatalf("the page names %d files; the test found nothing useful to follow", files)
	}
	goCmd(t, ctx, dir, "mod", "tidy")
	// Step 4's test, and the whole module vetted.
	goCmd(t, ctx, dir, "vet", "./...")
	goCmd(t, ctx, dir, "test", "-count=1", "./...")
	// Step 8: the binary, then `dev` on ports and a database of the test's.
	goCmd(t, ctx, dir, "build", "-o", "rooms-bin", ".")
	// Step 9: the stand-in for the confirmation service, and dev told
	// where it is.
	goCmd(t, ctx, dir, "build", "-o", "confirmer-bin", "./confirmer")
	confirmAddr := fmt.Sprintf("127.0.0.1:%d", e2e.FreePort())
	confirmer, err := e2e.Start(filepath.Join(dir, "confirmer-bin"), "confirmer", nil,
		map[string]string{"CONFIRMER_ADDR": confirmAddr}, filepath.Join(dir, "confirmer.log"), "")
	if err != nil {
		t.Fatal(err)
	}
	defer confirmer.Kill()
	httpAddr := fmt.Sprintf("127.0.0.1:%d", e2e.FreePort())
	admin := fmt.Sprintf("127.0.0.1:%d", e2e.FreePort())
	logPath := filepath.Join(dir, "dev.log")
	dev, err := e2e.Start(filepath.Join(dir, "rooms-bin"), "rooms dev",
		[]string{"dev", "--registry-addr", fmt.Sprintf("127.0.0.1:%d", e2e.FreePort())},
		map[string]string{
			"ONCEFLOW_DEV_API_KEY":     "devkey",
			"DATABASE_URL":             pipelinetest.EmptyDatabaseURL(t),
			"ONCEFLOW_DEV_BROKER_ADDR": fmt.Sprintf("127.0.0.1:%d", e2e.FreePort()),
			"HTTP_ADDR":                httpAddr,
			"ADMIN_ADDR":               admin,
			"ONCEFLOW_DATA_DIR":        filepath.Join(dir, ".data"),
			"ROOMS_CONFIRM_URL":        "http://" + confirmAddr,
			// As the page says: the stand-in is on this machine.
			"ONCEFLOW_WEBHOOK_ALLOW_NETWORKS": "127.0.0.1/32,::1/128",
		}, logPath, "http://"+admin)
	if err != nil {
		t.Fatal(err)
	}
	defer dev.Stop(20 * time.Second)
	if err := dev.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	if log := string(mustRead(t, logPath)); !strings.Contains(log, "onceflow dev is running") || !strings.Contains(log, "POST /v1/rooms/{id}/bookings") {
		t.Fatalf("dev's banner lacks the routes:\n%s", log)
	}

	ran := 0
	for i, b := range blocks {
		if b.lang != "sh" || !hasAttr(b, "run") {
			continue
		}
		ran++
		script := strings.NewReplacer("localhost:8080", httpAddr, "localhost:9999", confirmAddr).Replace(b.body)
		var want *block
		if i+1 < len(blocks) && hasAttr(blocks[i+1], "output") {
			want = &blocks[i+1]
		}
		// A command is decided a moment after its 202: a block whose
		// answer is not there yet runs again (every POST carries its
		// Idempotency-Key, so a rerun is a retry).
		deadline := time.Now().Add(15 * time.Second)
		for {
			out, err := exec.CommandContext(ctx, "bash", "-euo", "pipefail", "-c", script).CombinedOutput()
			if err != nil {
				t.Fatalf("docs/your-first-domain.md:%d: %v\n%s\n%s", b.line, err, script, out)
			}
			if want == nil {
				break
			}
			problem := matches(out, *want)
			if problem == "" {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("docs/your-first-domain.md:%d: %s\nthe block:\n%s\nanswered:\n%s\ndev's log:\n%s", b.line, problem, script, out, dev.Tail(40))
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
	if ran < 5 {
		t.Fatalf("ran %d blocks of the page", ran)
	}
	if err := dev.Stop(20 * time.Second); err != nil {
		t.Errorf("dev did not stop cleanly: %v\n%s", err, dev.Tail(20))
	}
}

// matches returns "" when out holds what the output block shows: for a
// json block, a JSON object on a line of out that has every member of the
// block's with the same value (ids and times vary, so the page shows the
// members that do not); for a text block, the block's text.
func matches(out []byte, want block) string {
	out = bytes.ReplaceAll(out, []byte("\r"), nil)
	if want.lang != "json" {
		if !bytes.Contains(out, bytes.TrimSpace([]byte(want.body))) {
			return fmt.Sprintf("the answer does not contain %q", strings.TrimSpace(want.body))
		}
		return ""
	}
	var expected map[string]any
	if err := json.Unmarshal([]byte(want.body), &expected); err != nil {
		return fmt.Sprintf("the page's output block at line %d is not a JSON object: %v", want.line, err)
	}
	for _, line := range bytes.Split(out, []byte("\n")) {
		var got map[string]any
		if json.Unmarshal(line, &got) != nil {
			continue
		}
		ok := true
		for k, v := range expected {
			if !reflect.DeepEqual(got[k], v) {
				ok = false
			}
		}
		if ok {
			return ""
		}
	}
	return fmt.Sprintf("no answer has the members %s", strings.TrimSpace(want.body))
}

func hasAttr(b block, name string) bool {
	_, ok := b.attrs[name]
	return ok
}

func mustRead(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func write(t *testing.T, path string, b []byte) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
}
