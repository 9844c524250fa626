package chaos

import (
	"context"
	"flag"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/onceflow/onceflow"
	"github.com/onceflow/onceflow/examples/inventory/inventoryapp"
	"github.com/onceflow/onceflow/pipeline/avro"
	"github.com/onceflow/onceflow/pipeline/ingest"
	"github.com/onceflow/onceflow/pipeline/kafka"
	"github.com/onceflow/onceflow/pipeline/pipelinetest"
	"github.com/onceflow/onceflow/test/e2e"
)

var inventoryDurationFlag = flag.Duration("chaos.inventory.duration", 30*time.Second,
	"how long the inventory shape's workload and faults run, per seed (-chaos.duration, when given, sets it too)")

// TestChaosInventory is the inventory's shape (examples/inventory): the
// same cluster of separate processes and the same seeded fault schedule
// as the bank's, running the inventory binary, under a workload of three
// tenants adding stock to items and placing orders for them (a share of
// orders for an item that never gets stock; requests retried with the
// same key through timeouts, some on purpose; orders placed again with a
// new key; orders produced straight to Kafka with stable command ids, some
// twice, and poison ones among them) — a saga across two aggregate types whose every step is a
// command one processor's transaction sends to another's topic. After the
// drain its invariant is checked: each order placed once and decided once,
// no item's available stock ever negative, available + reserved = the
// stock added (within what the clients know was accepted), every
// reservation a confirmed order's and every confirmed order reserved, no
// event twice, versions 1..n, every poison record in the DLQ once and
// recorded failed once, placing nothing, and the read models equal to the
// events.
func TestChaosInventory(t *testing.T) {
	if *kafkaFlag {
		t.Skip("-chaos.kafka runs the bank's shape (TestChaos, make chaos-kafka): its topics are made before the run's deployment starts")
	}
	duration := *inventoryDurationFlag
	flag.Visit(func(f *flag.Flag) {
		if f.Name == "chaos.duration" {
			duration = *durationFlag
		}
	})
	list := []uint64{1}
	if *seedFlag != 0 {
		list = []uint64{*seedFlag}
	}
	for _, seed := range list {
		t.Run(fmt.Sprintf("seed=%d", seed), func(t *testing.T) { runInventorySeed(t, seed, duration) })
	}
}

