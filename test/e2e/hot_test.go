package e2e

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/onceflow/onceflow/pipeline"
	"github.com/onceflow/onceflow/pipeline/apiclient"
	"github.com/onceflow/onceflow/pipeline/pipelinetest"
)

// hotCommands is how many deposits TestHotAggregate sends to its one
// account (ONCEFLOW_E2E_HOT_COMMANDS scales it; the issue that asked for
// this test asked for at least 100,000: more than twice what once filled
// an aggregate's snapshot past the broker's record limit).
func hotCommands(t *testing.T) int {
	if s := os.Getenv("ONCEFLOW_E2E_HOT_COMMANDS"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 {
			t.Fatalf("ONCEFLOW_E2E_HOT_COMMANDS=%q: want a positive count", s)
		}
		return n
	}
	return 100_000
}

// maxAccountSnapshot bounds the size of an account's snapshot on the state
// topic: what the ledger's state holds (balance, currency, status, version,
// transfers in flight), and nothing that grows with the commands it has
// handled (docs/decisions/0021-bounded-dedup-memory.md).
const maxAccountSnapshot = 256

// One account takes 100,000 deposits over HTTP from 64 clients with the
// tenant rate limit off, as a merchant or settlement account does in a
// day: every one is applied once, the balance is exact, none is left
// pending, the account's snapshot stays as small as it was after its first
// command, and a duplicate of its oldest command, produced again straight
// to Kafka after all the others, is still recognised.
func TestHotAggregate(t *testing.T) {
	n := hotCommands(t)
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	d := deployWith(t, ctx, map[string]string{"ONCEFLOW_TENANT_RATE_LIMIT": "0"})
	acct := fmt.Sprintf("hot-%x", rand.Uint32())
	m := newModel()
	open, _, err := send(ctx, d.client, "open-"+acct, func(k string) (apiclient.Accepted, *apiclient.Response, error) {
		return d.client.OpenAccount(ctx, k, acct, "EUR")
	})
	if err != nil {
		t.Fatal(err)
	}
	m.accepted(open.CommandID, acct, 0)

	start := time.Now()
	var next atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	for w := 0; w < 64; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := next.Add(1); i <= int64(n); i = next.Add(1) {
				acc, _, err := send(ctx, d.client, fmt.Sprintf("dep-%s-%d", acct, i), func(k string) (apiclient.Accepted, *apiclient.Response, error) {
					return d.client.Deposit(ctx, k, acct, 1)
				})
				if err != nil {
					errs <- fmt.Errorf("deposit %d: %w", i, err)
					return
				}
				m.accepted(acc.CommandID, acct, 1)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	accepted := time.Since(start)
	d.checkExact(t, ctx, m)
	t.Logf("%d deposits to one account: accepted in %v (%.0f/s), applied %v after the first", n, accepted.Round(time.Millisecond),
		float64(n)/accepted.Seconds(), time.Since(start).Round(time.Millisecond))
	if t.Failed() {
		return
	}

	// The snapshot did not grow with the account's traffic.
	key := pipeline.AggregateID("acme", acct)
	var first, largest, count int
	for _, r := range readEvents(t, ctx, d.BrokerAddr, d.Prefix+".state") {
		if string(r.Key) != key {
			continue
		}
		if count++; first == 0 {
			first = len(r.Value)
		}
		largest = max(largest, len(r.Value))
	}
	t.Logf("%s's snapshots: %d records, the first %d B, the largest %d B", key, count, first, largest)
	if count == 0 || largest > maxAccountSnapshot || largest > first+16 {
		t.Errorf("%s's snapshots: %d records, the first %d B, the largest %d B; want at most %d B, and no growth beyond its balance's varint",
			key, count, first, largest, maxAccountSnapshot)
	}

	// The oldest command of the window, sent again byte for byte as a
	// producer retry would, is a duplicate: no event, the balance stays.
	dedup := func() float64 {
		v, err := d.comps["processor"].Metric(ctx, "onceflow_command_dedup_total")
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	before := dedup()
	oldest := firstCommand(t, ctx, d, key)
	if got := header(oldest, pipeline.HeaderCommandID); got != open.CommandID {
		t.Fatalf("the oldest command record of %s has id %s, want the opening %s", key, got, open.CommandID)
	}
	producer := pipelinetest.Client(t, d.Brokers())
	again := &kgo.Record{Topic: oldest.Topic, Partition: oldest.Partition, Key: oldest.Key, Value: oldest.Value, Headers: oldest.Headers}
	if err := producer.ProduceSync(ctx, again).FirstErr(); err != nil {
		t.Fatal(err)
	}
	pipelinetest.Eventually(t, 30*time.Second, func() error {
		if got := dedup(); got <= before {
			return fmt.Errorf("dedup counter %v, want above %v", got, before)
		}
		return nil
	})
	d.checkExact(t, ctx, m)
}

// deployWith is deploy with env added to every component's environment.
func deployWith(t *testing.T, ctx context.Context, env map[string]string) *deployment {
	t.Helper()
	if testing.Short() {
		t.Skip("multi-process end-to-end test; skipped with -short")
	}
	return deployOn(t, ctx, "", env)
}

// firstCommand returns the first record of aggregate on the commands topic.
func firstCommand(t *testing.T, ctx context.Context, d *deployment, aggregate string) *kgo.Record {
	t.Helper()
	for _, r := range readEvents(t, ctx, d.BrokerAddr, d.Prefix+".commands") {
		if string(r.Key) == aggregate {
			return r
		}
	}
	t.Fatalf("no command record of %s", aggregate)
	return nil
}
