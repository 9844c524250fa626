package ingest_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/onceflow/onceflow/pipeline/ingest"
	"github.com/onceflow/onceflow/pipeline/pipelinetest"
	"github.com/onceflow/onceflow/pipeline/postgres"
)

// leastPrivilege is a database deployed with separate roles (the owner
// for fixtures, as operators and the projector would write them; ingest
// on the runtime role).
func leastPrivilege(t testing.TB) (owner, runtime *pgxpool.Pool) {
	t.Helper()
	ownerURL, runtimeURL := pipelinetest.LeastPrivilege(t, ledgerMigrations)
	var err error
	if owner, err = postgres.Connect(context.Background(), ownerURL, 4); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(owner.Close)
	if runtime, err = postgres.Connect(context.Background(), runtimeURL, 8); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(runtime.Close)
	return owner, runtime
}

// fixture is what one tenant of the matrix has: an account of its own
// name and one named like the other tenant's ("same"), the command that
// opened the first, and the Idempotency-Key and body it used.
type fixture struct {
	key, account, command, aggregate string
	webhook                          string // its webhook subscription's id
}

// commandRoutes builds each command route's request naming local as its
// aggregate (path or body), with the Idempotency-Key idem.
var commandRoutes = map[string]func(local, idem string) req{
	"POST /v1/accounts": func(l, k string) req {
		return req{path: "/v1/accounts", idemKey: k, body: `{"account_id":"` + l + `","currency":"EUR"}`}
	},
	"POST /v1/accounts/{id}/deposits": func(l, k string) req {
		return req{path: "/v1/accounts/" + l + "/deposits", idemKey: k, body: `{"amount":7}`}
	},
	"POST /v1/accounts/{id}/withdrawals": func(l, k string) req {
		return req{path: "/v1/accounts/" + l + "/withdrawals", idemKey: k, body: `{"amount":7}`}
	},
	"POST /v1/accounts/{id}/close": func(l, k string) req { return req{path: "/v1/accounts/" + l + "/close", idemKey: k} },
	"POST /v1/transfers": func(l, k string) req {
		return req{path: "/v1/transfers", idemKey: k, body: `{"transfer_id":"t","from":"` + l + `","to":"same","amount":7}`}
	},
}

