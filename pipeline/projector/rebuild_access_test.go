package projector_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/onceflow/onceflow/examples/ledger"
	"github.com/onceflow/onceflow/examples/ledger/accounts"
	"github.com/onceflow/onceflow/pipeline"
	"github.com/onceflow/onceflow/pipeline/kafka"
	"github.com/onceflow/onceflow/pipeline/pipelinetest"
	"github.com/onceflow/onceflow/pipeline/postgres"
	"github.com/onceflow/onceflow/pipeline/projector"
)

// tableAccess is what a rebuild must keep of a table besides its rows.
type tableAccess struct {
	Owner          string
	RLS, ForcedRLS bool
	Policies       []string // name: command, expression
	RuntimePrivs   []string
}

func accessOf(t *testing.T, pool *pgxpool.Pool, table string) tableAccess {
	t.Helper()
	ctx := context.Background()
	var a tableAccess
	if err := pool.QueryRow(ctx, `SELECT pg_get_userbyid(relowner), relrowsecurity, relforcerowsecurity FROM pg_class WHERE oid = $1::regclass`, table).
		Scan(&a.Owner, &a.RLS, &a.ForcedRLS); err != nil {
		t.Fatal(err)
	}
	rows, err := pool.Query(ctx, `SELECT polname || ': ' || polcmd::text || ' ' || coalesce(pg_get_expr(polqual, polrelid), '') || ' / ' || coalesce(pg_get_expr(polwithcheck, polrelid), '')
		FROM pg_policy WHERE polrelid = $1::regclass ORDER BY 1`, table)
	if err != nil {
		t.Fatal(err)
	}
	if a.Policies, err = pgx.CollectRows(rows, pgx.RowTo[string]); err != nil {
		t.Fatal(err)
	}
	rows, err = pool.Query(ctx, `SELECT privilege_type FROM information_schema.role_table_grants
		WHERE table_name = $1 AND grantee = 'onceflow_runtime' ORDER BY 1`, table)
	if err != nil {
		t.Fatal(err)
	}
	if a.RuntimePrivs, err = pgx.CollectRows(rows, pgx.RowTo[string]); err != nil {
		t.Fatal(err)
	}
	return a
}

// A rebuild swaps in tables it made (CREATE TABLE ... LIKE), which would
// come without the live tables' row-level security and grants: the
// rebuilt accounts and command_status keep their owner, their forced
// tenant policy and the runtime role's privileges, so the live projector,
// running as the runtime role, goes on writing them, and a read scoped to
// a tenant still sees only that tenant's rows.
func TestRebuildKeepsAccess(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newEnv(t, 2)
	ownerURL, runtimeURL := pipelinetest.LeastPrivilege(t, ledgerMigrations)
	owner, err := postgres.Connect(ctx, ownerURL, 4)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(owner.Close)
	rt, err := postgres.Connect(ctx, runtimeURL, 8)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(rt.Close)
	e.pool = rt // the live projector is a component: the runtime role

	at := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	opened := func(tenant string, v int64, m pipeline.Message) pipeline.Event {
		agg, cmd := pipeline.AggregateID(tenant, "acc"), pipeline.NewCommandID()
		return pipeline.Event{ID: pipeline.EventID(agg, cmd, 0), CommandID: cmd, Tenant: tenant, AggregateID: agg,
			Version: v, Time: at.Add(time.Duration(v) * time.Second), Payload: m}
	}
	e.emit(opened("a", 1, ledger.AccountOpened{Currency: "EUR"}), opened("b", 1, ledger.AccountOpened{Currency: "EUR"}))
	r := e.start(projector.Config{})
	defer r.stop()
	e.waitOffsets(projector.DefaultConsumer, e.endOffsets(), 30*time.Second)

	tables := []string{"accounts", "command_status"}
	before := map[string]tableAccess{}
	for _, table := range tables {
		before[table] = accessOf(t, owner, table)
		if a := before[table]; !a.RLS || !a.ForcedRLS || len(a.Policies) != 1 || len(a.RuntimePrivs) != 4 {
			t.Fatalf("%s before the rebuild: %+v, want a forced tenant policy and four privileges of the runtime role", table, a)
		}
	}
	for _, p := range []pipeline.Projection[pgx.Tx]{accounts.Projection{}, projector.CommandStatus{}} {
		rb, err := projector.NewRebuild(projector.RebuildConfig{Topic: e.topics.Events(), Projection: p, MaxPollRecords: 3},
			kafka.Config{Brokers: e.brokers}, owner, e.serde, quietLogger())
		if err != nil {
			t.Fatal(err)
		}
		if _, err := rb.Run(ctx); err != nil {
			t.Fatalf("rebuild %s: %v", p.Name(), err)
		}
	}
	for _, table := range tables {
		if got := accessOf(t, owner, table); !slices.Equal(got.Policies, before[table].Policies) || got.Owner != before[table].Owner ||
			got.RLS != before[table].RLS || got.ForcedRLS != before[table].ForcedRLS || !slices.Equal(got.RuntimePrivs, before[table].RuntimePrivs) {
			t.Errorf("%s after the rebuild: %+v, want %+v", table, got, before[table])
		}
	}

	// The live projector writes the rebuilt tables as the runtime role.
	e.emit(opened("a", 2, ledger.Deposited{Amount: 5}))
	e.waitOffsets(projector.DefaultConsumer, e.endOffsets(), 30*time.Second)
	if b, v, err := e.balance("a", "acc"); err != nil || b != 5 || v != 2 {
		t.Errorf("a's account after the rebuild: balance %d version %d (%v), want 5 at 2", b, v, err)
	}
	// A read scoped to a, without a tenant predicate.
	for _, table := range tables {
		var seen []string
		err := pgx.BeginFunc(ctx, rt, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, `SELECT set_config('onceflow.tenant', 'a', true)`); err != nil {
				return err
			}
			rows, err := tx.Query(ctx, `SELECT DISTINCT tenant FROM `+table)
			if err != nil {
				return err
			}
			seen, err = pgx.CollectRows(rows, pgx.RowTo[string])
			return err
		})
		if err != nil || !slices.Equal(seen, []string{"a"}) {
			t.Errorf("rebuilt %s scoped to a: saw tenants %v (%v), want [a]", table, seen, err)
		}
	}
}
