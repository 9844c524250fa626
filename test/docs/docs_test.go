// Package docs checks the commands README.md and docs/*.md show: it runs
// every one that can run on the embedded default (`onceflow dev` of the
// ledger), in the order a reader would, and lists those it skips with the
// reason, and follows every PAGE.md#anchor to a heading of that page.
// `make lint` runs it.
package docs

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/onceflow/onceflow/examples/ledger/accounts"
	"github.com/onceflow/onceflow/pipeline/pipelinetest"
	"github.com/onceflow/onceflow/pipeline/postgres"
	"github.com/onceflow/onceflow/test/e2e"
)

// skips are the commands the check does not run, each with its reason;
// the first that matches a command decides.
var skips = []struct {
	match  *regexp.Regexp
	reason string
}{
	{regexp.MustCompile(`^make `), "a make target: CI runs make lint, make test and make fuzz, and make demo runs the same dev as this check"},
	{regexp.MustCompile(`^docker `), "needs a Docker engine; compose/compose_test.go checks the compose file and its configuration"},
	{regexp.MustCompile(`^curl .*127\.0\.0\.1:38080`), "asks the local stack, which make stack-up starts; make test-stack (test/stack) drives it through nginx"},
	{regexp.MustCompile(`^(helm|kubectl) `), "needs a Kubernetes cluster; deploy/helm's tests (make test-helm) render the chart with Helm's library and check what it would run"},
	{regexp.MustCompile(`^compose/secrets\.sh`), "writes the compose stack's secrets into the tree; compose/compose_test.go runs the script"},
	{regexp.MustCompile(`onceflow dev|rooms-bin dev`), "starts the embedded default, which this check runs itself"},
	{regexp.MustCompile(`kafka-1|kafka:9092|@db/|schema-registry:8081`), "names the hosts of a production deployment"},
	{regexp.MustCompile(`^(HTTP_ADDR|ADMIN_ADDR)=.*bin/(ingest|relay|processor|projector|worker|natsink)`), "starts a component on fixed ports next to dev; test/e2e runs the component binaries"},
	{regexp.MustCompile(`(^|\s)go (test|build|mod|get) `), "a test or a benchmark: make test and make bench run them"},
	{regexp.MustCompile(`^nats-server `), "starts a NATS server on a fixed port next to dev; pipeline/natsink, test/e2e and cli's dev test start their own"},
	{regexp.MustCompile(`^kafka-consumer-groups\.sh`), "Apache Kafka's tools, not on this machine; it resets a group of the reader's"},
	{regexp.MustCompile(`\$ID|\$KEY`), "$ID and $KEY stand for a command id and a key of the reader's"},
	{regexp.MustCompile(`revoke 42`), "42 stands for a key id of the reader's"},
	{regexp.MustCompile(`redrive 3:17`), "3:17 and 3:18 stand for DLQ records of the reader's"},
	{regexp.MustCompile(`trace payments/evt_123`), "a provider event of the reader's (docs/inbound.md)"},
	{regexp.MustCompile(`trace 0193d1c2-…`), "0193d1c2-… stands for a command id"},
	{regexp.MustCompile(`< commands\.jsonl`), "reads a file of the reader's"},
	{regexp.MustCompile(`https://example\.com`), "a subscription to example.com: dev's worker would deliver there, and this check reaches only loopback"},
	{regexp.MustCompile(`/status/skip-batch|commands skip-batch `), "skips a batch a processor of the reader's is blocked at; TestDecompressionBombBlocksItsPartitionUntilSkipped, cli's TestCommandsSkipBatch and the e2e TestDecompressionBomb block one and skip it"},
	{regexp.MustCompile(`events tail -(from 10m|key)`), "follows the events topic until interrupted; cli's TestEventsTail follows it"},
	{regexp.MustCompile(`projections reset `), "resets partitions of the reader's parked for their stored offset; pipeline/projector's TestOffsetsOfAnotherBrokerPark and TestTopicRecreatedUnderRunningProjector park them and reset them"},
	{regexp.MustCompile(`projections skip `), "skips the record a partition of the reader's is parked on; TestUnknownErrorParksAfterTriesAndCanBeSkipped and the e2e TestProjectorParksAnEventOfNoKnownErrorAndSkipsIt park one and skip it"},
}

