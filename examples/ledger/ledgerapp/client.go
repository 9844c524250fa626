package ledgerapp

import (
	"context"
	"net/url"

	"github.com/onceflow/onceflow/examples/ledger/accounts"
	"github.com/onceflow/onceflow/pipeline/apiclient"
)

// Client is the ledger's routes over an apiclient.Client.
type Client struct{ *apiclient.Client }

// OpenAccount is POST /v1/accounts.
func (c Client) OpenAccount(ctx context.Context, idemKey, accountID, currency string) (apiclient.Accepted, *apiclient.Response, error) {
	return c.Post(ctx, "/v1/accounts", idemKey, map[string]string{"account_id": accountID, "currency": currency})
}

// Deposit is POST /v1/accounts/{id}/deposits.
func (c Client) Deposit(ctx context.Context, idemKey, accountID string, amount int64) (apiclient.Accepted, *apiclient.Response, error) {
	return c.Post(ctx, "/v1/accounts/"+url.PathEscape(accountID)+"/deposits", idemKey, map[string]int64{"amount": amount})
}

// Withdraw is POST /v1/accounts/{id}/withdrawals.
func (c Client) Withdraw(ctx context.Context, idemKey, accountID string, amount int64) (apiclient.Accepted, *apiclient.Response, error) {
	return c.Post(ctx, "/v1/accounts/"+url.PathEscape(accountID)+"/withdrawals", idemKey, map[string]int64{"amount": amount})
}

// Transfer is POST /v1/transfers: amount from one account of the tenant to
// another.
func (c Client) Transfer(ctx context.Context, idemKey, transferID, from, to string, amount int64) (apiclient.Accepted, *apiclient.Response, error) {
	return c.Post(ctx, "/v1/transfers", idemKey, map[string]any{"transfer_id": transferID, "from": from, "to": to, "amount": amount})
}

// Close is POST /v1/accounts/{id}/close.
func (c Client) Close(ctx context.Context, idemKey, accountID string) (apiclient.Accepted, *apiclient.Response, error) {
	return c.Post(ctx, "/v1/accounts/"+url.PathEscape(accountID)+"/close", idemKey, struct{}{})
}

// Account is GET /v1/accounts/{id}.
func (c Client) Account(ctx context.Context, accountID string) (accounts.Account, error) {
	var a accounts.Account
	err := c.Get(ctx, "/v1/accounts/"+url.PathEscape(accountID), &a)
	return a, err
}
