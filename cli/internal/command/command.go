// Package command is onceflow's command line itself: the commands (every
// component, `dev`, the operator commands docs/architecture.md#operator-cli
// lists) and their settings. Every setting is an environment variable with
// a flag of the same meaning, the flag winning
// (docs/architecture.md#configuration), declared once in settings.go; each
// command reads, and lists in its -h, the settings it uses.
//
// Its two doors are package cli (Main: every command, and `dev` with the
// embedded broker, which cli gives it as RunDev) and package cli/component
// (a binary of one component, which links no embedded broker). It imports
// package onceflow, which imports the library (pipeline/...), in that
// direction only (TestImportRules).
package command

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"text/tabwriter"

	"github.com/onceflow/onceflow"
)

// Main is cli.Main: the main of a binary that runs domains, every command
// of Run. The binary's name prefixes its errors.
func Main(domains ...*onceflow.Domain) {
	mainWith(filepath.Base(os.Args[0]), func(ctx context.Context, args []string, getenv func(string) string, stdout io.Writer) error {
		return Run(ctx, domains, args, getenv, stdout)
	})
}

// ComponentMain is component.Main: the main of a binary that runs
// components of domains (cmd/ingest and the others), Main's `ingest`,
// `relay`, `processor`, `projector`, `worker` or `natsink` as a binary of
// its own, named name.
func ComponentMain(name string, components onceflow.Components, domains ...*onceflow.Domain) {
	mainWith(name, func(ctx context.Context, args []string, getenv func(string) string, stdout io.Writer) error {
		c := componentCommand(name, components)
		return c.run(ctx, domains, args, getenv, stdout)
	})
}

// mainWith is the main of every onceflow binary: run gets a context that
// ends on SIGINT or SIGTERM, the arguments and the environment. An error
// is printed after name and exits 1; -h exits 0 after the usage.
func mainWith(name string, run func(ctx context.Context, args []string, getenv func(string) string, stdout io.Writer) error) {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Getenv, os.Stdout)
	stop()
	switch {
	case errors.Is(err, flag.ErrHelp):
		os.Exit(0)
	case err != nil:
		fmt.Fprintln(os.Stderr, name+":", err)
		os.Exit(1)
	}
}

// runFunc is a subcommand: the deployment's domains, its arguments, the
// environment and where it prints.
type runFunc func(ctx context.Context, domains []*onceflow.Domain, args []string, getenv func(string) string, stdout io.Writer) error

// command is one subcommand.
type command struct {
	name    string // "tenants keys create"
	title   string // what its -h calls it; default "onceflow " + name
	summary string // one line, in the list of commands
	// args is what follows the flags in its usage line ("NAME"); a command
	// without takes no arguments.
	args string
	// settings are the settings it reads and lists in -h (settings.go).
	settings []*setting
	// more, if set, is printed in -h after the usage line.
	more string
	run  runFunc
}

// commands are the subcommands by name ("topics create"): the operator
// commands' table is commands.go, the components' and dev's components.go.
var commands = map[string]*command{}

func register(c *command) {
	if _, dup := commands[c.name]; dup {
		panic("onceflow: command registered twice: " + c.name)
	}
	commands[c.name] = c
}

// Run runs the command args names (Main's arguments) for domains. A word
// that only begins commands ("webhooks") lists them.
func Run(ctx context.Context, domains []*onceflow.Domain, args []string, getenv func(string) string, stdout io.Writer) error {
	for n := 3; n >= 1; n-- {
		if len(args) >= n {
			if c, ok := commands[strings.Join(args[:n], " ")]; ok {
				return c.run(ctx, domains, args[n:], getenv, stdout)
			}
		}
	}
	known := knownWords(args)
	usage(stdout, known)
	rest := args[len(strings.Fields(known)):]
	if len(rest) == 0 || isHelp(rest[0]) {
		return nil
	}
	if known != "" {
		return fmt.Errorf("unknown %q command", known)
	}
	return errors.New("unknown command")
}

