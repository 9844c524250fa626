package e2e

import (
	"context"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/onceflow/onceflow"
	"github.com/onceflow/onceflow/examples/inventory"
	"github.com/onceflow/onceflow/examples/inventory/inventoryapp"
	"github.com/onceflow/onceflow/pipeline/avro"
	"github.com/onceflow/onceflow/pipeline/ingest"
	"github.com/onceflow/onceflow/pipeline/kafka"
	"github.com/onceflow/onceflow/pipeline/pipelinetest"
	"github.com/onceflow/onceflow/pipeline/postgres"
)

// The inventory (examples/inventory) as its users run it: the inventory
// binary's broker and components as separate processes, two processors
// (each runs both aggregate types' processors), one of them SIGKILLed and
// started again mid-run. Two tenants add stock and place orders over
// HTTP, some retried with the same key and some placed again with a new
// key, and orders straight to Kafka (some twice, some poison). Then each order is decided once, no item's stock goes negative,
// available plus reserved is what was added, every reservation is a
// confirmed order's, and the read models say what the events say.
func TestInventorySaga(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-process end-to-end test; skipped with -short")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	pool, url := pipelinetest.Pool(t, postgres.Migrations{Name: inventoryapp.Name, FS: inventoryapp.Migrations})
	pl := newPipeline(t, url)
	// The domain's own prefix (the checks read inventory.* by name), on an
	// external cluster too: newPipeline deletes its topics at the end.
	pl.App, pl.Prefix = "inventory", inventoryapp.Name
	if _, err := pl.StartBroker(ctx); err != nil {
		t.Fatal(err)
	}
	comps := map[string]*Component{}
	for _, in := range []struct{ kind, name string }{
		{"ingest", "ingest"}, {"relay", "relay"}, {"processor", "processor-1"}, {"processor", "processor-2"}, {"projector", "projector"},
	} {
		c, err := pl.StartComponent(ctx, in.kind, in.name, nil)
		if err != nil {
			t.Fatal(err)
		}
		comps[in.name] = c
	}
	var tenants []InventoryTenant
	for _, name := range []string{"acme", "globex"} {
		key := ingest.NewAPIKey()
		if err := ingest.CreateAPIKey(ctx, pool, name, "e2e", key); err != nil {
			t.Fatal(err)
		}
		tenants = append(tenants, InventoryTenant{Name: name, Key: key, Items: []string{"widget", "bolt", "nut"}})
	}
	reg, err := avro.NewClient(pl.RegistryURL)
	if err != nil {
		t.Fatal(err)
	}
	serdes, err := onceflow.NewSerdes(ctx, reg, inventoryapp.Domain(), "order", kafka.Topics{})
	if err != nil {
		t.Fatal(err)
	}
	producer := pipelinetest.Client(t, pl.Brokers())
	load := &InventoryLoad{
		Tenants: tenants, URLs: func() []string { return []string{comps["ingest"].HTTP} },
		HTTP: &http.Client{Timeout: 5 * time.Second}, Seed: 1,
		Producer: producer, Encode: serdes.Commands.Encode,
	}
	stop, stopLoad := context.WithTimeout(ctx, 12*time.Second)
	defer stopLoad()
	finish, stopFinish := context.WithTimeout(ctx, time.Minute)
	defer stopFinish()
	killed := make(chan error, 1)
	go func() {
		time.Sleep(4 * time.Second)
		comps["processor-1"].Kill()
		_, err := pl.StartComponent(ctx, "processor", "processor-1", nil)
		killed <- err
	}()
	load.Run(stop, finish, 4)
	if err := <-killed; err != nil {
		t.Fatalf("restart processor-1: %v", err)
	}
	for _, e := range load.M.Errs {
		t.Error(e)
	}
	if n := load.M.Abandoned.Load(); n > 0 {
		t.Fatalf("%d requests unanswered within a minute", n)
	}
	pipelinetest.Eventually(t, 90*time.Second, func() error { return InventoryDecided(ctx, pool, &load.M) })

	st, vs := CheckInventoryEvents(ctx, pipelinetest.Client(t, pl.Brokers()), serdes.Events.Decode, &load.M)
	if st != nil {
		vs = append(vs, CheckInventoryReadModels(ctx, pool, st, &load.M)...)
		t.Log(st.Summary(), fmt.Sprintf("; %d requests, %d retries, %d replays, %d orders placed again, %d produced to Kafka (%d twice)", load.M.Requests.Load(), load.M.Retries.Load(), load.M.Replays.Load(), len(load.M.Again), load.M.Produced.Load(), load.M.Twice.Load()))
		if st.Confirmed == 0 || st.Reasons[inventory.ReasonInsufficientStock] == 0 || st.Reasons[inventory.ReasonUnknownItem] == 0 {
			vs = append(vs, "the run did not exercise every outcome: "+st.Summary())
		}
	}
	for _, v := range vs {
		t.Error(v)
	}
}
