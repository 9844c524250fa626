package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"strconv"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/onceflow/onceflow"
	"github.com/onceflow/onceflow/pipeline/ingest"
	"github.com/onceflow/onceflow/pipeline/postgres"
)

// API keys are managed by id. No command takes a key as an argument: one
// typed on a command line stays in the shell's history and in every
// process listing (docs/security.md).
func init() {
	register(&command{name: "tenants create", summary: "create a tenant's API key and print it once: tenants create [-name LABEL] TENANT", args: "TENANT",
		settings: use([]*setting{databaseURL}), run: tenantsKeysCreate("tenants create")})
	register(&command{name: "tenants keys create", summary: "create another API key for a tenant and print it once: tenants keys create [-name LABEL] TENANT", args: "TENANT",
		settings: use([]*setting{databaseURL}), run: tenantsKeysCreate("tenants keys create")})
	register(&command{name: "tenants keys list", summary: "list API keys by id (never the keys): tenants keys list [-tenant TENANT]",
		settings: use([]*setting{databaseURL}), run: runTenantsKeysList})
	register(&command{name: "tenants keys revoke", summary: "revoke an API key by id, at once: tenants keys revoke ID", args: "ID",
		settings: use([]*setting{databaseURL}), run: runTenantsKeysRevoke})
}

// keysCommand parses the flags of the keys command called name (own),
// checks that it has want arguments and that check (if set) accepts them,
// and only then connects to the database.
func keysCommand(ctx context.Context, name string, want int, args []string, getenv func(string) string, stdout io.Writer,
	own func(*flag.FlagSet), check func([]string) error) (*pgxpool.Pool, []string, error) {
	c, fs, err := parse(name, nil, args, getenv, stdout, own)
	if err != nil {
		return nil, nil, err
	}
	if fs.NArg() != want {
		usage := "onceflow " + name
		if own != nil {
			usage += " [flags]"
		}
		if a := commands[name].args; a != "" {
			usage += " " + a
		}
		return nil, nil, errors.New("usage: " + usage)
	}
	if check != nil {
		if err := check(fs.Args()); err != nil {
			return nil, nil, err
		}
	}
	if c.DatabaseURL == "" {
		return nil, nil, errors.New("DATABASE_URL is required")
	}
	pool, err := postgres.Connect(ctx, c.DatabaseURL, 2)
	return pool, fs.Args(), err
}

// tenantsKeysCreate is `tenants create` and `tenants keys create`, by
// command.
func tenantsKeysCreate(command string) runFunc {
	return func(ctx context.Context, domains []*onceflow.Domain, args []string, getenv func(string) string, stdout io.Writer) error {
		return runTenantsKeysCreate(ctx, command, args, getenv, stdout)
	}
}

func runTenantsKeysCreate(ctx context.Context, command string, args []string, getenv func(string) string, stdout io.Writer) error {
	name := "onceflow tenants create"
	pool, rest, err := keysCommand(ctx, command, 1, args, getenv, stdout, func(fs *flag.FlagSet) {
		fs.StringVar(&name, "name", name, "a label for operators (which client holds the key)")
	}, nil)
	if err != nil {
		return err
	}
	defer pool.Close()
	id, key, err := ingest.IssueAPIKey(ctx, pool, rest[0], name)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "tenant %s\nkey id %d\napi key %s\n(shown once: only its hash is stored; revoke it with onceflow tenants keys revoke %d)\n",
		rest[0], id, key, id)
	return nil
}

func runTenantsKeysList(ctx context.Context, domains []*onceflow.Domain, args []string, getenv func(string) string, stdout io.Writer) error {
	var tenant string
	pool, _, err := keysCommand(ctx, "tenants keys list", 0, args, getenv, stdout, func(fs *flag.FlagSet) {
		fs.StringVar(&tenant, "tenant", "", "only this tenant's keys")
	}, nil)
	if err != nil {
		return err
	}
	defer pool.Close()
	keys, err := ingest.ListAPIKeys(ctx, pool, tenant)
	if err != nil {
		return err
	}
	tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tTENANT\tNAME\tCREATED\tREVOKED")
	for _, k := range keys {
		revoked := "-"
		if !k.RevokedAt.IsZero() {
			revoked = k.RevokedAt.UTC().Format(time.RFC3339)
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\n", k.ID, k.Tenant, k.Name, k.CreatedAt.UTC().Format(time.RFC3339), revoked)
	}
	return tw.Flush()
}

func runTenantsKeysRevoke(ctx context.Context, domains []*onceflow.Domain, args []string, getenv func(string) string, stdout io.Writer) error {
	var id int64
	pool, _, err := keysCommand(ctx, "tenants keys revoke", 1, args, getenv, stdout, nil, func(rest []string) error {
		var err error
		if id, err = strconv.ParseInt(rest[0], 10, 64); err != nil || id <= 0 {
			// Not echoed: it may be a key pasted where its id belongs.
			return errors.New("tenants keys revoke takes a key's id, a number from onceflow tenants keys list, never the key")
		}
		return nil
	})
	if err != nil {
		return err
	}
	defer pool.Close()
	k, err := ingest.RevokeAPIKeyByID(ctx, pool, id)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "revoked key %d of tenant %s (%s)\n", k.ID, k.Tenant, k.Name)
	return nil
}
