package onceflow

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/riverqueue/river"

	"github.com/onceflow/onceflow/examples/ledger"
	"github.com/onceflow/onceflow/examples/ledger/accounts"
	"github.com/onceflow/onceflow/pipeline"
	"github.com/onceflow/onceflow/pipeline/jobs"
	"github.com/onceflow/onceflow/pipeline/pipelinetest"
	"github.com/onceflow/onceflow/pipeline/postgres"
	"github.com/onceflow/onceflow/pipeline/webhooks"
)

// tenantCall is the test's domain job: its Work calls url and completes
// with an update that names no tenant.
type tenantCall struct {
	Key string `json:"key" river:"unique"`
}

func (tenantCall) Kind() string     { return "tenant_call" }
func (c tenantCall) JobKey() string { return c.Key }

// A domain's job runs as its event's tenant and calls out as a webhook
// does: JobAttempt.Tenant is the event's, Complete's transaction is
// scoped to it (an update with no tenant predicate, run by the runtime
// role under row-level security, changes that tenant's accounts only; it
// changed every tenant's), and its call goes through the worker's address
// guard (a receiver on loopback is refused unless
// ONCEFLOW_WEBHOOK_ALLOW_NETWORKS allows it; the job's client reached
// any address).
func TestDomainJobRunsAsItsTenantBehindTheGuard(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	owner, runtime := pipelinetest.LeastPrivilege(t, postgres.Migrations{Name: "ledger", FS: accounts.Migrations})
	admin, err := postgres.Connect(ctx, owner, 2)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(admin.Close)
	if _, err := admin.Exec(ctx, `INSERT INTO accounts (tenant, account_id, currency, balance, version, updated_at)
		VALUES ('acme', 'acc-1', 'EUR', 0, 1, now()), ('globex', 'acc-1', 'EUR', 0, 1, now())`); err != nil {
		t.Fatal(err)
	}
	pool, err := postgres.Connect(ctx, runtime, 10)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)

	var calls atomic.Int32
	rcv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		w.WriteHeader(http.StatusNoContent)
	}))
	t.Cleanup(rcv.Close)

	type outcome struct {
		tenant string
		err    error
	}
	done := make(chan outcome, 10)
	kind := Job[tenantCall]{
		MaxAttempts: 1,
		Enqueue: func(_ context.Context, _ pgx.Tx, ev pipeline.Event) ([]tenantCall, error) {
			return []tenantCall{{Key: JobKey(ev.ID, "call")}}, nil
		},
		Work: func(ctx context.Context, a *JobAttempt[tenantCall]) error {
			req, err := http.NewRequestWithContext(ctx, http.MethodPost, rcv.URL, nil)
			if err != nil {
				return err
			}
			resp, err := a.Call(ctx, req)
			if err != nil {
				done <- outcome{a.Tenant, err}
				return pipeline.Permanent(err)
			}
			resp.Body.Close()
			err = a.Complete(ctx, func(tx pgx.Tx) error {
				_, err := tx.Exec(ctx, `UPDATE accounts SET balance = balance + 1`)
				return err
			})
			done <- outcome{a.Tenant, err}
			return err
		},
	}
	dep := &Deployment{Domains: []*DeployedDomain{{Domain: &Domain{Name: "calls", Jobs: []JobKind{kind}}}}}
	wcfg := jobs.Config{FetchPollInterval: 100 * time.Millisecond}
	reg := prometheus.NewRegistry()
	proj, err := jobProjections(dep.Domains[0], wcfg, reg)
	if err != nil {
		t.Fatal(err)
	}
	run := func(allow ...netip.Prefix) (stop func()) {
		w, err := jobs.New(wcfg, pool, func(w *jobs.Worker, ws *river.Workers) error {
			return dep.registerJobs(w, ws, webhooks.Guard{Allow: allow}.Client(0))
		}, nil, prometheus.NewRegistry())
		if err != nil {
			t.Fatal(err)
		}
		wctx, cancel := context.WithCancel(ctx)
		stopped := make(chan error, 1)
		go func() { stopped <- w.Run(wctx) }()
		<-w.Ready()
		return func() { cancel(); <-stopped }
	}
	enqueue := func() outcome {
		t.Helper()
		ev := pipeline.Event{ID: pipeline.NewCommandID(), CommandID: pipeline.NewCommandID(), Tenant: "acme",
			AggregateID: "acme/acc-1", Version: 2, Time: time.Now(), Payload: ledger.Deposited{Amount: 1}}
		if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return proj[0].Apply(ctx, tx, ev) }); err != nil {
			t.Fatal(err)
		}
		select {
		case o := <-done:
			return o
		case <-time.After(30 * time.Second):
			t.Fatal("the job did not run within 30s")
		}
		panic("unreachable")
	}

	// The guard's default refuses loopback: the call is not made.
	stop := run()
	if o := enqueue(); !errors.Is(o.err, webhooks.ErrForbiddenAddress) || calls.Load() != 0 {
		t.Fatalf("a job's call to loopback without the allow-list: %v, %d calls; want it refused", o.err, calls.Load())
	}
	stop()

	// Allowed, it is made, and the completion is acme's alone.
	defer run(netip.MustParsePrefix("127.0.0.0/8"))()
	o := enqueue()
	if o.err != nil || o.tenant != "acme" || calls.Load() == 0 {
		t.Fatalf("the allowed job: tenant %q, %v, %d calls; want acme, completed, called", o.tenant, o.err, calls.Load())
	}
	balances := map[string]int64{}
	rows, _ := admin.Query(ctx, `SELECT tenant, balance FROM accounts`)
	var tenant string
	var balance int64
	if _, err := pgx.ForEachRow(rows, []any{&tenant, &balance}, func() error { balances[tenant] = balance; return nil }); err != nil {
		t.Fatal(err)
	}
	if balances["acme"] != 1 || balances["globex"] != 0 {
		t.Errorf("balances after acme's job's completion: %v, want acme 1 and globex untouched", balances)
	}
}
