// Package stack starts the compose stack for real (make test-stack,
// docs/deploy.md#the-local-stack): compose/docker-compose.yml with the
// local images of compose/docker-compose.local.yml, on podman, brought up
// by scripts/stack.sh, driven through nginx, watched through Prometheus,
// with a component and Kafka killed under traffic, and taken down again.
package stack

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/onceflow/onceflow/examples/ledger/accounts"
	"github.com/onceflow/onceflow/examples/ledger/ledgerapp"
	"github.com/onceflow/onceflow/pipeline/apiclient"
)

const project = "onceflow-stack"

// root is the repository, where scripts/stack.sh runs.
var root = func() string {
	r, err := filepath.Abs("../..")
	if err != nil {
		panic(err)
	}
	return r
}()

// stack runs scripts/stack.sh with args and fails the test if it fails.
func stack(t *testing.T, args ...string) {
	t.Helper()
	cmd := exec.Command(filepath.Join(root, "scripts", "stack.sh"), args...)
	cmd.Env = append(os.Environ(), "STACK_HTTP_PORT="+httpPort, "STACK_PROMETHEUS_PORT="+promPort)
	out, err := cmd.CombinedOutput()
	t.Logf("scripts/stack.sh %s:\n%s", strings.Join(args, " "), out)
	if err != nil {
		t.Fatalf("scripts/stack.sh %s: %v (podman-compose's log: .data/stack/compose.log)", strings.Join(args, " "), err)
	}
}

// podman runs podman with the project's containers.conf.
func podman(args ...string) (string, error) {
	cmd := exec.Command("podman", args...)
	cmd.Env = append(os.Environ(), "CONTAINERS_CONF="+filepath.Join(root, "compose", "local", "containers.conf"))
	out, err := cmd.CombinedOutput()
	return strings.TrimSpace(string(out)), err
}

// The stack's host ports (loopback only): none of onceflow dev's
// defaults, the private Postgres' 54329 or make kafka-up's 19092 and up.
const (
	httpPort = "38080"
	promPort = "39090"
)

func TestStack(t *testing.T) {
	if os.Getenv("ONCEFLOW_STACK") == "" {
		t.Skip("make test-stack runs it (ONCEFLOW_STACK=1): it builds images and starts containers with podman")
	}
	if _, err := exec.LookPath("podman-compose"); err != nil {
		t.Skip("podman-compose is not installed (Debian's podman and podman-compose; .ci/run installs them)")
	}
	// Down first (a stack an interrupted run left) and down at the end,
	// failed or not.
	stack(t, "down")
	t.Cleanup(func() { stack(t, "down"); leftovers(t) })
	start := time.Now()
	stack(t, "up")
	t.Logf("stack up: %s", time.Since(start).Round(time.Second))

	key, err := os.ReadFile(filepath.Join(root, ".data", "stack", "api-key"))
	if err != nil {
		t.Fatal(err)
	}
	api := &apiclient.Client{BaseURL: "http://127.0.0.1:" + httpPort, APIKey: strings.TrimSpace(string(key))}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()

	t.Run("demo", func(t *testing.T) {
		var out strings.Builder
		err := ledgerapp.RunDemo(ctx, api, &out)
		t.Log(out.String())
		if err != nil {
			t.Fatal(err)
		}
	})
	t.Run("prometheus", func(t *testing.T) { scraped(ctx, t) })
	t.Run("faults", func(t *testing.T) { faults(ctx, t, api) })
}

// leftovers fails the test if anything of the stack outlived stack-down.
func leftovers(t *testing.T) {
	for _, what := range [][]string{
		{"ps", "-aq", "--filter", "label=io.podman.compose.project=" + project},
		{"volume", "ls", "-q", "--filter", "label=io.podman.compose.project=" + project},
		{"network", "ls", "-q", "--filter", "name=" + project},
	} {
		if out, err := podman(what...); err != nil || out != "" {
			t.Errorf("podman %s after stack-down: %q %v", strings.Join(what, " "), out, err)
		}
	}
}