func runInventorySeed(t *testing.T, seed uint64, duration time.Duration) {
	ctx, cancel := context.WithTimeout(context.Background(), duration+*drainFlag+5*time.Minute)
	defer cancel()
	t.Logf("inventory shape, seed %d, duration %s (reproduce: go test ./test/chaos -run TestChaosInventory -args -chaos.seed=%d -chaos.inventory.duration=%s)",
		seed, duration, seed, duration)
	c := startClusterOf(t, ctx, binDir, "inventory")
	var tenants []e2e.InventoryTenant
	for i := range 3 {
		tn := e2e.InventoryTenant{Name: fmt.Sprintf("tenant%d", i), Key: ingest.NewAPIKey()}
		for j := range 4 {
			tn.Items = append(tn.Items, fmt.Sprintf("item-%d", j))
		}
		if err := ingest.CreateAPIKey(ctx, c.pool, tn.Name, "chaos", tn.Key); err != nil {
			t.Fatal(err)
		}
		tenants = append(tenants, tn)
	}
	reg, err := avro.NewClient(c.pl.RegistryURL)
	if err != nil {
		t.Fatal(err)
	}
	serdes, err := onceflow.NewSerdes(ctx, reg, inventoryapp.Domain(), "order", kafka.Topics{})
	if err != nil {
		t.Fatal(err)
	}
	producer := pipelinetest.Client(t, c.pl.Brokers())
	load := &e2e.InventoryLoad{
		Tenants: tenants, URLs: c.ingestURLs, Seed: seed,
		Producer: producer, Encode: serdes.Commands.Encode,
		HTTP: &http.Client{Timeout: 2 * time.Second}, // clients time out and retry with the same key
	}
	f := newFaults(c, seed)
	start := time.Now()
	stop, stopLoad := context.WithTimeout(ctx, duration)
	defer stopLoad()
	finish, stopFinish := context.WithTimeout(ctx, duration+2*time.Minute)
	defer stopFinish()
	faultsDone := make(chan struct{})
	go func() { defer close(faultsDone); f.run(stop) }()
	load.Run(stop, finish, 6)
	<-faultsDone
	faultsStopped := time.Now()
	if err := c.ensureAll(ctx); err != nil {
		t.Fatalf("restart after the faults: %v", err)
	}
	var derr error
	for deadline := time.Now().Add(*drainFlag); time.Now().Before(deadline); time.Sleep(250 * time.Millisecond) {
		if derr = e2e.InventoryDecided(ctx, c.pool, &load.M); derr == nil {
			time.Sleep(time.Second) // let any in-flight duplicate reach the inbox
			break
		}
	}
	drainTime := time.Since(faultsStopped)

	cl := pipelinetest.Client(t, c.pl.Brokers())
	st, vs := e2e.CheckInventoryEvents(ctx, cl, serdes.Events.Decode, &load.M)
	if st != nil {
		vs = append(vs, e2e.CheckInventoryReadModels(ctx, c.pool, st, &load.M)...)
	}
	vs = append(vs, load.M.Errs...)
	if n := load.M.Abandoned.Load(); n > 0 {
		vs = append(vs, fmt.Sprintf("%d requests abandoned unanswered: their fate is unknown", n))
	}
	kinds, counts := f.summary()
	var faults []string
	for _, k := range kinds {
		faults = append(faults, fmt.Sprintf("%s %d", k, counts[k]))
	}
	summary := "no events read"
	if st != nil {
		summary = st.Summary()
	}
	t.Logf("seed %d: %s in %s; %d requests, %d retries, %d replays, %d orders placed again, %d produced to Kafka (%d twice); faults: %s; drained in %s",
		seed, summary, time.Since(start).Round(time.Second), load.M.Requests.Load(), load.M.Retries.Load(), load.M.Replays.Load(),
		len(load.M.Again), load.M.Produced.Load(), load.M.Twice.Load(), strings.Join(faults, ", "), drainTime.Round(time.Millisecond))
	if !verdict(t, f, seed, derr, vs) {
		return
	}
	audit(t, ctx, c, seed, start)
	inventorySelfTest(t, ctx, c, serdes.Events.Decode, &load.M, st)
}

// inventorySelfTest feeds the checker what a broken pipeline would have
// left — an order the clients never placed, stock added that nobody
// asked for, a read model that lost a reservation — and asserts it
// reports each one.
func inventorySelfTest(t *testing.T, ctx context.Context, c *cluster, decode func(context.Context, []byte) (any, error), m *e2e.InventoryModel, st *e2e.InventoryState) {
	t.Helper()
	var order, item string
	for id := range m.Orders {
		order = id
		break
	}
	for id, it := range st.Items {
		if it.Reserved > 0 {
			item = id
			break
		}
	}
	expect := func(what, property string, vs []string) {
		t.Helper()
		if !slices.ContainsFunc(vs, func(v string) bool { return strings.Contains(v, property) }) {
			t.Errorf("checker self-test: %s was not reported (%q); got %v", what, property, vs)
		}
	}
	delete(m.Orders, order)
	_, vs := e2e.CheckInventoryEvents(ctx, pipelinetest.Client(t, c.pl.Brokers()), decode, m)
	m.Orders[order] = true
	expect("an order nobody placed", "the workload did not place it", vs)

	m.StockSure[item] += 1000
	_, vs = e2e.CheckInventoryEvents(ctx, pipelinetest.Client(t, c.pl.Brokers()), decode, m)
	m.StockSure[item] -= 1000
	expect("stock lost", "units added, the clients had", vs)

	if _, err := c.pool.Exec(ctx, `UPDATE inventory_items SET reserved = reserved - 1, available = available + 1 WHERE tenant || '/' || item_id = $1`, item); err != nil {
		t.Fatal(err)
	}
	vs = e2e.CheckInventoryReadModels(ctx, c.pool, st, m)
	if _, err := c.pool.Exec(ctx, `UPDATE inventory_items SET reserved = reserved + 1, available = available - 1 WHERE tenant || '/' || item_id = $1`, item); err != nil {
		t.Fatal(err)
	}
	expect("a read model off by one unit", "inventory_items "+item, vs)
}
