// Package ingesttest runs ingest in the library's tests: the ledger's
// command routes and its account query (the domain of examples/ledger,
// with its read model examples/ledger/accounts, without the application
// that plugs it into onceflow), and a server on a loopback port until the
// test ends.
package ingesttest

import (
	"context"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/onceflow/onceflow/examples/ledger"
	"github.com/onceflow/onceflow/examples/ledger/accounts"
	"github.com/onceflow/onceflow/pipeline"
	"github.com/onceflow/onceflow/pipeline/ingest"
)

// LedgerRoutes are the ledger's command routes with the names its
// requests are hashed with, their commands to topic through enc.
func LedgerRoutes(topic string, enc ingest.Encoder) []ingest.Route {
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

// LedgerQueries are the ledger's read routes: GET /v1/accounts/{id}.
func LedgerQueries() []ingest.Query {
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

// Serve runs srv on a loopback port until the test ends, or stop; it
// returns the server's base URL.
func Serve(t testing.TB, srv *ingest.Server) (url string, stop func()) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx, ln) }()
	stop = sync.OnceFunc(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("ingest: %v", err)
		}
	})
	t.Cleanup(stop)
	return "http://" + ln.Addr().String(), stop
}
