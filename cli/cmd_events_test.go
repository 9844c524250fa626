package cli_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/onceflow/onceflow/examples/ledger"
	"github.com/onceflow/onceflow/pipeline/pipelinetest"
)

// `onceflow events tail` prints what the events say, decoded, as a team
// downstream would read them: from the start up to the end, as JSON lines
// filtered by type or key, and, following, an event decided after it
// started.
func TestEventsTail(t *testing.T) {
	t.Parallel()
	e := newCLIEnv(t)
	e.processor(ledger.NewDecider())
	for _, c := range [][]string{
		{"-aggregate", "acme/acc-1", "-type", "OpenAccount", `{"currency":"EUR"}`},
		{"-aggregate", "acme/acc-1", "-type", "Deposit", `{"amount":1500}`},
		{"-aggregate", "acme/acc-2", "-type", "OpenAccount", `{"currency":"USD"}`},
	} {
		if out, err := e.run(append([]string{"produce"}, c...)...); err != nil {
			t.Fatalf("produce: %v\n%s", err, out)
		}
	}
	var out string
	pipelinetest.Eventually(t, 30*time.Second, func() error {
		var err error
		out, err = e.run("events", "tail", "-from", "start", "-follow=false")
		if err == nil && strings.Count(out, "\n") < 4 { // the header and three events
			err = fmt.Errorf("events tail printed:\n%s", out)
		}
		return err
	})
	for _, want := range []string{"TYPE", "AccountOpened", "Deposited", "acme/acc-1", "acme/acc-2", "1500", "EUR", "USD"} {
		if !strings.Contains(out, want) {
			t.Errorf("events tail lacks %q:\n%s", want, out)
		}
	}

	out, err := e.run("events", "tail", "-from", "start", "-follow=false", "-json", "-type", "Deposited")
	if err != nil {
		t.Fatal(err)
	}
	var line struct {
		Key     string `json:"key"`
		Type    string `json:"type"`
		EventID string `json:"event_id"`
		Value   struct {
			Amount int64 `json:"amount"`
		} `json:"value"`
	}
	if err := json.Unmarshal([]byte(out), &line); err != nil || strings.Count(out, "\n") != 1 ||
		line.Key != "acme/acc-1" || line.Type != "Deposited" || line.EventID == "" || line.Value.Amount != 1500 {
		t.Errorf("events tail -json -type Deposited: %+v (%v)\n%s", line, err, out)
	}
	if out, err := e.run("events", "tail", "-from", "start", "-follow=false", "-key", "acme/acc-2"); err != nil || strings.Contains(out, "acme/acc-1") || !strings.Contains(out, "acme/acc-2") {
		t.Errorf("events tail -key acme/acc-2: %v\n%s", err, out)
	}

	// Following from the end: only what comes after.
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var followed bytes.Buffer
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, []string{"events", "tail", "-json", "-n", "1"}, func(k string) string { return e.env[k] }, &followed)
	}()
	pipelinetest.Eventually(t, 30*time.Second, func() error {
		if out, err := e.run("produce", "-aggregate", "acme/acc-2", "-type", "Deposit", `{"amount":7}`); err != nil {
			return fmt.Errorf("produce: %v\n%s", err, out)
		}
		select {
		case err := <-done:
			if err != nil {
				t.Fatal(err)
			}
			return nil
		case <-time.After(2 * time.Second):
			return fmt.Errorf("events tail printed nothing yet")
		}
	})
	if !strings.Contains(followed.String(), `"amount":7`) || strings.Contains(followed.String(), "1500") {
		t.Errorf("events tail following from the end printed:\n%s", followed.String())
	}
}
