package cli_test

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/onceflow/onceflow/examples/ledger"
	"github.com/onceflow/onceflow/pipeline"
	"github.com/onceflow/onceflow/pipeline/jobs"
	"github.com/onceflow/onceflow/pipeline/pipelinetest"
	"github.com/onceflow/onceflow/pipeline/webhooks"
)

// `onceflow webhooks list|deliveries|redeliver` and `onceflow jobs list`
// show what the projector enqueued; bad arguments end non-zero with a
// message.
func TestWebhooksCommands(t *testing.T) {
	t.Parallel()
	pool, url := pipelinetest.Pool(t, ledgerMigrations)
	ctx := context.Background()
	sub, _, err := webhooks.Create(ctx, pool, "acme", "k1", "https://example.com/hooks", []string{"Deposited"})
	if err != nil {
		t.Fatal(err)
	}
	proj, err := jobs.NewProjection("webhooks", jobs.Config{}, webhooks.Router{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	ev := pipeline.Event{ID: pipeline.NameID(pipeline.NewCommandID(), []byte("0")), CommandID: pipeline.NewCommandID(), Tenant: "acme",
		AggregateID: "acme/acc-1", Version: 2, Time: time.Now(), Payload: ledger.Deposited{Amount: 5}}
	if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { _, err := proj.ApplyBatch(ctx, tx, []pipeline.Event{ev}); return err }); err != nil {
		t.Fatal(err)
	}
	getenv := func(k string) string {
		if k == "DATABASE_URL" {
			return url
		}
		return ""
	}
	cmd := func(args ...string) (string, error) {
		var out bytes.Buffer
		err := run(ctx, args, getenv, &out)
		return out.String(), err
	}
	key := jobs.Key(ev.ID, sub.ID.String())
	for _, tc := range []struct {
		args []string
		want []string
	}{
		{[]string{"webhooks", "list", "-tenant", "acme"}, []string{sub.ID.String(), "https://example.com/hooks", "Deposited", "enabled", "closed"}},
		{[]string{"webhooks", "deliveries", "-tenant", "acme", "-status", "pending"}, []string{ev.ID.String(), "Deposited", "pending", key}},
		{[]string{"jobs", "list", "-kind", "webhook_delivery"}, []string{"webhook_delivery", "available", "0/10", key}},
	} {
		out, err := cmd(tc.args...)
		if err != nil {
			t.Fatalf("%v: %v\n%s", tc.args, err, out)
		}
		for _, w := range tc.want {
			if !strings.Contains(out, w) {
				t.Errorf("%v lacks %q:\n%s", tc.args, w, out)
			}
		}
	}
	if out, _ := cmd("webhooks", "deliveries", "-tenant", "globex"); strings.Contains(out, ev.ID.String()) {
		t.Errorf("another tenant's deliveries show acme's:\n%s", out)
	}
	if out, err := cmd("webhooks", "redeliver", "-tenant", "acme", "-subscription", sub.ID.String(), "-event", ev.ID.String()); err != nil ||
		!strings.Contains(out, "redelivering 1") {
		t.Errorf("redeliver: %v\n%s", err, out)
	}
	for _, bad := range [][]string{
		{"webhooks", "deliveries"},
		{"webhooks", "deliveries", "-tenant", "acme", "-status", "lost"},
		{"webhooks", "redeliver", "-tenant", "acme", "-subscription", sub.ID.String()},
		{"webhooks", "redeliver", "-tenant", "acme", "-subscription", "nope", "-dead"},
		{"webhooks", "redeliver", "-tenant", "acme", "-subscription", sub.ID.String(), "-event", pipeline.NewCommandID().String()},
	} {
		if out, err := cmd(bad...); err == nil {
			t.Errorf("%v: no error\n%s", bad, out)
		}
	}
}
