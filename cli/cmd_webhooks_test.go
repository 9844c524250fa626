package cli_test

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/onceflow/onceflow/examples/ledger"
	"github.com/onceflow/onceflow/pipeline"
	"github.com/onceflow/onceflow/pipeline/jobs"
	"github.com/onceflow/onceflow/pipeline/pipelinetest"
	"github.com/onceflow/onceflow/pipeline/webhooks"
)

// `onceflow webhooks list|deliveries|redeliver` and `onceflow jobs list`
// show what the projector enqueued and the worker's fan-out made of it (a
// delivery the address guard refused: a literal loopback address, never
// dialled); bad arguments end non-zero with a message.
func TestWebhooksCommands(t *testing.T) {
	t.Parallel()
	pool, url := pipelinetest.Pool(t, ledgerMigrations)
	ctx := context.Background()
	sub, _, err := webhooks.Create(ctx, pool, "acme", "k1", "http://127.0.0.1:1/hooks", []string{"Deposited"})
	if err != nil {
		t.Fatal(err)
	}
	// A second subscription (to another type): acme's events are fanned
	// out by the worker, not made inline.
	if _, _, err := webhooks.Create(ctx, pool, "acme", "k2", "http://127.0.0.1:1/opened", []string{"AccountOpened"}); err != nil {
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
	reg, err := webhooks.Register(webhooks.Config{}, nil, prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	w, err := jobs.New(jobs.Config{FetchPollInterval: 100 * time.Millisecond}, pool, reg, nil, prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	wctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- w.Run(wctx) }()
	t.Cleanup(func() { stop(); <-done })
	pipelinetest.Eventually(t, 30*time.Second, func() error {
		var status, state string
		err := pool.QueryRow(ctx, `SELECT d.status, j.state::text FROM webhook_deliveries d JOIN river_job j ON j.id = d.job_id
			WHERE d.event_id = $1`, [16]byte(ev.ID)).Scan(&status, &state)
		if err == nil && (status != "dead" || state != "cancelled") {
			err = fmt.Errorf("the delivery is %s, its job %s, want dead and cancelled (the guard refuses loopback)", status, state)
		}
		return err
	})
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
		{[]string{"webhooks", "list", "-tenant", "acme"}, []string{sub.ID.String(), "http://127.0.0.1:1/hooks", "Deposited", "enabled", "closed"}},
		{[]string{"webhooks", "deliveries", "-tenant", "acme", "-status", "dead"}, []string{ev.ID.String(), "Deposited", "dead", key, "address-not-allowed"}},
		{[]string{"jobs", "list", "-kind", "webhook_fanout"}, []string{"webhook_fanout", "completed", "1/10", jobs.Key(ev.ID, "webhooks"), "1 deliveries of 1 events"}},
		{[]string{"jobs", "list", "-kind", "webhook_delivery"}, []string{"webhook_delivery", "cancelled", "1/10", key}},
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
	// A tenant at its cap of deliveries in flight (as the worker records
	// it) is told so under its subscriptions; below the cap nothing is.
	if out, _ := cmd("webhooks", "list", "-tenant", "acme"); strings.Contains(out, "CAPPED") {
		t.Errorf("webhooks list says capped below the cap:\n%s", out)
	}
	if _, err := pool.Exec(ctx, `INSERT INTO webhook_capped (tenant, since, seen_at, in_flight, max_pending)
		VALUES ('acme', now() - interval '1 minute', now(), 1000, 1000)`); err != nil {
		t.Fatal(err)
	}
	if out, err := cmd("webhooks", "list", "-tenant", "acme"); err != nil || !strings.Contains(out, "CAPPED since") ||
		!strings.Contains(out, "1000 deliveries in flight, at most 1000") {
		t.Errorf("webhooks list at the cap: %v\n%s", err, out)
	}
	if out, _ := cmd("webhooks", "list", "-tenant", "globex"); strings.Contains(out, "CAPPED") {
		t.Errorf("another tenant is told of acme's cap:\n%s", out)
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
