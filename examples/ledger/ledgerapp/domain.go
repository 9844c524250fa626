// Package ledgerapp plugs the ledger (package ledger: its commands,
// events, state and decider) into onceflow: the aggregate type with its
// schemas, the accounts read model (package accounts), the HTTP routes
// and the demo. The binaries in cmd/ run it with cli.Main; it uses
// only onceflow's public API, as any team's domain does
// (docs/your-first-domain.md).
package ledgerapp

import (
	"context"
	"net/http"

	"github.com/jackc/pgx/v5"

	"github.com/onceflow/onceflow"
	"github.com/onceflow/onceflow/examples/ledger"
	"github.com/onceflow/onceflow/examples/ledger/accounts"
	"github.com/onceflow/onceflow/pipeline"
)

// Name is the ledger domain's name: its topic prefix and the name of its
// set of migrations (goose_db_version_ledger).
const Name = "ledger"

// Domain returns the ledger domain. Its names are the ones the ledger had
// before domains were declared (processor group onceflow-processor,
// projector onceflow-projector), so running deployments keep their
// offsets.
func Domain() *onceflow.Domain {
	return &onceflow.Domain{
		Name:          Name,
		Events:        onceflow.Schema{Avro: ledger.EventsSchema, Types: messages(ledger.EventTypes())},
		Aggregates:    []onceflow.AggregateType{AccountType()},
		Projections:   []pipeline.Projection[pgx.Tx]{accounts.Projection{}},
		Migrations:    accounts.Migrations,
		Routes:        Routes(),
		Queries:       Queries(),
		Consumer:      "onceflow-projector",
		CommandTypeOf: ledger.CommandTypeOf,
		Demo:          RunDemo,
	}
}

// AccountType is the ledger's one aggregate type, the account.
func AccountType() onceflow.Aggregate[ledger.Account] {
	return onceflow.Aggregate[ledger.Account]{
		Name:     "account",
		Decider:  ledger.NewDecider(),
		Commands: onceflow.Schema{Avro: ledger.CommandsSchema, Types: messages(ledger.CommandTypes())},
		State:    ledger.AccountSchema,
		Group:    "onceflow-processor",
	}
}

// messages lists a type map's Go types.
func messages(types map[string]any) []pipeline.Message {
	out := make([]pipeline.Message, 0, len(types))
	for _, t := range types {
		if m, ok := t.(pipeline.Message); ok && m.MessageType() != "CommandRejected" && m.MessageType() != "CommandFailed" {
			out = append(out, m)
		}
	}
	return out
}

// Routes are the ledger's command routes (docs/ingest.md). Their names
// are the ones the ledger's requests were hashed with before routes were
// declared, so a retry of a request accepted before keeps matching it.
func Routes() []onceflow.Route {
	return []onceflow.Route{
		{Pattern: "POST /v1/accounts", Command: ledger.OpenAccount{}, BodyID: "account_id", Name: "open_account",
			Summary: "Open an account", Description: "Opens the account `account_id` in `currency`; opening it again is rejected (`already_open`)."},
		{Pattern: "POST /v1/accounts/{id}/deposits", Command: ledger.Deposit{}, PathID: "id", Name: "deposit",
			Summary: "Deposit into an account", Description: "Adds `amount` to the account's balance."},
		{Pattern: "POST /v1/accounts/{id}/withdrawals", Command: ledger.Withdraw{}, PathID: "id", Name: "withdraw",
			Summary: "Withdraw from an account", Description: "Takes `amount` from the balance; rejected (`insufficient_funds`) when it would overdraw."},
		{Pattern: "POST /v1/accounts/{id}/close", Command: ledger.CloseAccount{}, PathID: "id", Name: "close",
			Summary: "Close an account", Description: "Closes the account; rejected unless its balance is zero."},
		{Pattern: "POST /v1/transfers", Command: ledger.RequestTransfer{}, BodyID: "from", Name: "transfer",
			Summary: "Transfer between two accounts", Description: "Debits `from` and credits `to` (same tenant), or refunds `from` when `to` cannot accept.",
			Check: func(from string, cmd pipeline.Message) []pipeline.FieldError {
				if t := cmd.(ledger.RequestTransfer); from != "" && t.To == from {
					return []pipeline.FieldError{{Field: "to", Message: "must differ from from"}}
				}
				return nil
			}},
	}
}

// Queries are the ledger's read routes.
func Queries() []onceflow.Query { return []onceflow.Query{accountQuery} }

var accountQuery = onceflow.Query{
	Pattern: "GET /v1/accounts/{id}", Response: accounts.Account{}, Summary: "An account's balance",
	Description: "The account as the projector last saw it. Another tenant's account, or an id that names nothing, is a 404.",
	Get: func(ctx context.Context, db onceflow.DB, tenant string, r *http.Request) (any, error) {
		a, found, err := accounts.Get(ctx, db, tenant, r.PathValue("id"))
		if err == nil && !found {
			return nil, onceflow.ErrNotFound
		}
		return a, err
	},
}
