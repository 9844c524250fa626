package cli_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kadm"

	"github.com/onceflow/onceflow/examples/ledger"
	"github.com/onceflow/onceflow/pipeline"
	"github.com/onceflow/onceflow/pipeline/kafka"
	"github.com/onceflow/onceflow/pipeline/pipelinetest"
	"github.com/onceflow/onceflow/pipeline/processor"
)

// cliEnv is a broker with onceflow's topics and the environment the CLI
// reads.
type cliEnv struct {
	t      *testing.T
	topics kafka.Topics
	kcfg   kafka.Config
	env    map[string]string
}

func newCLIEnv(t *testing.T) *cliEnv {
	t.Helper()
	b := pipelinetest.Broker(t)
	topics := pipelinetest.Topics(t, b.Addrs(), 3)
	return &cliEnv{t: t, topics: topics, kcfg: kafka.Config{Brokers: b.Addrs()}, env: map[string]string{
		"KAFKA_BROKERS":         b.Addrs()[0],
		"ONCEFLOW_TOPIC_PREFIX": topics.Prefix,
		"ONCEFLOW_PARTITIONS":   "3",
	}}
}

func (e *cliEnv) run(args ...string) (string, error) {
	var out bytes.Buffer
	err := run(context.Background(), args, func(k string) string { return e.env[k] }, &out)
	return out.String(), err
}

// processor runs a ledger processor with decider d until the test ends
// or stop is called.
func (e *cliEnv) processor(d pipeline.Decider[ledger.Account]) (p *processor.Processor[ledger.Account], reg *prometheus.Registry, stop func()) {
	e.t.Helper()
	ctx := context.Background()
	s := ledgerSerdes(e.t, e.topics)
	reg = prometheus.NewRegistry()
	p, err := processor.New(processor.Config{Topics: e.topics, InstanceID: fmt.Sprintf("cli-%d", time.Now().UnixNano()), SessionTimeout: 2 * time.Second},
		e.kcfg, d, processor.Serdes{Commands: s.Commands, Events: s.Events, State: s.State}, nil, reg)
	if err != nil {
		e.t.Fatal(err)
	}
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- p.Run(runCtx) }()
	stopped := false
	stop = func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		if err := <-done; err != nil {
			e.t.Errorf("processor: %v", err)
		}
	}
	e.t.Cleanup(stop)
	select {
	case <-p.Ready():
	case <-time.After(30 * time.Second):
		e.t.Fatal("processor not ready")
	}
	return p, reg, stop
}

func (e *cliEnv) commandsEnd() int64 {
	e.t.Helper()
	cl := pipelinetest.Client(e.t, e.kcfg.Brokers)
	ends, err := kadm.NewClient(cl).ListEndOffsets(context.Background(), e.topics.Commands())
	if err != nil {
		e.t.Fatal(err)
	}
	var n int64
	ends.Each(func(o kadm.ListedOffset) { n += o.Offset })
	return n
}

func waitBalance(t *testing.T, p *processor.Processor[ledger.Account], account string, want int64) {
	t.Helper()
	pipelinetest.Eventually(t, 30*time.Second, func() error {
		st, err := p.State(context.Background())
		if err != nil {
			return err
		}
		if got := st[account].State.Balance; got != want {
			return fmt.Errorf("%s: balance %d, want %d", account, got, want)
		}
		return nil
	})
}

var producedID = regexp.MustCompile(`command-id ([0-9a-f-]{36})`)

