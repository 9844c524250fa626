package cli_test

import (
	"context"
	"encoding/json"
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/onceflow/onceflow/examples/ledger"
	"github.com/onceflow/onceflow/pipeline"
	"github.com/onceflow/onceflow/pipeline/pipelinetest"
)

// buggy is the ledger as a release with a bug: a deposit of 666 panics.
func buggy() *pipeline.Aggregate[ledger.Account] {
	good := ledger.NewDecider()
	a := pipeline.NewAggregate(ledger.Evolve)
	pipeline.Handle(a, func(s ledger.Account, c pipeline.Command, _ ledger.OpenAccount) (pipeline.Decision, error) {
		return good.Decide(s, c)
	})
	pipeline.Handle(a, func(s ledger.Account, c pipeline.Command, d ledger.Deposit) (pipeline.Decision, error) {
		if d.Amount == 666 {
			panic("bug 666")
		}
		return good.Decide(s, c)
	})
	return a
}

var dlqRow = regexp.MustCompile(`(?m)^(\d+:\d+)\s+\S+\s+(\S+)\s+`)

// `onceflow dlq list` shows every poison command with its reason;
// `onceflow dlq redrive` republishes chosen ones with their original
// command id: once the bug is fixed the command is handled, exactly once
// however often it is redriven, and a command that is still poison goes
// back to the DLQ.
func TestDLQListAndRedrive(t *testing.T) {
	t.Parallel()
	e := newCLIEnv(t)
	_, _, stop := e.processor(buggy())

	if out, err := e.run("produce", "-aggregate", "acme/acc-1", "-type", "OpenAccount", `{"currency":"EUR"}`); err != nil {
		t.Fatalf("produce: %v\n%s", err, out)
	}
	out, err := e.run("produce", "-aggregate", "acme/acc-1", "-type", "Deposit", `{"amount":666}`)
	if err != nil {
		t.Fatalf("produce: %v\n%s", err, out)
	}
	bugID := producedID.FindStringSubmatch(out)[1]
	// A record without a tenant header, as a careless producer sends it.
	cl := pipelinetest.Client(t, e.kcfg.Brokers)
	if err := cl.ProduceSync(context.Background(), &kgo.Record{Topic: e.topics.Commands(), Key: []byte("acme/acc-1"), Value: []byte("x"),
		Headers: []kgo.RecordHeader{{Key: pipeline.HeaderCommandID, Value: []byte(pipeline.NewCommandID().String())}}}).FirstErr(); err != nil {
		t.Fatal(err)
	}

	var rows [][]string
	pipelinetest.Eventually(t, 30*time.Second, func() error {
		out, err = e.run("dlq", "list")
		if err != nil {
			return err
		}
		rows = dlqRow.FindAllStringSubmatch(out, -1)
		if len(rows) != 2 {
			return fmt.Errorf("%d DLQ rows:\n%s", len(rows), out)
		}
		return nil
	})
	reasons := map[string]string{} // reason -> coordinates
	for _, r := range rows {
		reasons[r[2]] = r[1]
	}
	if reasons["decider-panic"] == "" || reasons["missing-tenant"] == "" || !strings.Contains(out, bugID) || !strings.Contains(out, "bug 666") {
		t.Fatalf("dlq list:\n%s", out)
	}
	if !strings.HasSuffix(out, "\n2 records\n") {
		t.Errorf("dlq list of two records ends %q, want \"2 records\"", out[max(0, len(out)-40):])
	}
	if out, err = e.run("dlq", "list", "-reason", "decider-panic"); err != nil || !strings.HasSuffix(out, "\n1 record\n") {
		t.Errorf("dlq list of one record: %v, ends %q, want \"1 record\"", err, out[max(0, len(out)-40):])
	}
	out, err = e.run("dlq", "list", "-json", "-reason", "decider-panic")
	if err != nil {
		t.Fatal(err)
	}
	var rec struct {
		Reason  string            `json:"reason"`
		Headers map[string]string `json:"headers"`
	}
	if err := json.Unmarshal([]byte(out), &rec); err != nil || rec.Reason != "decider-panic" || rec.Headers[pipeline.HeaderCommandID] != bugID {
		t.Fatalf("dlq list -json: %v\n%s", err, out)
	}

	// The fix ships: a processor with the right decider.
	stop()
	p, reg, _ := e.processor(ledger.NewDecider())
	for range 2 { // redriving twice is harmless
		if out, err := e.run("dlq", "redrive", reasons["decider-panic"]); err != nil || !strings.Contains(out, "redrove "+reasons["decider-panic"]) {
			t.Fatalf("redrive: %v\n%s", err, out)
		}
	}
	waitBalance(t, p, "acme/acc-1", 666)
	pipelinetest.Eventually(t, 10*time.Second, func() error {
		if n := counter(t, reg, "onceflow_command_dedup_total"); n != 1 {
			return fmt.Errorf("dedup %v, want 1 (the second redrive)", n)
		}
		return nil
	})
	// Still poison: back to the DLQ with its reason.
	if out, err := e.run("dlq", "redrive", "-reason", "missing-tenant"); err != nil {
		t.Fatalf("redrive: %v\n%s", err, out)
	}
	pipelinetest.Eventually(t, 30*time.Second, func() error {
		out, err := e.run("dlq", "list", "-reason", "missing-tenant")
		if err != nil {
			return err
		}
		if n := len(dlqRow.FindAllString(out, -1)); n != 2 {
			return fmt.Errorf("%d missing-tenant rows, want 2:\n%s", n, out)
		}
		return nil
	})

	for _, bad := range [][]string{{"redrive"}, {"redrive", "-all", "-reason", "x"}, {"redrive", "0:x"}, {"redrive", "2:9999"}} {
		if out, err := e.run(append([]string{"dlq"}, bad...)...); err == nil {
			t.Errorf("dlq %v: no error\n%s", bad, out)
		}
	}
}
