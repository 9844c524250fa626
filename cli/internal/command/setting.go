package command

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/onceflow/onceflow"
	"github.com/onceflow/onceflow/pipeline/postgres"
)

// A setting is one configuration setting (docs/architecture.md#configuration),
// declared once in settings.go: its flag, its environment variable, its
// default, its help, and how its text becomes the typed configuration. A
// component on its own, the same component inside `dev` and an operator
// command read a setting through this one declaration; a command defines,
// reads and lists in its -h only the settings it uses.
type setting struct {
	flag string // the flag's name; empty for a variable alone (a key no command line may carry)
	env  string // the environment variable; empty for a flag alone
	def  string // the default, as text
	// kind names the value in -h ("duration", "int"); "bool" makes a flag
	// that needs no value.
	kind string
	help string
	// secret settings are never printed: -h says "(set)" instead of their
	// value, an error does not quote it, and the value may come from the
	// file env_FILE names (a container secret).
	secret  bool
	section *section
	// set parses v (the flag's, else the variable's, else def) into c.
	// Its error is reported after the variable's name and v.
	set func(c *config, v string) error
}

// A section is a heading of the settings in -h; its check, if set, runs
// once every setting of a command is set, when the command uses one of
// the section's settings (a bound between two settings, a value built
// from several).
type section struct {
	title string
	check func(c *config) error
}

// config is what a command's settings are read into: the typed
// configuration of every component and of `dev` (onceflow.DevConfig holds
// the RunConfig, which holds the Config), and what some settings need
// while they are read.
type config struct {
	onceflow.DevConfig
	logLevel, logFormat string // the logger is built from both
	// otlpEndpoint and otlpTracesEndpoint are where the spans go
	// (tracing.go).
	otlpEndpoint, otlpTracesEndpoint string
	given                            map[*setting]bool   // the settings given by their flag or variable, not defaulted
	getenv                           func(string) string // the inbound providers' secrets and the test hooks
	stdout                           io.Writer           // where the logger writes
}

// name is how errors and -h refer to s: its variable, or its flag.
func (s *setting) name() string {
	if s.env != "" {
		return s.env
	}
	return "-" + s.flag
}

// value is a setting's flag.Value: its text, from the flag once parsed.
type value struct {
	text   *string
	secret bool
	isBool bool
}

func (v value) String() string {
	if v.text == nil || v.secret {
		return ""
	}
	return *v.text
}

func (v value) Set(s string) error { *v.text = s; return nil }

func (v value) IsBoolFlag() bool { return v.isBool }

// settingsSet is a command's settings with their texts.
type settingsSet struct {
	list  []*setting
	texts map[*setting]*string
	given map[*setting]bool // by their variable (by their flag: once parsed)
	errs  []error           // variables that could not be read (a secret's unreadable file)
}

// define defines on fs a flag for each of list that has one, defaulting
// to its variable, else to the file its _FILE variable names (a secret),
// else to its default.
func define(fs *flag.FlagSet, list []*setting, getenv func(string) string) *settingsSet {
	ss := &settingsSet{list: list, texts: map[*setting]*string{}, given: map[*setting]bool{}}
	for _, s := range list {
		text := s.def
		if s.env != "" {
			if v := getenv(s.env); v != "" {
				text, ss.given[s] = v, true
			} else if f := getenv(s.env + "_FILE"); s.secret && f != "" {
				ss.given[s] = true
				b, err := os.ReadFile(f) // #nosec G304 G703 -- the operator names the file
				if err != nil {
					ss.errs = append(ss.errs, fmt.Errorf("%s_FILE: %w", s.env, err))
				}
				text = strings.TrimRight(string(b), "\r\n")
			}
		}
		ss.texts[s] = &text
		if s.flag != "" {
			fs.Var(value{text: &text, secret: s.secret, isBool: s.kind == "bool"}, s.flag, s.usage(text))
		}
	}
	return ss
}

// usage is s's help in -h: its variable, and whether a secret is set.
func (s *setting) usage(text string) string {
	u := s.help
	switch {
	case s.env == "":
	case s.secret:
		u += " (" + s.env + " or " + s.env + "_FILE)"
	default:
		u += " (" + s.env + ")"
	}
	if s.secret && text != "" {
		u += " (set)"
	}
	return u
}

