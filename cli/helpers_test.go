package cli_test

import (
	"context"
	"io"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/onceflow/onceflow"
	"github.com/onceflow/onceflow/cli"
	"github.com/onceflow/onceflow/examples/ledger"
	"github.com/onceflow/onceflow/examples/ledger/accounts"
	"github.com/onceflow/onceflow/examples/ledger/ledgerapp"
	"github.com/onceflow/onceflow/pipeline"
	"github.com/onceflow/onceflow/pipeline/avro"
	"github.com/onceflow/onceflow/pipeline/kafka"
	"github.com/onceflow/onceflow/pipeline/postgres"
	"github.com/onceflow/onceflow/pipeline/projector"
)

// run runs a command of the ledger's binary, as cmd/onceflow does.
func run(ctx context.Context, args []string, getenv func(string) string, stdout io.Writer) error {
	return cli.Run(ctx, []*onceflow.Domain{ledgerapp.Domain()}, args, getenv, stdout)
}

// ledgerSerdes are the ledger's serdes over an embedded registry, with
// the ids the CLI's embedded registry gives.
func ledgerSerdes(t testing.TB, topics kafka.Topics) onceflow.Serdes {
	t.Helper()
	s, err := onceflow.NewSerdes(context.Background(), avro.NewEmbedded(), ledgerapp.Domain(), "", topics)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// ledgerMigrations are the ledger's read model's: the accounts table.
var ledgerMigrations = postgres.Migrations{Name: ledgerapp.Name, FS: accounts.Migrations}

// ledgerProjections are the read models the ledger's projector applies.
func ledgerProjections() []pipeline.Projection[pgx.Tx] {
	return []pipeline.Projection[pgx.Tx]{accounts.Projection{}, projector.CommandStatus{CommandTypeOf: ledger.CommandTypeOf}, projector.AuditLog{}}
}

// commandNames are the commands the usage lists.
func commandNames(t *testing.T) []string {
	t.Helper()
	var out strings.Builder
	if err := run(context.Background(), nil, func(string) string { return "" }, &out); err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, line := range strings.Split(out.String(), "\n") {
		if name, _, ok := strings.Cut(strings.TrimPrefix(line, "  "), "  "); ok && strings.HasPrefix(line, "  ") {
			names = append(names, strings.TrimSpace(name))
		}
	}
	if len(names) < 10 {
		t.Fatalf("the usage lists %d commands:\n%s", len(names), out.String())
	}
	return names
}
