// Package cli is onceflow's command line: cli.Main makes a binary of a
// team's domains (every component, `dev`, and the operator commands
// docs/architecture.md#operator-cli lists), and cli.ComponentMain a binary
// of one component. It reads the configuration every onceflow binary
// shares (docs/architecture.md#configuration): each setting is an
// environment variable with a flag of the same meaning; the flag wins.
//
// It sits above the domain API: cmd/* imports it, it imports package
// onceflow, which imports the library (pipeline/...), in that direction
// only (TestImportRules).
package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/onceflow/onceflow"
)

// Main is the main of a binary that runs domains: the operator CLI
// (docs/architecture.md#operator-cli), each component (`ingest`, `relay`,
// `processor`, `projector`, or `run` for several) and the embedded default,
// `dev`: a Kafka-compatible broker, a schema registry, Postgres and every
// component in one process. The binary's name prefixes its errors.
func Main(domains ...*onceflow.Domain) {
	mainWith(filepath.Base(os.Args[0]), func(ctx context.Context, args []string, getenv func(string) string, stdout io.Writer) error {
		return Run(ctx, domains, args, getenv, stdout)
	})
}

// runFunc is a subcommand: the deployment's domains, its arguments, the
// environment and where it prints.
type runFunc func(ctx context.Context, domains []*onceflow.Domain, args []string, getenv func(string) string, stdout io.Writer) error

// command is one subcommand.
type command struct {
	usage string
	run   runFunc
}

// commands are the subcommands by name ("topics create"). Each file of
// this package registers its own in an init function.
var commands = map[string]command{}

func register(name, usage string, run runFunc) {
	if _, dup := commands[name]; dup {
		panic("onceflow: command registered twice: " + name)
	}
	commands[name] = command{usage, run}
}

// Run runs the command args names (Main's arguments) for domains.
func Run(ctx context.Context, domains []*onceflow.Domain, args []string, getenv func(string) string, stdout io.Writer) error {
	for n := 3; n >= 1; n-- {
		if len(args) >= n {
			if c, ok := commands[strings.Join(args[:n], " ")]; ok {
				return c.run(ctx, domains, args[n:], getenv, stdout)
			}
		}
	}
	usage(stdout)
	if len(args) == 0 || args[0] == "help" || args[0] == "-h" || args[0] == "--help" {
		return nil
	}
	if w := knownWords(args); w != "" {
		return fmt.Errorf("unknown %q command", w)
	}
	return errors.New("unknown command")
}

// knownWords returns the longest run of args' first words that begins some
// command ("tenants keys"), or "". The error names that much and nothing
// after it: the rest of the line may be a secret typed in the wrong place.
func knownWords(args []string) string {
	known := ""
	for n := 1; n <= len(args); n++ {
		prefix := strings.Join(args[:n], " ")
		for name := range commands {
			if strings.HasPrefix(name, prefix+" ") {
				known = prefix
				break
			}
		}
		if known != prefix {
			break
		}
	}
	return known
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
		fmt.Fprintf(w, "  %-20s %s\n", n, commands[n].usage)
	}
}
