package onceflow_test

import (
	"context"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/onceflow/onceflow"
	"github.com/onceflow/onceflow/onceflowtest"
	"github.com/onceflow/onceflow/pipeline/pipelinetest"
)

// A process's connections say in pg_stat_activity which components it
// runs (application_name "onceflow worker"), so an operator can tell whose
// a lock, a long query or an idle transaction is; a name given in
// DATABASE_URL wins.
func TestConnectionsNamedByComponents(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, url := pipelinetest.Pool(t, ledgerMigrations)
	for _, tc := range []struct{ url, want string }{
		{url, "onceflow worker"},
		{url + "&application_name=billing-worker", "billing-worker"},
	} {
		_, stop := onceflowtest.Components(t, onceflow.RunConfig{
			Config: onceflow.Config{
				Domains:     []*onceflow.Domain{ledgerWithGroup("appname")},
				DatabaseURL: tc.url, Logger: slog.New(slog.DiscardHandler), InstanceID: "appname",
			},
			Components: onceflow.Components{Worker: true},
			LagExport:  onceflow.LagExportOff,
		})
		pipelinetest.Eventually(t, 10*time.Second, func() error {
			var names []string
			err := pool.QueryRow(ctx, `SELECT coalesce(array_agg(DISTINCT application_name), '{}') FROM pg_stat_activity
				WHERE datname = current_database() AND pid <> pg_backend_pid() AND application_name <> ''`).Scan(&names)
			if err != nil {
				return err
			}
			if len(names) != 1 || names[0] != tc.want {
				return fmt.Errorf("the process's connections are named %q, want only %q", names, tc.want)
			}
			return nil
		})
		stop()
	}
}