// apply sets every setting into c, then runs the checks of their
// sections, and builds the logger (a discarding one for a command that
// has no logging settings). It reports every malformed setting at once.
func (ss *settingsSet) apply(c *config) error {
	c.given = ss.given
	errs := append([]error(nil), ss.errs...)
	var sections []*section
	seen := map[*section]bool{}
	for _, s := range ss.list {
		v := *ss.texts[s]
		if err := s.set(c, v); err != nil {
			if s.secret {
				errs = append(errs, fmt.Errorf("%s: %w", s.name(), err))
			} else {
				errs = append(errs, fmt.Errorf("%s %q: %w", s.name(), v, err))
			}
		}
		if s.section.check != nil && !seen[s.section] {
			seen[s.section] = true
			sections = append(sections, s.section)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	for _, sec := range sections {
		if err := sec.check(c); err != nil {
			errs = append(errs, err)
		}
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	c.Kafka.Logger = c.Logger
	return errors.Join(errs...)
}

// printSettings prints list as the flag package prints its defaults,
// under the titles of their sections, in the order they first appear.
func printSettings(w io.Writer, list []*setting, texts map[*setting]*string) {
	var order []*section
	by := map[*section][]*setting{}
	for _, s := range list {
		if by[s.section] == nil {
			order = append(order, s.section)
		}
		by[s.section] = append(by[s.section], s)
	}
	for _, sec := range order {
		fmt.Fprintf(w, "\n%s:\n", sec.title)
		for _, s := range by[sec] {
			text := s.def
			if t := texts[s]; t != nil {
				text = *t
			}
			if s.flag == "" {
				fmt.Fprintf(w, "  %s (environment only)\n    \t%s\n", s.env, s.usage(text))
				continue
			}
			// A `word` in the help names the value, as in the flag package.
			kind, usage := flag.UnquoteUsage(&flag.Flag{Usage: s.usage(text), Value: value{}})
			switch {
			case s.kind == "bool":
				kind = ""
			case kind == "value":
				kind = s.kind
			}
			line := "  -" + s.flag
			if kind != "" {
				line += " " + kind
			}
			usage = strings.ReplaceAll(usage, "\n", "\n    \t")
			fmt.Fprintf(w, "%s\n    \t%s", line, usage)
			if !s.secret && text != "" && text != "0" && text != "false" {
				fmt.Fprintf(w, " (default %s)", quoteDefault(s.kind, text))
			}
			fmt.Fprintln(w)
		}
	}
}

// quoteDefault quotes a text default as the flag package does; numbers,
// durations and booleans stay bare.
func quoteDefault(kind, text string) string {
	if kind == "" || kind == "string" {
		return strconv.Quote(text)
	}
	return text
}

// connect opens a small pool on DATABASE_URL for an operator command.
func (c *config) connect(ctx context.Context) (*pgxpool.Pool, error) {
	if err := c.requireDatabase(ctx); err != nil {
		return nil, err
	}
	return postgres.Connect(ctx, c.DatabaseURL, 2)
}

// requireDatabase sets DATABASE_URL, when it is unset, to the database of
// the private cluster `onceflow dev` runs in its data directory
// (ONCEFLOW_DATA_DIR, .data), if that cluster runs: an operator command
// beside dev finds its database as it finds its broker. Otherwise it says
// what to do.
func (c *config) requireDatabase(ctx context.Context) error {
	if c.DatabaseURL != "" {
		return nil
	}
	dir := filepath.Join(cmp.Or(c.DataDir, c.getenv(dataDir.env), dataDir.def), "postgres")
	url, err := postgres.Local{Dir: dir}.Running(ctx)
	if err != nil || url == "" {
		return fmt.Errorf("DATABASE_URL is required: no private cluster of onceflow dev runs in %s (start onceflow dev there, set ONCEFLOW_DATA_DIR to its directory, or export DATABASE_URL=postgres://USER:PASSWORD@HOST:5432/DATABASE)", dir)
	}
	c.DatabaseURL = url
	return nil
}