func isHelp(arg string) bool {
	return arg == "help" || arg == "-h" || arg == "--help" || arg == "-help"
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

// usage lists the commands under prefix (every command when it is empty).
func usage(w io.Writer, prefix string) {
	var names []string
	for n := range commands {
		if prefix == "" || strings.HasPrefix(n, prefix+" ") {
			names = append(names, n)
		}
	}
	sort.Strings(names)
	what := strings.TrimSpace("onceflow " + prefix)
	fmt.Fprintf(w, "usage: %s COMMAND [flags]   (%s COMMAND -h for its flags)\n\n", what, what)
	for _, n := range names {
		fmt.Fprintf(w, "  %-20s %s\n", strings.TrimPrefix(n, prefix+" "), commands[n].summary)
	}
}

// parse parses a command's arguments: its own flags (own) and the
// settings it uses, which it returns read into a config.
func (c *command) parse(domains []*onceflow.Domain, args []string, getenv func(string) string, stdout io.Writer, own func(*flag.FlagSet)) (*config, *flag.FlagSet, error) {
	title := c.title
	if title == "" {
		title = "onceflow " + c.name
	}
	fs := flag.NewFlagSet(title, flag.ContinueOnError)
	fs.SetOutput(stdout)
	if own != nil {
		own(fs)
	}
	ownFlags := map[string]bool{}
	fs.VisitAll(func(f *flag.Flag) { ownFlags[f.Name] = true })
	ss := define(fs, c.settings, getenv)
	fs.Usage = func() { c.printUsage(stdout, title, fs, ownFlags, ss) }
	if err := fs.Parse(args); err != nil {
		return nil, fs, err
	}
	fs.Visit(func(f *flag.Flag) {
		for _, s := range c.settings {
			if s.flag == f.Name {
				ss.given[s] = true
			}
		}
	})
	if c.args == "" && fs.NArg() > 0 {
		return nil, fs, fmt.Errorf("unexpected arguments: %v", fs.Args())
	}
	cfg := &config{getenv: getenv, stdout: stdout}
	cfg.Domains = domains
	return cfg, fs, ss.apply(cfg)
}

// printUsage is a command's -h: its usage line, its own flags, then the
// settings it reads, by section.
func (c *command) printUsage(w io.Writer, title string, fs *flag.FlagSet, own map[string]bool, ss *settingsSet) {
	line := "usage: " + title
	if len(own) > 0 || len(c.settings) > 0 {
		line += " [flags]"
	}
	if c.args != "" {
		line += " " + c.args
	}
	fmt.Fprintln(w, line)
	if c.summary != "" {
		fmt.Fprintln(w, c.summary)
	}
	if c.more != "" {
		fmt.Fprintln(w, c.more)
	}
	var subs []string
	for n := range commands {
		if strings.HasPrefix(n, c.name+" ") {
			subs = append(subs, n)
		}
	}
	if len(subs) > 0 {
		sort.Strings(subs)
		fmt.Fprintln(w, "\nCommands:")
		for _, n := range subs {
			fmt.Fprintf(w, "  %-20s %s\n", strings.TrimPrefix(n, c.name+" "), commands[n].summary)
		}
	}
	if len(own) > 0 {
		fmt.Fprintln(w, "\nFlags:")
		only := flag.NewFlagSet(title, flag.ContinueOnError)
		only.SetOutput(w)
		fs.VisitAll(func(f *flag.Flag) {
			if own[f.Name] {
				only.Var(f.Value, f.Name, f.Usage)
			}
		})
		only.PrintDefaults()
	}
	if len(c.settings) > 0 {
		fmt.Fprintln(w, "\nSettings (each also an environment variable; the flag wins):")
		printSettings(w, c.settings, ss.texts)
	}
}

// table returns the writer of an operator command's table, its columns
// two spaces apart, with header (tab-separated) written; Flush it.
func table(w io.Writer, header string) *tabwriter.Writer {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, header)
	return tw
}
