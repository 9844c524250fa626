package status_test

import (
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/onceflow/onceflow/pipeline/admin"
	"github.com/onceflow/onceflow/pipeline/admin/status"
)

// The audit of an admin action records who the token proves, not the
// name the caller sends: a skip with the shared operator token is
// recorded as done by admin-token, the name in the body kept, quoted, as
// what the caller says (a newline in it cannot start a line of its own).
func TestSkipRecordsTheTokensIdentity(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	adm := admin.New("", reg, slog.New(slog.DiscardHandler))
	adm.SetToken("op-token")
	recorded := make(chan string, 1)
	page, err := status.New(status.Config{Gatherer: reg, SkipBatch: func(_ context.Context, _ string, _ int32, offset int64, _, operator string) (int64, error) {
		recorded <- operator
		return offset + 1, nil
	}})
	if err != nil {
		t.Fatal(err)
	}
	page.Register(adm)
	srv := httptest.NewServer(adm.Handler())
	t.Cleanup(srv.Close)
	for _, tc := range []struct{ body, want string }{
		{`{"topic":"ledger.commands","partition":0,"offset":7,"note":"zeros","operator":"alice\nroot"}`, `admin-token (operator says "alice\nroot")`},
		{`{"topic":"ledger.commands","partition":0,"offset":7,"note":"zeros"}`, admin.TokenIdentity},
	} {
		if code, body := post(t, srv.URL+"/status/skip-batch", "Bearer op-token", tc.body); code != http.StatusOK {
			t.Fatalf("skip %s: %d %s", tc.body, code, body)
		}
		if got := <-recorded; got != tc.want {
			t.Errorf("skip %s recorded as done by %q, want %q", tc.body, got, tc.want)
		}
	}
}