// `onceflow produce` turns JSON into correctly encoded and headed command
// records the processor handles; a command sent again with its id is
// recognized; bad input is refused with a message naming it, before
// anything is produced.
func TestProduce(t *testing.T) {
	t.Parallel()
	e := newCLIEnv(t)
	p, reg, _ := e.processor(ledger.NewDecider())

	out, err := e.run("produce", "-aggregate", "acme/acc-1", "-type", "OpenAccount", `{"currency":"EUR"}`)
	if err != nil {
		t.Fatalf("produce: %v\n%s", err, out)
	}
	if !producedID.MatchString(out) {
		t.Fatalf("produce printed no command id:\n%s", out)
	}
	dir := t.TempDir()
	// A time of its own, within the processor's bounds (past-timestamp).
	at := time.Now().Add(-time.Hour).UTC().Format(time.RFC3339)
	lines := `{"aggregate_id":"acme/acc-1","type":"Deposit","payload":{"amount":100},"command_id":"01890a5d-ac96-774b-bcce-b302099a8057"}

{"aggregate_id":"acme/acc-1","type":"Deposit","payload":{"amount":100},"command_id":"01890a5d-ac96-774b-bcce-b302099a8057"}
{"aggregate_id":"acme/acc-1","type":"Withdraw","payload":{"amount":30},"time":"` + at + `","traceparent":"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}
`
	file := filepath.Join(dir, "cmds.jsonl")
	if err := os.WriteFile(file, []byte(lines), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err = e.run("produce", "-file", file); err != nil {
		t.Fatalf("produce -file: %v\n%s", err, out)
	}
	if n := strings.Count(out, "produced "); n != 3 {
		t.Fatalf("produced %d commands, want 3:\n%s", n, out)
	}
	waitBalance(t, p, "acme/acc-1", 70)
	pipelinetest.Eventually(t, 10*time.Second, func() error {
		if n := counter(t, reg, "onceflow_command_dedup_total"); n != 1 {
			return fmt.Errorf("dedup %v, want 1", n)
		}
		return nil
	})

	before := e.commandsEnd()
	for _, bad := range []struct {
		args []string
		file string
		want string
	}{
		{args: []string{"-aggregate", "acme/acc-1", "-type", "Teleport", "{}"}, want: `unknown command type "Teleport"`},
		{args: []string{"-aggregate", "acme/acc-1", "-type", "Deposit", `{}`}, want: `lacks "amount"`},
		{args: []string{"-aggregate", "acme/acc-1", "-type", "Deposit", `{"amount":1,"color":"red"}`}, want: `unknown field "color"`},
		{args: []string{"-aggregate", "acme/acc-1", "-type", "Deposit", `{"amount":"1"}`}, want: "payload of Deposit"},
		{args: []string{"-aggregate", "no-tenant", "-type", "Deposit", `{"amount":1}`}, want: "want tenant/local-id"},
		{args: []string{"-aggregate", "acme/a b", "-type", "Deposit", `{"amount":1}`}, want: "aggregate id"},
		{args: []string{"-aggregate", "acme/acc-1", "-type", "Deposit", "-command-id", "42", `{"amount":1}`}, want: "command_id"},
		{file: `{"aggregate_id":"acme/acc-1","type":"Deposit","payload":{"amount":1}}
{"aggregate_id":"acme/acc-1","type":"Deposit","payload":{"amount":1}} trailing`, want: "line 2"},
		{file: `{"aggregate_id":"acme/acc-1","type":"Deposit","payload":{"amount":1}}
not json`, want: "line 2"},
	} {
		args := append([]string{"produce"}, bad.args...)
		if bad.file != "" {
			f := filepath.Join(dir, "bad.jsonl")
			os.WriteFile(f, []byte(bad.file), 0o644)
			args = append(args, "-file", f)
		}
		out, err := e.run(args...)
		if err == nil || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("produce %v: got %v (%s), want an error containing %q", bad.args, err, out, bad.want)
		}
		if err != nil && !strings.Contains(err.Error(), "nothing was produced") && !strings.Contains(err.Error(), "unexpected") {
			t.Errorf("produce %v: error %q does not say nothing was produced", bad.args, err)
		}
	}
	if after := e.commandsEnd(); after != before {
		t.Errorf("bad input produced %d records", after-before)
	}
}

// counter reads a counter (the sum over its label values) from reg.
func counter(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var n float64
	for _, mf := range mfs {
		if mf.GetName() == name {
			for _, m := range mf.GetMetric() {
				n += m.GetCounter().GetValue()
			}
		}
	}
	return n
}
