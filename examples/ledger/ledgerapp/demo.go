package ledgerapp

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"text/tabwriter"
	"time"

	"github.com/onceflow/onceflow/pipeline/apiclient"
)

// RunDemo drives a short scripted workload against a running ingest (what
// `make demo` runs against `onceflow dev`): it opens two accounts, deposits,
// retries a request with the same Idempotency-Key, sends a duplicate with a
// new key, reuses a key for a different request, and opens an account
// twice. It prints what happened and the resulting balances, and returns
// an error unless the read models show exactly the expected numbers.
func RunDemo(ctx context.Context, api *apiclient.Client, out io.Writer) error {
	c := Client{api}
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	run := apiclient.NewKey()[:6] // this run's accounts and keys: a second run makes new ones
	alice, bob := "alice-"+run, "bob-"+run
	steps := demoSteps(ctx, c, func(s string) string { return "demo-" + run + "-" + s }, alice, bob)
	want := map[string]int64{alice: 650, bob: 500}

	results, problems, err := sendSteps(steps)
	if err != nil {
		return err
	}
	for i, s := range steps {
		if s.wantState == "" || results[i].acc.CommandID == "" {
			continue
		}
		cmd, err := c.WaitCommand(ctx, results[i].acc.CommandID)
		if err != nil {
			return fmt.Errorf("step %d (%s): %w", i+1, s.what, err)
		}
		results[i].cmd = cmd
		if cmd.Status != s.wantState {
			problems = append(problems, fmt.Errorf("step %d (%s): outcome %s, want %s", i+1, s.what, cmd.Status, s.wantState))
		}
	}
	printSteps(out, steps, results)
	fmt.Fprintln(out)
	balances, err := printBalances(ctx, out, c, []string{alice, bob}, want)
	if err != nil {
		return err
	}
	if err := errors.Join(append(problems, balances...)...); err != nil {
		return fmt.Errorf("the demo found problems:\n%w", err)
	}
	fmt.Fprintln(out, "\nOK: every retry was absorbed, every command has exactly one outcome, and the balances are exact.")
	return nil
}

// demoStep is one request of the demo and what it must get.
type demoStep struct {
	what      string
	send      func() (apiclient.Accepted, *apiclient.Response, error)
	wantHTTP  int
	replay    bool   // expect Idempotent-Replayed: true
	sameAs    int    // for a replay: the step whose command id must come back
	wantState string // accepted or rejected, once processed
}

// demoResult is what a step got.
type demoResult struct {
	resp *apiclient.Response
	acc  apiclient.Accepted
	cmd  apiclient.Command
}

// demoSteps are the demo's requests, on the accounts alice and bob, with
// their Idempotency-Keys made by key.
func demoSteps(ctx context.Context, c Client, key func(string) string, alice, bob string) []demoStep {
	open := func(keyName, id string) func() (apiclient.Accepted, *apiclient.Response, error) {
		return func() (apiclient.Accepted, *apiclient.Response, error) {
			return c.OpenAccount(ctx, key(keyName), id, "EUR")
		}
	}
	deposit := func(keyName, id string, amount int64) func() (apiclient.Accepted, *apiclient.Response, error) {
		return func() (apiclient.Accepted, *apiclient.Response, error) {
			return c.Deposit(ctx, key(keyName), id, amount)
		}
	}
	return []demoStep{
		{what: "open " + alice + " (EUR)", send: open("open-alice", alice), wantHTTP: 202, wantState: "accepted"},
		{what: "open " + alice + " again, same key (client retry)", send: open("open-alice", alice), wantHTTP: 202, replay: true, sameAs: 1},
		{what: "open " + bob + " (EUR)", send: open("open-bob", bob), wantHTTP: 202, wantState: "accepted"},
		{what: "deposit 100 to " + alice, send: deposit("dep-1", alice, 100), wantHTTP: 202, wantState: "accepted"},
		{what: "deposit 250 to " + alice, send: deposit("dep-2", alice, 250), wantHTTP: 202, wantState: "accepted"},
		{what: "deposit 250 to " + alice + ", same key (client retry)", send: deposit("dep-2", alice, 250), wantHTTP: 202, replay: true, sameAs: 5},
		{what: "deposit 250 to " + alice + ", new key (a second deposit)", send: deposit("dep-3", alice, 250), wantHTTP: 202, wantState: "accepted"},
		{what: "deposit 50 to " + alice, send: deposit("dep-4", alice, 50), wantHTTP: 202, wantState: "accepted"},
		{what: "deposit 500 to " + bob, send: deposit("dep-5", bob, 500), wantHTTP: 202, wantState: "accepted"},
		{what: "deposit 999 to " + alice + " reusing the key of the 100 deposit", send: deposit("dep-1", alice, 999), wantHTTP: 409},
		{what: "open " + alice + " again, new key", send: open("open-alice-2", alice), wantHTTP: 202, wantState: "rejected"},
	}
}