// The tenant isolation matrix: every route of the server × both tenants
// as the caller × every kind of the other tenant's ids — its account id,
// its command id (alone, with ?wait=, with ?aggregate_id= naming either
// tenant's aggregate), its aggregate id, and its Idempotency-Keys reused
// with its very requests. A read never shows the other's data (404 with
// the body of an id that does not exist; an account named like the
// other's is the caller's own); a command with the other's ids is a new
// command of the caller's, never a replay of the other's; and the other's
// commands, keys and balances are untouched. Ingest runs as the runtime
// role, under row-level security; a route added to the server without a
// row here fails the test.
func TestTenantIsolationMatrix(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	owner, rt := leastPrivilege(t)
	s := startServer(t, rt, ingest.Config{})
	fx := map[string]*fixture{}
	for i, name := range []string{"a", "b"} {
		f := &fixture{key: tenant(t, owner, name), account: "acc-" + name, aggregate: name + "/acc-" + name}
		q := commandRoutes["POST /v1/accounts"](f.account, "open-"+name)
		q.apiKey = f.key
		f.command = acceptedID(t, s.do(t, q))
		// The projector's rows: each tenant's own account and its "same".
		for _, acc := range []struct {
			id      string
			balance int
		}{{f.account, 100 * (i + 1)}, {"same", i + 1}} {
			if _, err := owner.Exec(ctx, `INSERT INTO accounts (tenant, account_id, currency, balance, version, updated_at)
				VALUES ($1, $2, 'EUR', $3, 1, now())`, name, acc.id, acc.balance); err != nil {
				t.Fatal(err)
			}
		}
		r := s.do(t, req{method: http.MethodPost, path: "/v1/webhooks", apiKey: f.key, idemKey: "sub-" + name, body: `{"url":"https://example.com/` + name + `"}`})
		var sub struct{ ID string }
		if json.Unmarshal(r.Body, &sub); r.Status != http.StatusCreated || sub.ID == "" {
			t.Fatalf("tenant %s subscribes: got %s, want 201", name, r)
		}
		f.webhook = sub.ID
		fx[name] = f
	}
	webhookOf := func(tenant string) string {
		var st string
		if err := owner.QueryRow(ctx, `SELECT status || cardinality(secrets) || url FROM webhook_subscriptions WHERE tenant = $1`, tenant).Scan(&st); err != nil {
			t.Fatal(err)
		}
		return st
	}
	webhooksBefore := map[string]string{"a": webhookOf("a"), "b": webhookOf("b")}
	type state struct{ outbox, keys, status int }
	stateOf := func(tenant string) (st state) {
		t.Helper()
		err := owner.QueryRow(ctx, `SELECT (SELECT count(*) FROM outbox WHERE convert_from(key, 'UTF8') LIKE $1 || '/%'),
			(SELECT count(*) FROM idempotency_keys WHERE tenant = $1), (SELECT count(*) FROM command_status WHERE tenant = $1)`, tenant).
			Scan(&st.outbox, &st.keys, &st.status)
		if err != nil {
			t.Fatal(err)
		}
		return st
	}
	before := map[string]state{"a": stateOf("a"), "b": stateOf("b")}

	covered := map[string]bool{}
	for _, pair := range [][2]string{{"a", "b"}, {"b", "a"}} {
		me, other := fx[pair[0]], fx[pair[1]]
		label := pair[0] + " with " + pair[1] + "'s"
		missing := s.do(t, req{method: http.MethodGet, path: "/v1/accounts/no-such-account", apiKey: me.key})
		notFound := func(what string, q req) {
			t.Helper()
			q.method, q.apiKey = http.MethodGet, me.key
			if r := s.do(t, q); r.Status != http.StatusNotFound || string(r.Body) != string(missing.Body) {
				t.Errorf("%s %s (%s): got %s, want 404 %s", label, what, q.path, r, missing)
			}
		}
		for _, route := range s.Routes() {
			switch route {
			case "GET /v1/accounts/{id}":
				notFound("account id", req{path: "/v1/accounts/" + other.account})
				var acc struct{ Balance int }
				r := s.do(t, req{method: http.MethodGet, path: "/v1/accounts/same", apiKey: me.key})
				if json.Unmarshal(r.Body, &acc); r.Status != http.StatusOK || acc.Balance != map[string]int{"a": 1, "b": 2}[pair[0]] {
					t.Errorf("%s: its own account named like the other's: got %s, want its own balance", label, r)
				}
			case "GET /v1/commands/{id}":
				for _, q := range []string{"", "?wait=50ms", "?aggregate_id=" + other.aggregate, "?aggregate_id=" + me.aggregate,
					"?aggregate_id=" + pair[0] + "/" + other.account, "?wait=50ms&aggregate_id=" + other.aggregate} {
					notFound("command id"+q, req{path: "/v1/commands/" + other.command + q})
				}
				// Its own command, named with the other's aggregate.
				notFound("aggregate id on its own command", req{path: "/v1/commands/" + me.command + "?aggregate_id=" + other.aggregate})
				if r, body := s.command(t, me.key, me.command, "?wait=50ms"); r.Status != http.StatusOK || body.AggregateID != me.aggregate {
					t.Errorf("%s: its own command: got %s", label, r)
				}
			case "POST /v1/webhooks":
				// The other's key with its very request: a subscription of
				// the caller's own, not the other's replayed.
				r := s.do(t, req{method: http.MethodPost, path: "/v1/webhooks", apiKey: me.key, idemKey: "sub-" + pair[1], body: `{"url":"https://example.com/` + pair[1] + `"}`})
				var sub struct{ ID string }
				if json.Unmarshal(r.Body, &sub); r.Status != http.StatusCreated || sub.ID == other.webhook || sub.ID == "" {
					t.Errorf("%s %s: got %s, want a new subscription of its own", label, route, r)
				}
				if r := s.do(t, req{method: http.MethodGet, path: "/v1/webhooks/" + sub.ID, apiKey: other.key}); r.Status != http.StatusNotFound {
					t.Errorf("%s %s: the other reads the caller's subscription: got %s", label, route, r)
				}
				if r := s.do(t, req{method: http.MethodDelete, path: "/v1/webhooks/" + sub.ID, apiKey: me.key}); r.Status != http.StatusNoContent {
					t.Errorf("%s %s: deleting its own: got %s, want 204", label, route, r)
				}
			case "GET /v1/webhooks":
				r := s.do(t, req{method: http.MethodGet, path: "/v1/webhooks", apiKey: me.key})
				if r.Status != http.StatusOK || strings.Contains(string(r.Body), other.webhook) || !strings.Contains(string(r.Body), me.webhook) {
					t.Errorf("%s %s: got %s, want its own subscription only", label, route, r)
				}
			case "GET /v1/webhooks/{id}", "DELETE /v1/webhooks/{id}", "POST /v1/webhooks/{id}/rotate", "DELETE /v1/webhooks/{id}/previous-secret",
				"POST /v1/webhooks/{id}/enable", "GET /v1/webhooks/{id}/deliveries":
				method, path, _ := strings.Cut(route, " ")
				path = strings.Replace(path, "{id}", other.webhook, 1)
				if r := s.do(t, req{method: method, path: path, apiKey: me.key}); r.Status != http.StatusNotFound {
					t.Errorf("%s %s with the other's subscription: got %s, want 404", label, route, r)
				}
			default:
				build, ok := commandRoutes[route]
				if !ok {
					t.Errorf("route %s is not in the isolation matrix", route)
					continue
				}
				// The other's aggregate and, for the route the other used,
				// its key and its very request.
				idem := fmt.Sprintf("%s-%s", pair[0], route)
				if route == "POST /v1/accounts" {
					idem = "open-" + pair[1] // the other's key, with its very request
				}
				q := build(other.account, idem)
				q.apiKey = me.key
				r := s.do(t, q)
				id := acceptedID(t, r)
				if r.Header.Get("Idempotent-Replayed") != "" || id == other.command {
					t.Errorf("%s %s: answered with the other's command", label, route)
				}
				if r, body := s.command(t, me.key, id, ""); r.Status != http.StatusOK || !strings.HasPrefix(body.AggregateID, pair[0]+"/") {
					t.Errorf("%s %s: the command is not the caller's: %s", label, route, r)
				}
				if r := s.do(t, req{method: http.MethodGet, path: "/v1/commands/" + id, apiKey: other.key}); r.Status != http.StatusNotFound {
					t.Errorf("%s %s: the other reads the caller's new command: got %s, want 404", label, route, r)
				}
			}
			covered[route] = true
		}
		// The other's state is what it was, whatever the caller sent.
		if got := stateOf(pair[1]); got != before[pair[1]] {
			t.Errorf("after %s requests: the other's outbox, keys and statuses are %+v, want %+v", label, got, before[pair[1]])
		}
		var balance int
		if err := owner.QueryRow(ctx, `SELECT balance FROM accounts WHERE tenant = $1 AND account_id = $2`, pair[1], other.account).Scan(&balance); err != nil ||
			balance != map[string]int{"a": 100, "b": 200}[pair[1]] {
			t.Errorf("after %s requests: the other's balance is %d (%v)", label, balance, err)
		}
		if got := webhookOf(pair[1]); got != webhooksBefore[pair[1]] {
			t.Errorf("after %s requests: the other's subscription is %s, want %s", label, got, webhooksBefore[pair[1]])
		}
		before[pair[0]] = stateOf(pair[0])
	}
	if len(covered) != len(s.Routes()) || !covered["GET /v1/commands/{id}"] {
		t.Errorf("covered %v of %v", covered, s.Routes())
	}
}

