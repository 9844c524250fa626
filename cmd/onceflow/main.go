// Command onceflow is the operator CLI (DESIGN §11) and the embedded
// default: `onceflow dev` runs a Kafka-compatible broker, a schema registry
// and all four components in one process.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"sort"
	"strings"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Getenv, os.Stdout); err != nil {
		if !errors.Is(err, flag.ErrHelp) {
			fmt.Fprintln(os.Stderr, "onceflow:", err)
		}
		os.Exit(1)
	}
}

// command is one subcommand.
type command struct {
	usage string
	run   func(ctx context.Context, args []string, getenv func(string) string, stdout io.Writer) error
}

var commands = map[string]command{
	"dev":             {"run the embedded default: broker, registry, Postgres and all four components", runDev},
	"demo":            {"drive a scripted workload against a running ingest and check the balances", runDemo},
	"migrate":         {"apply the Postgres migrations", runMigrate},
	"topics create":   {"create the topics (cleanup policies, retention, partitions) and check them", runTopicsCreate},
	"tenants create":  {"create a tenant's API key and print it once: tenants create NAME", runTenantsCreate},
	"postgres up":     {"start (or reuse) the private Postgres cluster and print its URL", runPostgresUp},
	"postgres down":   {"stop the private Postgres cluster", runPostgresDown},
	"tenants revoke":  {"revoke an API key at once: tenants revoke KEY", runTenantsRevoke},
	"migrate version": {"print the database's migration version and the newest this binary has", runMigrateVersion},
}

func run(ctx context.Context, args []string, getenv func(string) string, stdout io.Writer) error {
	for n := 2; n >= 1; n-- {
		if len(args) >= n {
			if c, ok := commands[strings.Join(args[:n], " ")]; ok {
				return c.run(ctx, args[n:], getenv, stdout)
			}
		}
	}
	usage(stdout)
	if len(args) == 0 || args[0] == "help" || args[0] == "-h" || args[0] == "--help" {
		return nil
	}
	return fmt.Errorf("unknown command %q", strings.Join(args, " "))
}

func usage(w io.Writer) {
	names := make([]string, 0, len(commands))
	for n := range commands {
		names = append(names, n)
	}
	sort.Strings(names)
	fmt.Fprintln(w, "usage: onceflow COMMAND [flags]   (onceflow COMMAND -h for its flags)")
	fmt.Fprintln(w)
	for _, n := range names {
		fmt.Fprintf(w, "  %-16s %s\n", n, commands[n].usage)
	}
}
