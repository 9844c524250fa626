package apiclient_test

// The ledger's routes as ingest's types: the fixture these tests post
// commands through (examples/ledger's types, its read model
// examples/ledger/accounts). It is here, with the tests that use it, and
// not in a helper package: the library imports no domain (TestImportRules).

import (
	"context"
	"net/http"
	"strings"

	"github.com/onceflow/onceflow/examples/ledger"
	"github.com/onceflow/onceflow/examples/ledger/accounts"
	"github.com/onceflow/onceflow/pipeline"
	"github.com/onceflow/onceflow/pipeline/ingest"
)

// ledgerRoutes are the ledger's command routes with the names its
// requests are hashed with, their commands to topic through enc.
func ledgerRoutes(topic string, enc ingest.Encoder) []ingest.Route {
	route := func(pattern string, cmd pipeline.Message, name string) ingest.Route {
		r := ingest.Route{Pattern: pattern, Command: cmd, Name: name, Topic: topic, Encoder: enc}
		if strings.Contains(pattern, "{id}") {
			r.PathID = "id"
		}
		return r
	}
	open, transfer := route("POST /v1/accounts", ledger.OpenAccount{}, "open_account"), route("POST /v1/transfers", ledger.RequestTransfer{}, "transfer")
	open.BodyID, transfer.BodyID = "account_id", "from"
	transfer.Check = func(from string, cmd pipeline.Message) []pipeline.FieldError {
		if t := cmd.(ledger.RequestTransfer); from != "" && t.To == from {
			return []pipeline.FieldError{{Field: "to", Message: "must differ from from"}}
		}
		return nil
	}
	return []ingest.Route{open,
		route("POST /v1/accounts/{id}/deposits", ledger.Deposit{}, "deposit"),
		route("POST /v1/accounts/{id}/withdrawals", ledger.Withdraw{}, "withdraw"),
		route("POST /v1/accounts/{id}/close", ledger.CloseAccount{}, "close"),
		transfer}
}

// ledgerQueries are the ledger's read routes: GET /v1/accounts/{id}.
func ledgerQueries() []ingest.Query {
	return []ingest.Query{{
		Pattern: "GET /v1/accounts/{id}", Response: accounts.Account{},
		Get: func(ctx context.Context, db ingest.DB, tenant string, r *http.Request) (any, error) {
			a, found, err := accounts.Get(ctx, db, tenant, r.PathValue("id"))
			if err == nil && !found {
				return nil, ingest.ErrNotFound
			}
			return a, err
		},
	}}
}