// sendSteps sends each step in order and checks its answer: the status,
// whether it was replayed, and a replay's command id.
func sendSteps(steps []demoStep) ([]demoResult, []error, error) {
	results := make([]demoResult, len(steps))
	var problems []error
	for i, s := range steps {
		acc, resp, err := s.send()
		if resp == nil {
			return nil, nil, fmt.Errorf("step %d (%s): %w", i+1, s.what, err)
		}
		results[i] = demoResult{resp: resp, acc: acc}
		if resp.Status != s.wantHTTP {
			problems = append(problems, fmt.Errorf("step %d (%s): HTTP %d, want %d", i+1, s.what, resp.Status, s.wantHTTP))
		}
		if resp.Replayed() != s.replay {
			problems = append(problems, fmt.Errorf("step %d (%s): replayed = %v, want %v", i+1, s.what, resp.Replayed(), s.replay))
		}
		if s.replay && acc.CommandID != results[s.sameAs-1].acc.CommandID {
			problems = append(problems, fmt.Errorf("step %d (%s): command %s, want the original %s", i+1, s.what, acc.CommandID, results[s.sameAs-1].acc.CommandID))
		}
	}
	return results, problems, nil
}

// printSteps prints each step with what it got.
func printSteps(out io.Writer, steps []demoStep, results []demoResult) {
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "#\trequest\tHTTP\treplayed\tcommand\toutcome")
	for i, s := range steps {
		r := results[i]
		outcome := r.cmd.Status
		switch {
		case r.cmd.Reason != "":
			outcome += " (" + r.cmd.Reason + ")"
		case s.replay:
			outcome = "same command as #" + fmt.Sprint(s.sameAs)
		case r.resp.Status == http.StatusConflict:
			outcome = "refused: idempotency-key-reused"
		}
		fmt.Fprintf(tw, "%d\t%s\t%d\t%v\t%s\t%s\n", i+1, s.what, r.resp.Status, r.resp.Replayed(), short(r.acc.CommandID), outcome)
	}
	tw.Flush()
}

// printBalances prints the accounts' balances next to the expected ones
// and returns the differences.
func printBalances(ctx context.Context, out io.Writer, c Client, ids []string, want map[string]int64) ([]error, error) {
	var problems []error
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "account\tbalance\texpected\tversion\tcurrency")
	for _, id := range ids {
		a, err := c.Account(ctx, id)
		if err != nil {
			return nil, fmt.Errorf("read account %s: %w", id, err)
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%s\n", id, a.Balance, want[id], a.Version, a.Currency)
		if a.Balance != want[id] {
			problems = append(problems, fmt.Errorf("account %s: balance %d, want %d", id, a.Balance, want[id]))
		}
	}
	return problems, tw.Flush()
}

func short(id string) string {
	if len(id) > 13 {
		return id[:13] + "…"
	}
	return id
}
