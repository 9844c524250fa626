package cli_test

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"slices"
	"strings"
	"testing"

	"github.com/twmb/franz-go/pkg/kadm"

	"github.com/onceflow/onceflow"
	"github.com/onceflow/onceflow/cli"
	"github.com/onceflow/onceflow/examples/inventory/inventoryapp"
	"github.com/onceflow/onceflow/examples/ledger/ledgerapp"
	"github.com/onceflow/onceflow/onceflowtest"
	"github.com/onceflow/onceflow/pipeline/apiclient"
	"github.com/onceflow/onceflow/pipeline/ingest"
	"github.com/onceflow/onceflow/pipeline/kafka"
	"github.com/onceflow/onceflow/pipeline/pipelinetest"
	"github.com/onceflow/onceflow/pipeline/postgres"
)

// Two domains in one deployment: one process runs the ledger and the
// inventory (one ingest with both domains' routes, one relay for the
// outbox they share, a processor per aggregate type, a projector per
// domain), each domain on its own topics and consumer groups, each
// domain's projector on its own events topic only; both demos pass.
func TestTwoDomainsOneDeployment(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	brokers := pipelinetest.Broker(t).Addrs()
	pool, url := pipelinetest.Pool(t, ledgerMigrations, postgres.Migrations{Name: inventoryapp.Name, FS: inventoryapp.Migrations})
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	a, _ := onceflowtest.Components(t, onceflow.RunConfig{
		Config: onceflow.Config{
			Domains:     []*onceflow.Domain{ledgerapp.Domain(), inventoryapp.Domain()},
			Kafka:       kafka.Config{Brokers: brokers, Logger: logger},
			Topics:      kafka.Topics{Partitions: 2},
			DatabaseURL: url,
			Logger:      logger,
		},
		Components: onceflow.All,
	})
	base := "http://" + a.HTTP
	key := ingest.NewAPIKey()
	if err := ingest.CreateAPIKey(ctx, pool, "acme", "test", key); err != nil {
		t.Fatal(err)
	}
	api := &apiclient.Client{BaseURL: base, APIKey: key}
	for name, demo := range map[string]func(context.Context, *apiclient.Client, io.Writer) error{
		"ledger": ledgerapp.RunDemo, "inventory": inventoryapp.RunDemo,
	} {
		var out bytes.Buffer
		if err := demo(ctx, api, &out); err != nil {
			t.Fatalf("the %s demo: %v\n%s", name, err, out.String())
		}
	}

	adm := kadm.NewClient(pipelinetest.Client(t, brokers))
	topics, err := adm.ListTopics(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"ledger.commands", "ledger.events", "ledger.state",
		"inventory.item.commands", "inventory.item.state", "inventory.order.commands", "inventory.order.state", "inventory.events"} {
		if !topics.Has(want) {
			t.Errorf("no topic %s; the topics are %v", want, topics.Names())
		}
	}
	groups, err := adm.ListGroups(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"onceflow-processor", "onceflow-processor-inventory.item", "onceflow-processor-inventory.order"} {
		if !slices.Contains(groups.Groups(), want) {
			t.Errorf("no processor group %s; the groups are %v", want, groups.Groups())
		}
	}
	// Each domain's projector stored offsets of its own events topic only.
	rows, err := pool.Query(ctx, `SELECT DISTINCT consumer, topic FROM consumer_offsets ORDER BY 1, 2`)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for rows.Next() {
		var consumer, topic string
		if err := rows.Scan(&consumer, &topic); err != nil {
			t.Fatal(err)
		}
		got = append(got, consumer+" "+topic)
	}
	if want := []string{"onceflow-projector ledger.events", "onceflow-projector-inventory inventory.events"}; !slices.Equal(got, want) {
		t.Errorf("projector offsets: got %v, want %v", got, want)
	}
	// Each read model holds its own domain's rows.
	var accounts, orders int
	if err := pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM accounts), (SELECT count(*) FROM inventory_orders)`).Scan(&accounts, &orders); err != nil {
		t.Fatal(err)
	}
	if accounts != 2 || orders != 5 {
		t.Errorf("read models: %d accounts and %d orders, want 2 and 5", accounts, orders)
	}

	// The operator commands of a binary of both domains know both: the
	// projections of each, and a rebuild of one domain's read model from
	// its own events topic.
	env := map[string]string{"KAFKA_BROKERS": brokers[0], "DATABASE_URL": url}
	cli := func(args ...string) string {
		t.Helper()
		var out bytes.Buffer
		if err := cli.Run(ctx, []*onceflow.Domain{ledgerapp.Domain(), inventoryapp.Domain()}, args, func(k string) string { return env[k] }, &out); err != nil {
			t.Fatalf("%v: %v\n%s", args, err, out.String())
		}
		return out.String()
	}
	list := cli("projections", "list")
	for _, want := range []string{"ledger     accounts", "inventory  inventory_orders", "inventory  inventory_items"} {
		if !strings.Contains(list, want) {
			t.Errorf("projections list lacks %q:\n%s", want, list)
		}
	}
	if out := cli("projections", "rebuild", "inventory_orders"); !strings.Contains(out, "inventory_orders: swapped") {
		t.Errorf("rebuild inventory_orders:\n%s", out)
	}
	var decided int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM inventory_orders WHERE status <> 'placed'`).Scan(&decided); err != nil || decided != 5 {
		t.Errorf("after the rebuild: %d decided orders (%v), want 5", decided, err)
	}
}
