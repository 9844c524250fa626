package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/onceflow/onceflow/examples/ledger/ledgerapp"
	"github.com/onceflow/onceflow/pipeline/apiclient"
	"github.com/onceflow/onceflow/pipeline/ingest"
	"github.com/onceflow/onceflow/pipeline/pipelinetest"
)

// A deployment moved to another broker with its database, as README's
// "On Apache Kafka" has a newcomer do after make demo: the pipeline runs
// on an embedded broker, then on the other broker (Apache Kafka under make
// test-kafka, another embedded broker under make test) with the same
// Postgres and topic names. The projector's stored offsets count the
// first broker's topic: it parks every partition it stored an offset for
// (topic-changed) instead of waiting at them or skipping the new topic's
// first events; `onceflow lag` shows it; the operator's `onceflow
// projections reset -from start` is recorded, and then every event of the
// new topic is applied once.
func TestMoveToAnotherBroker(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-process end-to-end test; skipped with -short")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	pool, url := pipelinetest.Pool(t)
	key := ingest.NewAPIKey()
	if err := ingest.CreateAPIKey(ctx, pool, "acme", "e2e", key); err != nil {
		t.Fatal(err)
	}
	// The second broker: Apache Kafka when the suite runs on it.
	to := newPipeline(t, url)
	// The first: an embedded broker of its own, with the same topic names.
	from := NewPipeline(binDir, t.TempDir(), url)
	from.BrokerAddr, from.External, from.Prefix = fmt.Sprintf("127.0.0.1:%d", FreePort()), false, to.Prefix
	t.Cleanup(from.KillAll)

	run := func(pl *Pipeline) *deployment {
		t.Helper()
		if _, err := pl.StartBroker(ctx); err != nil {
			t.Fatal(err)
		}
		d := &deployment{Pipeline: pl, pool: pool, comps: map[string]*Component{}}
		d.startAll(t, ctx)
		d.client = &ledgerapp.Client{Client: &apiclient.Client{BaseURL: d.comps["ingest"].HTTP, APIKey: key}}
		return d
	}
	accepted := func(d *deployment, what string, post func(k string) (apiclient.Accepted, *apiclient.Response, error)) string {
		t.Helper()
		acc, _, err := send(ctx, d.client, what, post)
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		return acc.CommandID
	}

	a := run(from)
	id := accepted(a, "open-a", func(k string) (apiclient.Accepted, *apiclient.Response, error) {
		return a.client.OpenAccount(ctx, k, "acc-a", "EUR")
	})
	dep := accepted(a, "dep-a", func(k string) (apiclient.Accepted, *apiclient.Response, error) {
		return a.client.Deposit(ctx, k, "acc-a", 5)
	})
	for _, c := range []string{id, dep} {
		if cmd, err := a.client.WaitCommand(ctx, c); err != nil || cmd.Status != "accepted" {
			t.Fatalf("on the first broker: %+v %v", cmd, err)
		}
	}
	from.StopAll(20 * time.Second)

	b := run(to)
	var waiting []string
	waiting = append(waiting, accepted(b, "open-b", func(k string) (apiclient.Accepted, *apiclient.Response, error) {
		return b.client.OpenAccount(ctx, k, "acc-b", "EUR")
	}))
	waiting = append(waiting, accepted(b, "dep-b", func(k string) (apiclient.Accepted, *apiclient.Response, error) {
		return b.client.Deposit(ctx, k, "acc-b", 7)
	}))

	// Parked, and said so, rather than waiting at the old offsets or
	// skipping the new topic's events.
	var lag string
	pipelinetest.Eventually(t, time.Minute, func() error {
		out, err := runCLI(ctx, to, "lag", "-group", "onceflow-projector")
		lag = out
		if err == nil && !strings.Contains(out, "topic-changed") {
			err = fmt.Errorf("not parked topic-changed yet")
		}
		return err
	})
	for _, c := range waiting {
		if cmd, err := b.client.Command(ctx, c); err != nil || cmd.Status != "pending" {
			t.Errorf("a command on the new broker before the operator chose: %+v %v, want pending", cmd, err)
		}
	}

	out, err := runCLI(ctx, to, "projections", "reset", "-from", "start", "-note", "moved to another broker", "-operator", "e2e", "all")
	if err != nil {
		t.Fatalf("projections reset: %v\n%s\nlag before:\n%s", err, out, lag)
	}
	for _, c := range waiting {
		if cmd, err := b.client.WaitCommand(ctx, c); err != nil || cmd.Status != "accepted" {
			t.Errorf("a command on the new broker after the reset: %+v %v, want accepted", cmd, err)
		}
	}
	if acc, err := b.client.Account(ctx, "acc-b"); err != nil || acc.Balance != 7 || acc.Version != 2 {
		t.Errorf("acc-b after the reset: %+v %v, want balance 7 at version 2 (each event once)", acc, err)
	}
	var resets int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM projector_resets WHERE operator = 'e2e'`).Scan(&resets); err != nil || resets == 0 {
		t.Errorf("projector_resets: %d rows (%v), want the reset recorded", resets, err)
	}
}