// components are the services Prometheus scrapes (its dns_sd_configs)
// and their replicas.
var components = map[string]int{"ingest": 2, "relay": 2, "processor": 2, "projector": 2, "worker": 2, "lag": 1}

// scraped checks that Prometheus scrapes every replica of every component
// (up is 1 for each) and evaluates the alert rules (each rule's health
// ok, and as many rules as compose/prometheus/alerts.yml has).
func scraped(ctx context.Context, t *testing.T) {
	prom := "http://127.0.0.1:" + promPort
	// Its DNS discovery refreshes every 30s: the replicas appear within a minute.
	var last string
	deadline := time.Now().Add(3 * time.Minute)
	for ; time.Now().Before(deadline); time.Sleep(3 * time.Second) {
		var res struct {
			Data struct {
				Result []struct {
					Metric map[string]string `json:"metric"`
					Value  [2]any            `json:"value"`
				} `json:"result"`
			} `json:"data"`
		}
		if err := getJSON(ctx, prom+"/api/v1/query?query="+url.QueryEscape(`up{job="onceflow"}`), &res); err != nil {
			last = err.Error()
			continue
		}
		up := map[string]int{}
		for _, r := range res.Data.Result {
			if r.Value[1] == "1" {
				up[r.Metric["component"]]++
			}
		}
		last = fmt.Sprint(up)
		if equal(up, components) {
			t.Logf("Prometheus: up == 1 for %v", up)
			break
		}
	}
	if !strings.HasPrefix(last, "map[") || time.Now().After(deadline) {
		t.Fatalf("Prometheus's targets up: %s, want %v", last, components)
	}

	rules, err := os.ReadFile(filepath.Join(root, "compose", "prometheus", "alerts.yml"))
	if err != nil {
		t.Fatal(err)
	}
	want := strings.Count(string(rules), "- alert:")
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(2 * time.Second) {
		var res struct {
			Data struct {
				Groups []struct {
					Rules []struct {
						Name   string `json:"name"`
						Health string `json:"health"`
						Error  string `json:"lastError"`
					} `json:"rules"`
				} `json:"groups"`
			} `json:"data"`
		}
		if err := getJSON(ctx, prom+"/api/v1/rules?type=alert", &res); err != nil {
			t.Fatal(err)
		}
		var ok int
		var bad []string
		for _, g := range res.Data.Groups {
			for _, r := range g.Rules {
				if r.Health == "ok" {
					ok++
				} else {
					bad = append(bad, fmt.Sprintf("%s: %s %s", r.Name, r.Health, r.Error))
				}
			}
		}
		if ok == want {
			t.Logf("Prometheus: %d alert rules loaded and evaluated", ok)
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("Prometheus: %d of %d alert rules evaluated ok; the others: %v", ok, want, bad)
		}
	}
}

func equal(a, b map[string]int) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

func getJSON(ctx context.Context, u string, v any) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s", u, resp.Status)
	}
	return json.NewDecoder(resp.Body).Decode(v)
}

// deposit is one intention of the traffic: its key, account and amount.
type deposit struct {
	key, account string
	amount       int64
}

