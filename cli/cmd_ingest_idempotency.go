package cli

import (
	"context"
	"flag"
	"fmt"
	"io"
	"strconv"
	"text/tabwriter"
	"time"

	"github.com/onceflow/onceflow"
	"github.com/onceflow/onceflow/pipeline/ingest"
	"github.com/onceflow/onceflow/pipeline/postgres"
)

func init() {
	register(&command{name: "idempotency-check", summary: "a tenant's Idempotency-Keys: replays and conflicts per key, most active first: idempotency-check --tenant T --hours H",
		settings: use([]*setting{databaseURL}), run: runIdempotencyCheck})
}

// runIdempotencyCheck is the view an operator needs when a client
// misbehaves: how many keys a tenant used, and which keys came back, as
// retries (replays: normal) or reused for another request (conflicts: a
// client bug).
func runIdempotencyCheck(ctx context.Context, domains []*onceflow.Domain, args []string, getenv func(string) string, stdout io.Writer) error {
	var tenant string
	var hours float64
	var limit int
	c, fs, err := parse("idempotency-check", domains, args, getenv, stdout, func(fs *flag.FlagSet) {
		fs.StringVar(&tenant, "tenant", "", "the tenant (required)")
		fs.Float64Var(&hours, "hours", 24, "look at keys created in the last H hours")
		fs.IntVar(&limit, "limit", 20, "list at most this many keys")
	})
	if err != nil {
		return err
	}
	switch {
	case fs.NArg() > 0:
		return fmt.Errorf("unexpected arguments: %v", fs.Args())
	case tenant == "":
		return fmt.Errorf("usage: onceflow idempotency-check --tenant T [--hours H] [--limit N]")
	case hours <= 0 || limit < 0:
		return fmt.Errorf("--hours must be positive and --limit not negative")
	case c.DatabaseURL == "":
		return fmt.Errorf("DATABASE_URL is required")
	}
	pool, err := postgres.Connect(ctx, c.DatabaseURL, 2)
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
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "KEY\tREPLAYS\tCONFLICTS\tLAST SEEN (UTC)\tCREATED (UTC)\tROUTE\tCOMMAND\tSTATUS")
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