// Defence in depth behind the queries' own tenant predicate: ingest reads
// in a transaction scoped to the caller's tenant, so a query that forgot
// its predicate (as these two do) still shows the caller only its own
// rows, under the runtime role.
func TestReadsAreScopedByRowLevelSecurity(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	owner, rt := leastPrivilege(t)
	list := func(sql string) func(ctx context.Context, db ingest.DB, tenant string, r *http.Request) (any, error) {
		return func(ctx context.Context, db ingest.DB, tenant string, r *http.Request) (any, error) {
			rows, err := db.Query(ctx, sql) // no tenant predicate: the bug the policy stands behind
			if err != nil {
				return nil, err
			}
			out, err := pgx.CollectRows(rows, pgx.RowTo[string])
			if errors.Is(err, pgx.ErrNoRows) || len(out) == 0 {
				return []string{}, err
			}
			return out, err
		}
	}
	s := startServer(t, rt, ingest.Config{},
		ingest.Query{Pattern: "GET /v1/debug/accounts", Response: []string{}, Get: list(`SELECT tenant || '/' || account_id FROM accounts ORDER BY 1`)},
		ingest.Query{Pattern: "GET /v1/debug/commands", Response: []string{}, Get: list(`SELECT aggregate_id FROM command_status ORDER BY 1`)},
		ingest.Query{Pattern: "GET /v1/debug/keys", Response: []string{}, Get: list(`SELECT tenant FROM api_keys ORDER BY 1`)},
	)
	keys := map[string]string{}
	for _, name := range []string{"a", "b"} {
		keys[name] = tenant(t, owner, name)
		acceptedID(t, s.do(t, req{path: "/v1/accounts", apiKey: keys[name], idemKey: "open", body: `{"account_id":"x","currency":"EUR"}`}))
		if _, err := owner.Exec(ctx, `INSERT INTO accounts (tenant, account_id, currency, version, updated_at) VALUES ($1, 'x', 'EUR', 1, now())`, name); err != nil {
			t.Fatal(err)
		}
	}
	for name, key := range keys {
		for path, want := range map[string][]string{
			"/v1/debug/accounts": {name + "/x"},
			"/v1/debug/commands": {name + "/x"},
			"/v1/debug/keys":     {name},
		} {
			r := s.do(t, req{method: http.MethodGet, path: path, apiKey: key})
			var got []string
			if err := json.Unmarshal(r.Body, &got); err != nil || r.Status != http.StatusOK || !slices.Equal(got, want) {
				t.Errorf("%s reading %s without a tenant predicate: got %s, want %v", name, path, r, want)
			}
		}
	}
}