// faults sends deposits to a few accounts from several clients, each
// retried with its Idempotency-Key until it has a definite answer (as a
// client of the API does), while a processor container and then the Kafka
// container are killed and started again. Once every deposit is accepted
// and the components are back, each account shows exactly the sum of its
// deposits and one event per command (its version: the open and one per
// deposit), and every key, sent again, names the command it named first.
func faults(ctx context.Context, t *testing.T, api *apiclient.Client) {
	c := ledgerapp.Client{Client: api}
	run := apiclient.NewKey()[:6]
	const nAccounts, perAccount, clients = 8, 40, 4
	ids := make([]string, nAccounts)
	for i := range ids {
		ids[i] = fmt.Sprintf("stack-%s-%d", run, i)
		if _, err := api.Send(ctx, apiclient.Intention{Path: "/v1/accounts", Key: "open-" + ids[i],
			Body: map[string]string{"account_id": ids[i], "currency": "EUR"}, Wait: true}, apiclient.Retry{}); err != nil {
			t.Fatalf("open %s: %v", ids[i], err)
		}
	}
	var work []deposit
	for n := range perAccount {
		for i, id := range ids {
			work = append(work, deposit{key: fmt.Sprintf("dep-%s-%d-%d", run, i, n), account: id, amount: int64(1 + n + 100*i)})
		}
	}
	queue := make(chan deposit)
	var commands sync.Map // key → the command id its 202 named
	var errs []error
	var mu sync.Mutex
	var wg sync.WaitGroup
	start := time.Now()
	for range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for d := range queue {
				sent, err := api.Send(ctx, apiclient.Intention{Path: "/v1/accounts/" + d.account + "/deposits", Key: d.key,
					Body: map[string]int64{"amount": d.amount}}, apiclient.Retry{Deadline: 5 * time.Minute})
				if err != nil {
					mu.Lock()
					errs = append(errs, fmt.Errorf("deposit %s: %w", d.key, err))
					mu.Unlock()
					continue
				}
				commands.Store(d.key, sent.Accepted.CommandID)
			}
		}()
	}
	// The faults, at a third and at two thirds of the traffic.
	for i, d := range work {
		switch i {
		case len(work) / 3:
			kill(t, project+"_processor_1")
		case 2 * len(work) / 3:
			kill(t, project+"_kafka_1")
		}
		queue <- d
	}
	close(queue)
	wg.Wait()
	t.Logf("%d deposits on %d accounts from %d clients accepted in %s, a processor and Kafka killed and started again meanwhile",
		len(work), nAccounts, clients, time.Since(start).Round(time.Second))
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}

	// Every command's outcome, then the read model.
	wctx, wcancel := context.WithTimeout(ctx, 5*time.Minute)
	defer wcancel()
	for _, d := range work {
		id, _ := commands.Load(d.key)
		cmd, err := api.WaitCommand(wctx, id.(string))
		if err != nil || cmd.Status != "accepted" {
			t.Fatalf("deposit %s (command %v): %+v %v", d.key, id, cmd, err)
		}
	}
	want := map[string]int64{}
	for _, d := range work {
		want[d.account] += d.amount
	}
	for _, id := range ids {
		// The accounts' read model is the projector's: it may trail the
		// command's status by a moment.
		var a accounts.Account
		for deadline := time.Now().Add(2 * time.Minute); ; time.Sleep(time.Second) {
			var err error
			if a, err = c.Account(ctx, id); err != nil {
				t.Fatal(err)
			}
			if a.Version >= perAccount+1 || time.Now().After(deadline) {
				break
			}
		}
		if a.Balance != want[id] || a.Version != perAccount+1 {
			t.Errorf("account %s: balance %d, version %d; want %d and %d (the open and %d deposits, each once)",
				id, a.Balance, a.Version, want[id], perAccount+1, perAccount)
		}
	}
	// Each key still names its one command.
	for _, d := range work {
		sent, err := api.Send(ctx, apiclient.Intention{Path: "/v1/accounts/" + d.account + "/deposits", Key: d.key,
			Body: map[string]int64{"amount": d.amount}}, apiclient.Retry{})
		id, _ := commands.Load(d.key)
		if err != nil || !sent.Response.Replayed() || sent.Accepted.CommandID != id {
			t.Fatalf("deposit %s sent again: command %s (replayed %v), want %v: %v", d.key, sent.Accepted.CommandID, sent.Response != nil && sent.Response.Replayed(), id, err)
		}
	}
	t.Logf("0 lost, 0 doubled: %d accounts, each at the sum of its %d deposits and version %d; each of the %d keys sent again names its one command",
		nAccounts, perAccount, perAccount+1, len(work))
}

// kill kills a container (SIGKILL, no shutdown) and starts it again.
func kill(t *testing.T, name string) {
	t.Helper()
	if out, err := podman("kill", "--signal", "KILL", name); err != nil {
		t.Fatalf("podman kill %s: %v %s", name, err, out)
	}
	t.Logf("killed %s", name)
	time.Sleep(3 * time.Second)
	if out, err := podman("start", name); err != nil {
		t.Fatalf("podman start %s: %v %s", name, err, out)
	}
	t.Logf("started %s again", name)
}
