package command

import (
	"cmp"
	"context"
	"flag"
	"fmt"
	"io"
	"path/filepath"

	"github.com/onceflow/onceflow"
	"github.com/onceflow/onceflow/pipeline/apiclient"
	"github.com/onceflow/onceflow/pipeline/avro"
	"github.com/onceflow/onceflow/pipeline/postgres"
)

// parse parses the arguments of the command called name: its own flags
// (own) and the settings it uses.
func parse(name string, domains []*onceflow.Domain, args []string, getenv func(string) string, stdout io.Writer, own func(*flag.FlagSet)) (*config, *flag.FlagSet, error) {
	return commands[name].parse(domains, args, getenv, stdout, own)
}

// parseDeployed parses the arguments of the command called name, which
// takes no flags of its own, and returns its settings and the deployment
// they make.
func parseDeployed(name string, domains []*onceflow.Domain, args []string, getenv func(string) string, stdout io.Writer) (*config, *onceflow.Deployment, error) {
	c, _, err := parse(name, domains, args, getenv, stdout, nil)
	if err != nil {
		return nil, nil, err
	}
	dep, err := c.Deployment()
	return c, dep, err
}

// deploymentSerdes returns the deployment and its serdes by topic, over the
// registry the components use.
func deploymentSerdes(ctx context.Context, cfg onceflow.Config) (*onceflow.Deployment, map[string]*avro.Serde, error) {
	dep, err := cfg.Deployment()
	if err != nil {
		return nil, nil, err
	}
	s, err := cfg.TopicSerdes(ctx)
	return dep, s, err
}

// commandTypesOf lists domains' command types for a usage text (none
// when the domains do not make a deployment: running the command says why).
func commandTypesOf(domains []*onceflow.Domain) string {
	dep, err := onceflow.Config{Domains: domains}.Deployment()
	if err != nil {
		return ""
	}
	return dep.CommandTypes()
}

func runDemo(ctx context.Context, domains []*onceflow.Domain, args []string, getenv func(string) string, stdout io.Writer) error {
	var url string
	c, _, err := parse("demo", domains, args, getenv, stdout, func(fs *flag.FlagSet) {
		fs.StringVar(&url, "url", "http://127.0.0.1:8080", "ingest base URL")
	})
	if err != nil {
		return err
	}
	key := c.APIKey
	if key == "" {
		return fmt.Errorf("an API key is required in ONCEFLOW_DEV_API_KEY")
	}
	ran := false
	for _, d := range domains {
		if d.Demo == nil {
			continue
		}
		if len(domains) > 1 {
			fmt.Fprintf(stdout, "== %s\n", d.Name)
		}
		if err := d.Demo(ctx, &apiclient.Client{BaseURL: url, APIKey: key}, stdout); err != nil {
			return fmt.Errorf("%s demo: %w", d.Name, err)
		}
		ran = true
	}
	if !ran {
		return fmt.Errorf("no domain of this binary has a demo")
	}
	return nil
}

func runMigrate(ctx context.Context, domains []*onceflow.Domain, args []string, getenv func(string) string, stdout io.Writer) error {
	c, dep, err := parseDeployed("migrate", domains, args, getenv, stdout)
	if err != nil {
		return err
	}
	// The migration role owns the tables; DATABASE_URL may be the runtime
	// role, which cannot (docs/security.md#database-roles).
	url := cmp.Or(c.DatabaseMigrationURL, c.DatabaseURL)
	if url == "" {
		return fmt.Errorf("DATABASE_MIGRATION_URL or DATABASE_URL is required")
	}
	if err := postgres.Migrate(ctx, url, nil, dep.Migrations()...); err != nil {
		return err
	}
	vs, err := postgres.MigrationVersions(ctx, url, dep.Migrations()...)
	if err != nil {
		return err
	}
	for _, v := range vs {
		fmt.Fprintf(stdout, "%s: migrated to version %d\n", setName(v), v.Current)
	}
	return nil
}

// setName names a set of migrations as the CLI prints it.
func setName(v postgres.SetVersion) string {
	if v.Name == "" {
		return "onceflow"
	}
	return v.Name
}

func runMigrateVersion(ctx context.Context, domains []*onceflow.Domain, args []string, getenv func(string) string, stdout io.Writer) error {
	c, dep, err := parseDeployed("migrate version", domains, args, getenv, stdout)
	if err != nil {
		return err
	}
	vs, err := postgres.MigrationVersions(ctx, c.DatabaseURL, dep.Migrations()...)
	if err != nil {
		return err
	}
	behind := false
	for _, v := range vs {
		fmt.Fprintf(stdout, "%s: database at version %d; this binary has up to %d\n", setName(v), v.Current, v.Latest)
		behind = behind || v.Current < v.Latest
	}
	if behind {
		fmt.Fprintln(stdout, "pending migrations: `onceflow migrate` applies them")
	}
	return nil
}

func runTopicsCreate(ctx context.Context, domains []*onceflow.Domain, args []string, getenv func(string) string, stdout io.Writer) error {
	c, dep, err := parseDeployed("topics create", domains, args, getenv, stdout)
	if err != nil {
		return err
	}
	if err := c.EnsureTopics(ctx); err != nil {
		return err
	}
	seen := map[string]bool{}
	for _, a := range dep.Aggregates() {
		for _, s := range a.Topics.Specs() {
			if !seen[s.Name] {
				seen[s.Name] = true
				fmt.Fprintf(stdout, "%s\tpartitions=%d\t%v\n", s.Name, s.Partitions, s.Configs)
			}
		}
	}
	return nil
}

// postgresFlags are the private cluster's: where it lives, on which port.
func postgresFlags(name string, args []string, getenv func(string) string, stdout io.Writer) (*config, postgres.Local, error) {
	var port int
	c, _, err := parse(name, nil, args, getenv, stdout, func(fs *flag.FlagSet) {
		fs.IntVar(&port, "port", 0, "port on 127.0.0.1; 0: the one remembered beside the data directory, or 54329, or a free one, remembered")
	})
	if err != nil {
		return nil, postgres.Local{}, err
	}
	return c, postgres.Local{Dir: filepath.Join(c.DataDir, "postgres"), Port: port}, nil
}

func runPostgresUp(ctx context.Context, domains []*onceflow.Domain, args []string, getenv func(string) string, stdout io.Writer) error {
	c, local, err := postgresFlags("postgres up", args, getenv, stdout)
	if err != nil {
		return err
	}
	local.Logf = func(f string, a ...any) { fmt.Fprintf(stdout, "# "+f+"\n", a...) }
	url, err := postgres.Resolve(ctx, c.DatabaseURL, local)
	if err != nil {
		return err
	}
	// The private cluster's URL has no password; a DATABASE_URL that
	// answered is printed with its password masked (make's targets then
	// keep DATABASE_URL as it is).
	fmt.Fprintln(stdout, postgres.Redact(url))
	return nil
}

func runPostgresDown(ctx context.Context, domains []*onceflow.Domain, args []string, getenv func(string) string, stdout io.Writer) error {
	_, local, err := postgresFlags("postgres down", args, getenv, stdout)
	if err != nil {
		return err
	}
	return local.Stop(ctx, "fast")
}