// pages whose commands are checked elsewhere, with the reason.
var skipPages = map[string]string{
	"docs/your-first-domain.md": "the tutorial's commands, for a binary of its own: test/tutorial follows the page and checks their answers",
}

// A command is one line of a shell block, or several joined by a trailing
// \, | or &&.
type command struct {
	where string // README.md:94
	text  string
}

// blocks are the shell blocks of the page at path, each a list of
// commands: in a block with "$ " prompts, only the prompted lines; else
// every line but comments.
func blocks(t *testing.T, path, name string) [][]command {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var out [][]command
	fence := regexp.MustCompile("(?s)```(?:sh|bash|shell|console)[^\n]*\n(.*?)```")
	for _, m := range fence.FindAllSubmatchIndex(b, -1) {
		start := strings.Count(string(b[:m[2]]), "\n") + 1
		lines := strings.Split(string(b[m[2]:m[3]]), "\n")
		prompted := false
		for _, l := range lines {
			prompted = prompted || strings.HasPrefix(l, "$ ")
		}
		var cmds []command
		cur, at := "", 0
		for i, l := range lines {
			if prompted {
				if !strings.HasPrefix(l, "$ ") {
					continue
				}
				l = strings.TrimPrefix(l, "$ ")
			}
			if cur == "" {
				at = start + i
			}
			cur += strings.TrimSpace(l)
			if strings.HasSuffix(cur, `\`) {
				cur = strings.TrimSuffix(cur, `\`) + " "
				continue
			}
			if strings.HasSuffix(cur, "|") || strings.HasSuffix(cur, "&&") {
				cur += " "
				continue
			}
			if cur != "" && !strings.HasPrefix(cur, "#") {
				cmds = append(cmds, command{fmt.Sprintf("%s:%d", name, at), cur})
			}
			cur = ""
		}
		out = append(out, cmds)
	}
	return out
}

// TestDocsCommands runs the commands of README.md and docs/*.md that can
// run on the embedded default: against `onceflow dev` on ports of its own
// (the pages' localhost:8080, 9090, 8081 and 127.0.0.1:9092 are its
// ingest, admin, registry and broker), with the binaries the pages call
// bin/... built from this tree, its environment (KAFKA_BROKERS,
// DATABASE_URL, SCHEMA_REGISTRY_URL, ONCEFLOW_DEV_API_KEY=devkey), and
// curl failing on an HTTP error. A block's commands share one shell. A
// command that fails fails the test; the ones skipped are listed, each
// with its reason.
func TestDocsCommands(t *testing.T) {
	if testing.Short() {
		t.Skip("starts onceflow dev; skipped with -short")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	work, bin := t.TempDir(), t.TempDir()
	if err := e2e.Build(ctx, bin); err != nil {
		t.Fatal(err)
	}
	// The pages call bin/onceflow; curl fails on an HTTP error.
	if err := os.Symlink(bin, filepath.Join(work, "bin")); err != nil {
		t.Fatal(err)
	}
	realCurl, err := exec.LookPath("curl")
	if err != nil {
		t.Skip("no curl")
	}
	if err := os.WriteFile(filepath.Join(bin, "curl"), []byte("#!/bin/sh\nexec "+realCurl+" --fail-with-body \"$@\"\n"), 0o755); err != nil { // #nosec G306 -- a script the test runs
		t.Fatal(err)
	}

	dev := startDev(t, bin, work)
	env := append(os.Environ(), "PATH="+bin+string(os.PathListSeparator)+os.Getenv("PATH"),
		"KAFKA_BROKERS="+dev.kafka, "DATABASE_URL="+dev.database, "SCHEMA_REGISTRY_URL="+dev.registry, "ONCEFLOW_DEV_API_KEY=devkey")
	addrs := strings.NewReplacer("localhost:8080", dev.http, "127.0.0.1:8080", dev.http, "localhost:9090", dev.admin,
		"localhost:8081", strings.TrimPrefix(dev.registry, "http://"), "127.0.0.1:9092", dev.kafka)

	pages, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	var ran, skipped int
	for _, page := range append([]string{filepath.Join(root, "README.md")}, pages...) {
		name, _ := filepath.Rel(root, page)
		if reason, ok := skipPages[name]; ok {
			t.Logf("skip %s: every command\n      because %s", name, reason)
			continue
		}
		for _, block := range blocks(t, page, name) {
			var script strings.Builder
			var run []command
		next:
			for _, c := range block {
				for _, s := range skips {
					if s.match.MatchString(c.text) {
						t.Logf("skip %s: %s\n      because %s", c.where, c.text, s.reason)
						skipped++
						continue next
					}
				}
				run = append(run, c)
				fmt.Fprintf(&script, "echo '>>> %s'\n%s\nrc=$?; [ $rc -eq 0 ] || { echo \"<<< exit $rc\"; exit 1; }\n", c.where, addrs.Replace(c.text))
			}
			if len(run) == 0 {
				continue
			}
			cmd := exec.CommandContext(ctx, "bash", "-c", script.String())
			cmd.Dir, cmd.Env = work, env
			out, err := cmd.CombinedOutput()
			if err != nil {
				t.Errorf("a command of %s failed (%v):\n%s", run[0].where, err, out)
				continue
			}
			for _, c := range run {
				t.Logf("ran  %s: %s", c.where, c.text)
			}
			ran += len(run)
		}
	}
	t.Logf("ran %d commands, skipped %d", ran, skipped)
	if ran < 20 {
		t.Errorf("ran %d commands: the check found little to run", ran)
	}
}

// devStack is a running `onceflow dev` and its addresses.
type devStack struct {
	kafka, registry, http, admin, database string
}

// startDev runs `onceflow dev` of the ledger in work until the test ends,
// on a database of its own, and reads its addresses from its banner.
func startDev(t *testing.T, bin, work string) devStack {
	t.Helper()
	url := pipelinetest.DatabaseURL(t, postgres.Migrations{Name: "ledger", FS: accounts.Migrations})
	log := filepath.Join(work, "dev.log")
	ports := map[string]int{"broker": e2e.FreePort(), "registry": e2e.FreePort(), "http": e2e.FreePort(), "admin": e2e.FreePort()}
	addr := func(name string) string { return fmt.Sprintf("127.0.0.1:%d", ports[name]) }
	p, err := e2e.Start(filepath.Join(bin, "onceflow"), "dev",
		[]string{"dev", "-data-dir", filepath.Join(work, "data"), "-broker-addr", addr("broker"), "-registry-addr", addr("registry"),
			"-http-addr", addr("http"), "-admin-addr", addr("admin")},
		map[string]string{"DATABASE_URL": url, "ONCEFLOW_DEV_API_KEY": "devkey", "ONCEFLOW_PARTITIONS": "2"}, log, "http://"+addr("admin"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := p.Stop(30 * time.Second); err != nil {
			t.Errorf("dev: %v", err)
		}
	})
	pipelinetest.Eventually(t, 2*time.Minute, func() error {
		if p.Exited() {
			b, _ := os.ReadFile(log)
			t.Fatalf("dev stopped:\n%s", b)
		}
		b, _ := os.ReadFile(log)
		if !strings.Contains(string(b), "onceflow dev is running") {
			return fmt.Errorf("no banner yet")
		}
		return nil
	})
	return devStack{kafka: addr("broker"), registry: "http://" + addr("registry"), http: addr("http"), admin: addr("admin"), database: url}
}
