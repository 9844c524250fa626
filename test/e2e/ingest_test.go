package e2e

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/onceflow/onceflow/examples/ledger/ledgerapp"
	"github.com/onceflow/onceflow/pipeline/apiclient"
	"github.com/onceflow/onceflow/pipeline/ingest"
	"github.com/onceflow/onceflow/pipeline/pipelinetest"
)

// Two ingest processes on one database, each key sent by several clients
// at once to both, and one of the processes killed (SIGKILL) while
// requests are in flight: clients retry the same key on the survivor.
// Every key becomes exactly one command, every client of a key is told
// the same command, and the balances count each key once.
func TestTwoIngestProcessesOneKey(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	d := deploy(t, ctx)
	second, err := d.StartComponent(ctx, "ingest", "ingest-2", nil)
	if err != nil {
		t.Fatal(err)
	}
	first := d.comps["ingest"]
	clients := []*ledgerapp.Client{
		{Client: &apiclient.Client{BaseURL: first.HTTP, APIKey: d.client.APIKey}},
		{Client: &apiclient.Client{BaseURL: second.HTTP, APIKey: d.client.APIKey}},
	}

	const accounts, keysPerAccount, sendersPerKey = 4, 30, 6
	run := fmt.Sprintf("%x", rand.Uint32())
	acct := func(a int) string { return fmt.Sprintf("two-%s-%d", run, a) }
	for a := range accounts {
		if _, _, err := clients[a%2].OpenAccount(ctx, "open-"+acct(a), acct(a), "EUR"); err != nil {
			t.Fatal(err)
		}
	}

	var mu sync.Mutex
	told := map[string]map[string]bool{} // key -> command ids its clients were told
	want := map[string]int64{}
	var killOnce sync.Once
	var sent int
	var wg sync.WaitGroup
	for a := range accounts {
		for k := range keysPerAccount {
			key := fmt.Sprintf("dep-%s-%d-%d", run, a, k)
			amount := int64(1 + rand.IntN(100))
			want[acct(a)] += amount
			told[key] = map[string]bool{}
			for s := range sendersPerKey {
				wg.Add(1)
				go func() {
					defer wg.Done()
					// Alternate between the processes; after a failure,
					// try the other one (the first may be dead).
					for attempt := s; ; attempt++ {
						c := clients[attempt%2]
						acc, resp, err := c.Deposit(ctx, key, acct(a), amount)
						if err == nil {
							mu.Lock()
							told[key][acc.CommandID] = true
							mu.Unlock()
							return
						}
						if resp != nil && resp.Status < 500 && resp.Status != http.StatusTooManyRequests {
							t.Errorf("%s: %v", key, err)
							return
						}
						if ctx.Err() != nil {
							t.Errorf("%s: %v", key, err)
							return
						}
						time.Sleep(20 * time.Millisecond)
					}
				}()
			}
			mu.Lock()
			sent++
			if sent == accounts*keysPerAccount/3 {
				killOnce.Do(func() { go first.Kill() }) // a crash with requests in flight
			}
			mu.Unlock()
		}
	}
	wg.Wait()
	if t.Failed() {
		return
	}
	if !first.Exited() {
		t.Fatalf("the first ingest process was not killed")
	}

	var ids []string
	for key, cmds := range told {
		if len(cmds) != 1 {
			t.Errorf("key %s: clients were told %d different commands", key, len(cmds))
		}
		for id := range cmds {
			ids = append(ids, id)
		}
	}
	var stored, keys int
	if err := d.pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM command_status WHERE command_type = 'Deposit'),
		(SELECT count(*) FROM idempotency_keys WHERE key LIKE 'dep-%')`).Scan(&stored, &keys); err != nil {
		t.Fatal(err)
	}
	if stored != len(told) || keys != len(told) {
		t.Fatalf("%d deposit commands and %d key records for %d keys", stored, keys, len(told))
	}
	pipelinetest.Eventually(t, 90*time.Second, func() error {
		var pending int
		d.pool.QueryRow(ctx, `SELECT count(*) FROM command_status WHERE command_id = ANY($1::uuid[]) AND status <> 'accepted'`, ids).Scan(&pending)
		if pending > 0 {
			return fmt.Errorf("%d deposits not accepted yet", pending)
		}
		return nil
	})
	for a := range accounts {
		got, err := clients[1].Account(ctx, acct(a))
		if err != nil {
			t.Fatal(err)
		}
		if got.Balance != want[acct(a)] {
			t.Errorf("%s: balance %d, want %d", acct(a), got.Balance, want[acct(a)])
		}
	}
}

// Every command route through the whole pipeline, with tenant isolation:
// withdrawals, a transfer and a close have the outcomes the ledger
// defines, and tenant b's requests that name tenant a's accounts act on
// b's own (non-existent) accounts: rejected, a's balances untouched, a's
// data never shown.
func TestCommandRoutesEndToEnd(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	d := deploy(t, ctx)
	a := d.client
	keyB := ingest.NewAPIKey()
	if err := ingest.CreateAPIKey(ctx, d.pool, "beta", "e2e", keyB); err != nil {
		t.Fatal(err)
	}
	b := &ledgerapp.Client{Client: &apiclient.Client{BaseURL: a.BaseURL, APIKey: keyB}}

	type step struct {
		what   string
		send   func() (apiclient.Accepted, *apiclient.Response, error)
		status string // the outcome
		reason string
	}
	steps := []step{
		{"a opens acc-1", func() (apiclient.Accepted, *apiclient.Response, error) {
			return a.OpenAccount(ctx, "o1", "acc-1", "EUR")
		}, "accepted", ""},
		{"a opens acc-2", func() (apiclient.Accepted, *apiclient.Response, error) {
			return a.OpenAccount(ctx, "o2", "acc-2", "EUR")
		}, "accepted", ""},
		{"a deposits 100", func() (apiclient.Accepted, *apiclient.Response, error) { return a.Deposit(ctx, "d1", "acc-1", 100) }, "accepted", ""},
		{"a withdraws 30", func() (apiclient.Accepted, *apiclient.Response, error) { return a.Withdraw(ctx, "w1", "acc-1", 30) }, "accepted", ""},
		{"a overdraws", func() (apiclient.Accepted, *apiclient.Response, error) { return a.Withdraw(ctx, "w2", "acc-1", 1000) }, "rejected", "insufficient_funds"},
		{"a transfers 50", func() (apiclient.Accepted, *apiclient.Response, error) {
			return a.Transfer(ctx, "t1", "tr-1", "acc-1", "acc-2", 50)
		}, "accepted", ""},
		{"a closes acc-1 with 20 in it", func() (apiclient.Accepted, *apiclient.Response, error) { return a.Close(ctx, "c1", "acc-1") }, "rejected", "balance_not_zero"},
		{"a withdraws the rest", func() (apiclient.Accepted, *apiclient.Response, error) { return a.Withdraw(ctx, "w3", "acc-1", 20) }, "accepted", ""},
		{"a closes acc-1", func() (apiclient.Accepted, *apiclient.Response, error) { return a.Close(ctx, "c2", "acc-1") }, "accepted", ""},
		{"b deposits into a's acc-2", func() (apiclient.Accepted, *apiclient.Response, error) { return b.Deposit(ctx, "d1", "acc-2", 7) }, "rejected", "unknown_account"},
		{"b withdraws from a's acc-2", func() (apiclient.Accepted, *apiclient.Response, error) { return b.Withdraw(ctx, "w1", "acc-2", 7) }, "rejected", "unknown_account"},
		{"b transfers from a's acc-2", func() (apiclient.Accepted, *apiclient.Response, error) {
			return b.Transfer(ctx, "t1", "tr-1", "acc-2", "acc-1", 7)
		}, "rejected", "unknown_account"},
		{"b closes a's acc-2", func() (apiclient.Accepted, *apiclient.Response, error) { return b.Close(ctx, "c1", "acc-2") }, "rejected", "unknown_account"},
	}
	for _, s := range steps {
		acc, _, err := s.send()
		if err != nil {
			t.Fatalf("%s: %v", s.what, err)
		}
		c := a
		if s.what[0] == 'b' {
			c = b
		}
		wctx, wcancel := context.WithTimeout(ctx, 60*time.Second)
		cmd, err := c.WaitCommand(wctx, acc.CommandID)
		wcancel()
		if err != nil {
			t.Fatalf("%s: %v", s.what, err)
		}
		if cmd.Status != s.status || (s.reason != "" && cmd.Reason != s.reason) {
			t.Errorf("%s: %s %s, want %s %s", s.what, cmd.Status, cmd.Reason, s.status, s.reason)
		}
		// The other tenant never sees it.
		other := b
		if c == b {
			other = a
		}
		if _, err := other.Command(ctx, acc.CommandID); !apiclient.IsStatus(err, http.StatusNotFound) {
			t.Errorf("%s: the other tenant reading the command: %v, want 404", s.what, err)
		}
	}
	for acct, want := range map[string]int64{"acc-1": 0, "acc-2": 50} {
		got, err := a.Account(ctx, acct)
		if err != nil || got.Balance != want {
			t.Errorf("a's %s: %+v %v, want balance %d", acct, got, err, want)
		}
		if _, err := b.Account(ctx, acct); !apiclient.IsStatus(err, http.StatusNotFound) {
			t.Errorf("b reading a's %s: %v, want 404", acct, err)
		}
	}
	if got, _ := a.Account(ctx, "acc-1"); got.Status != "closed" {
		t.Errorf("acc-1 is %s, want closed", got.Status)
	}
}
