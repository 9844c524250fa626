package command

// Tenants: their API keys, and the Idempotency-Keys they sent.

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/onceflow/onceflow"
	"github.com/onceflow/onceflow/pipeline/ingest"
)

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
	pool, err := c.connect(ctx)
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
	tw := table(stdout, "ID\tTENANT\tNAME\tCREATED\tREVOKED")
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

// runIdempotencyCheck is the view an operator needs when a client
// misbehaves: how many keys a tenant used, and which keys came back, as
// retries (replays: normal) or reused for another request (conflicts: a
// client bug).
func runIdempotencyCheck(ctx context.Context, domains []*onceflow.Domain, args []string, getenv func(string) string, stdout io.Writer) error {
	var tenant string
	var hours float64
	var limit int
	c, _, err := parse("idempotency-check", domains, args, getenv, stdout, func(fs *flag.FlagSet) {
		fs.StringVar(&tenant, "tenant", "", "the tenant (required)")
		fs.Float64Var(&hours, "hours", 24, "look at keys created in the last H hours")
		fs.IntVar(&limit, "limit", 20, "list at most this many keys")
	})
	if err != nil {
		return err
	}
	switch {
	case tenant == "":
		return fmt.Errorf("usage: onceflow idempotency-check --tenant T [--hours H] [--limit N]")
	case hours <= 0 || limit < 0:
		return fmt.Errorf("--hours must be positive and --limit not negative")
	}
	pool, err := c.connect(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	r, err := ingest.CheckKeys(ctx, pool, tenant, time.Duration(hours*float64(time.Hour)), limit)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "tenant %s, keys created in the last %sh: %d keys, %d replays, %d conflicts\n",
		r.Tenant, strconv.FormatFloat(hours, 'f', -1, 64), r.Keys, r.Replays, r.Conflicts)
	if len(r.Top) == 0 {
		return nil
	}
	fmt.Fprintln(stdout)
	tw := table(stdout, "KEY\tREPLAYS\tCONFLICTS\tLAST SEEN (UTC)\tCREATED (UTC)\tROUTE\tCOMMAND\tSTATUS")
	for _, a := range r.Top {
		last := "-"
		if !a.LastSeen.IsZero() {
			last = a.LastSeen.UTC().Format(time.DateTime)
		}
		status := a.Status
		if status == "" {
			status = "-"
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%s\t%s\t%s\t%s\t%s\n", cellText(a.Key), a.Replays, a.Conflicts, last,
			a.CreatedAt.UTC().Format(time.DateTime), a.Route, a.CommandID, status)
	}
	return tw.Flush()
}
