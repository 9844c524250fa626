package inventoryapp_test

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"io"
	"log/slog"
	"net/http"
	"os"
	"testing"
	"time"

	"github.com/onceflow/onceflow"
	"github.com/onceflow/onceflow/examples/inventory"
	"github.com/onceflow/onceflow/examples/inventory/inventoryapp"
	"github.com/onceflow/onceflow/pipeline/apiclient"
	"github.com/onceflow/onceflow/pipeline/ingest"
	"github.com/onceflow/onceflow/pipeline/kafka"
	"github.com/onceflow/onceflow/pipeline/pipelinetest"
	"github.com/onceflow/onceflow/pipeline/postgres"
)

var update = flag.Bool("update", false, "write openapi.json from the routes")

// openapi.json is the document the inventory's ingest serves:
// `go test ./examples/inventory/inventoryapp -update` writes it again.
func TestOpenAPIDocumentIsCurrent(t *testing.T) {
	got, err := ingest.OpenAPI(inventoryapp.Routes(), inventoryapp.Queries())
	if err != nil {
		t.Fatal(err)
	}
	got = append(got, '\n')
	if *update {
		if err := os.WriteFile("openapi.json", got, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile("openapi.json")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatal("openapi.json is not the document the routes make: run go test ./examples/inventory/inventoryapp -update")
	}
}

// stack runs every component of the inventory in this process against a
// broker of its own and a database deployed with least privilege (the
// owner migrates, the runtime role serves, so row-level security holds),
// and returns ingest's base URL and the owner's and the runtime role's URLs.
func stack(t *testing.T) (base, ownerURL, runtimeURL string) {
	t.Helper()
	owner, runtime := pipelinetest.LeastPrivilege(t, postgres.Migrations{Name: inventoryapp.Name, FS: inventoryapp.Migrations})
	brokers := pipelinetest.Broker(t).Addrs()
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	ctx, cancel := context.WithCancel(context.Background())
	addrs := make(chan onceflow.Addrs, 1)
	done := make(chan error, 1)
	go func() {
		done <- onceflow.RunComponents(ctx, onceflow.RunConfig{
			Config: onceflow.Config{
				Domains:              []*onceflow.Domain{inventoryapp.Domain()},
				Kafka:                kafka.Config{Brokers: brokers, Logger: logger},
				Topics:               kafka.Topics{Partitions: 2},
				DatabaseURL:          runtime,
				DatabaseMigrationURL: owner,
				Logger:               logger,
			},
			Components: onceflow.All,
			HTTPAddr:   "127.0.0.1:0", AdminAddr: "127.0.0.1:0",
			Started: func(a onceflow.Addrs) { addrs <- a },
		})
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
			t.Errorf("stack: %v", err)
		}
	})
	select {
	case a := <-addrs:
		base = "http://" + a.HTTP
	case err := <-done:
		done <- err // for the cleanup
		t.Fatalf("stack stopped: %v", err)
	case <-time.After(60 * time.Second):
		t.Fatal("stack did not start")
	}
	return base, owner, runtime
}

func tenantClient(t *testing.T, ownerURL, base, tenant string) inventoryapp.Client {
	t.Helper()
	pool, err := postgres.Connect(context.Background(), ownerURL, 2)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	key := ingest.NewAPIKey()
	if err := ingest.CreateAPIKey(context.Background(), pool, tenant, "test", key); err != nil {
		t.Fatal(err)
	}
	return inventoryapp.Client{Client: &apiclient.Client{BaseURL: base, APIKey: key}}
}

// The demo passes against the whole stack: the saga confirms and rejects
// orders across the two aggregate types, and the joined read model shows
// each order with its reservation. Another tenant sees none of it.
func TestDemoAndTenantScope(t *testing.T) {
	base, owner, runtime := stack(t)
	acme := tenantClient(t, owner, base, "acme")
	var out bytes.Buffer
	if err := inventoryapp.RunDemo(context.Background(), acme.Client, &out); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	t.Logf("demo:\n%s", out.String())

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, _, err := acme.AddStock(ctx, "s-1", "bolt", 4); err != nil {
		t.Fatal(err)
	}
	if _, _, err := acme.PlaceOrder(ctx, "p-1", "ord-1", "bolt", 3); err != nil {
		t.Fatal(err)
	}
	o, err := acme.WaitOrder(ctx, "ord-1")
	if err != nil || o.Status != inventory.StatusConfirmed || o.Reserved != 3 {
		t.Fatalf("ord-1: %+v, %v; want confirmed with 3 reserved", o, err)
	}

	// Another tenant: the same ids name nothing of acme's.
	globex := tenantClient(t, owner, base, "globex")
	if _, err := globex.Order(ctx, "ord-1"); !apiclient.IsStatus(err, http.StatusNotFound) {
		t.Errorf("globex reads acme's order: %v, want 404", err)
	}
	if _, err := globex.Item(ctx, "bolt"); !apiclient.IsStatus(err, http.StatusNotFound) {
		t.Errorf("globex reads acme's item: %v, want 404", err)
	}
	// Its order for "bolt" names its own bolt, which has no stock.
	if _, _, err := globex.PlaceOrder(ctx, "p-1", "ord-1", "bolt", 1); err != nil {
		t.Fatal(err)
	}
	if o, err := globex.WaitOrder(ctx, "ord-1"); err != nil || o.Status != inventory.StatusRejected || o.Reason != inventory.ReasonUnknownItem {
		t.Fatalf("globex's ord-1: %+v, %v; want rejected (unknown_item)", o, err)
	}
	if it, err := acme.Item(ctx, "bolt"); err != nil || it.Available != 1 || it.Reserved != 3 {
		t.Fatalf("acme's bolt: %+v, %v; want 1 available, 3 reserved", it, err)
	}

	// Row-level security holds behind a query that forgot its tenant: a
	// transaction of the runtime role scoped to globex, as ingest's reads
	// are, counts only globex's rows (one rejected order, no item, no
	// reservation), however many acme has.
	pool, err := postgres.Connect(ctx, runtime, 1)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, `SELECT set_config($1, 'globex', true)`, ingest.TenantSetting); err != nil {
		t.Fatal(err)
	}
	var items, reservations, orders int
	if err := tx.QueryRow(ctx, `SELECT (SELECT count(*) FROM inventory_items), (SELECT count(*) FROM inventory_reservations), (SELECT count(*) FROM inventory_orders)`).Scan(&items, &reservations, &orders); err != nil {
		t.Fatal(err)
	}
	if items != 0 || reservations != 0 || orders != 1 {
		t.Errorf("scoped to globex without a tenant predicate: %d items, %d reservations, %d orders; want 0, 0, 1", items, reservations, orders)
	}
}
