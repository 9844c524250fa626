package cli

import (
	"context"
	"flag"
	"fmt"
	"io"
	"path/filepath"
	"time"

	"github.com/onceflow/onceflow"
	"github.com/onceflow/onceflow/pipeline/apiclient"
	"github.com/onceflow/onceflow/pipeline/avro"
	"github.com/onceflow/onceflow/pipeline/postgres"
)

func init() {
	register("dev", "run the embedded default: broker, registry, Postgres and every component", runDev)
	register("demo", "drive a scripted workload against a running ingest and check the balances", runDemo)
	register("migrate", "apply the Postgres migrations", runMigrate)
	register("migrate version", "print where the database stands on each set of migrations (onceflow's, each domain's) and the newest this binary has", runMigrateVersion)
	register("topics create", "create the topics (cleanup policies, retention, partitions) and check them", runTopicsCreate)
	register("postgres up", "start (or reuse) the private Postgres cluster and print its URL", runPostgresUp)
	register("postgres down", "stop the private Postgres cluster", runPostgresDown)
	for name, c := range map[string]onceflow.Components{
		"ingest": {Ingest: true}, "relay": {Relay: true}, "processor": {Processor: true}, "projector": {Projector: true},
		"worker": {Worker: true},
	} {
		register(name, "run the "+name+" (its flags: "+name+" -h)", func(ctx context.Context, domains []*onceflow.Domain, args []string, getenv func(string) string, stdout io.Writer) error {
			return runComponent(ctx, name, c, domains, args, getenv, stdout)
		})
	}
}

// parse parses a subcommand's flags (the shared ones plus its own).
func parse(name string, domains []*onceflow.Domain, args []string, getenv func(string) string, stdout io.Writer, own func(*flag.FlagSet)) (*Common, *flag.FlagSet, error) {
	fs := flag.NewFlagSet("onceflow "+name, flag.ContinueOnError)
	fs.SetOutput(stdout)
	c := Register(fs, getenv)
	c.domains = domains
	if own != nil {
		own(fs)
	}
	return c, fs, fs.Parse(args)
}

func setup(c *Common, stdout io.Writer) (onceflow.Config, error) {
	logger, err := c.Logger(stdout)
	if err != nil {
		return onceflow.Config{}, err
	}
	return c.Stack(logger)
}

// setupSerdes is setup with the deployment and its serdes, over the
// registry the components use.
func setupSerdes(ctx context.Context, c *Common, stdout io.Writer) (onceflow.Config, *onceflow.Deployment, map[string]*avro.Serde, error) {
	cfg, err := setup(c, stdout)
	if err != nil {
		return onceflow.Config{}, nil, nil, err
	}
	dep, err := cfg.Deployment()
	if err != nil {
		return onceflow.Config{}, nil, nil, err
	}
	s, err := cfg.TopicSerdes(ctx)
	return cfg, dep, s, err
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

func runDev(ctx context.Context, domains []*onceflow.Domain, args []string, getenv func(string) string, stdout io.Writer) error {
	dataDir := getenv("ONCEFLOW_DATA_DIR")
	if dataDir == "" {
		dataDir = ".data"
	}
	var brokerOnly bool
	var registryAddr string
	brokerAddr := getenv("ONCEFLOW_DEV_BROKER_ADDR")
	if brokerAddr == "" {
		brokerAddr = "127.0.0.1:9092"
	}
	minSession := getenv("ONCEFLOW_DEV_GROUP_MIN_SESSION_TIMEOUT")
	if minSession == "" {
		minSession = "6s"
	}
	c, fs, err := parse("dev", domains, args, getenv, stdout, func(fs *flag.FlagSet) {
		fs.BoolVar(&brokerOnly, "broker-only", false, "run only the embedded broker and registry")
		fs.StringVar(&minSession, "group-min-session-timeout", minSession, "the broker's smallest group session timeout; lower it to test rebalances quickly (ONCEFLOW_DEV_GROUP_MIN_SESSION_TIMEOUT)")
		fs.StringVar(&dataDir, "data-dir", dataDir, "broker data and private Postgres cluster (ONCEFLOW_DATA_DIR)")
		fs.StringVar(&registryAddr, "registry-addr", "127.0.0.1:8081", "schema registry address; it accepts new schemas from anyone who reaches it")
		fs.StringVar(&brokerAddr, "broker-addr", brokerAddr, "the embedded broker's address, when KAFKA_BROKERS does not name a Kafka cluster to run on instead (ONCEFLOW_DEV_BROKER_ADDR)")
	})
	if err != nil {
		return err
	}
	// KAFKA_BROKERS (or -kafka-brokers) names a cluster to run on instead
	// of the embedded broker: Apache Kafka, `make kafka-up`.
	external := getenv("KAFKA_BROKERS") != ""
	fs.Visit(func(f *flag.Flag) { external = external || f.Name == "kafka-brokers" })
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments: %v", fs.Args())
	}
	cfg, err := setup(c, stdout)
	if err != nil {
		return err
	}
	pcfg, err := c.Processor()
	if err != nil {
		return err
	}
	rcfg, err := c.Relay()
	if err != nil {
		return err
	}
	icfg, err := c.ingest(getenv)
	if err != nil {
		return err
	}
	minSessionTimeout, err := time.ParseDuration(minSession)
	if err != nil || minSessionTimeout <= 0 {
		return fmt.Errorf("-group-min-session-timeout %q: want a positive duration", minSession)
	}
	return onceflow.RunDev(ctx, onceflow.DevConfig{
		RunConfig: onceflow.RunConfig{Config: cfg, HTTPAddr: c.HTTPAddr, AdminAddr: c.AdminAddr, AdminToken: c.AdminToken,
			Ingest: icfg, Processor: pcfg, Relay: rcfg, LagExport: c.LagExport},
		DataDir:       dataDir,
		BrokerAddr:    brokerAddr,
		ExternalKafka: external,
		RegistryAddr:  registryAddr,
		BrokerOnly:    brokerOnly,
		APIKey:        getenv("ONCEFLOW_DEV_API_KEY"),
		Out:           stdout,

		GroupMinSessionTimeout: minSessionTimeout,
	})
}

func runDemo(ctx context.Context, domains []*onceflow.Domain, args []string, getenv func(string) string, stdout io.Writer) error {
	fs := flag.NewFlagSet("onceflow demo", flag.ContinueOnError)
	fs.SetOutput(stdout)
	url := fs.String("url", "http://127.0.0.1:8080", "ingest base URL")
	if err := fs.Parse(args); err != nil {
		return err
	}
	// The key comes from the environment only: an argument would sit in
	// the shell's history and in every process listing.
	key := getenv("ONCEFLOW_DEV_API_KEY")
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
		if err := d.Demo(ctx, &apiclient.Client{BaseURL: *url, APIKey: key}, stdout); err != nil {
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
	c, _, err := parse("migrate", domains, args, getenv, stdout, nil)
	if err != nil {
		return err
	}
	// The migration role owns the tables; DATABASE_URL may be the runtime
	// role, which cannot (docs/security.md#database-roles).
	url := c.DatabaseMigrationURL
	if url == "" {
		url = c.DatabaseURL
	}
	if url == "" {
		return fmt.Errorf("DATABASE_MIGRATION_URL or DATABASE_URL is required")
	}
	cfg, err := setup(c, io.Discard)
	if err != nil {
		return err
	}
	dep, err := cfg.Deployment()
	if err != nil {
		return err
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
	c, _, err := parse("migrate version", domains, args, getenv, stdout, nil)
	if err != nil {
		return err
	}
	cfg, err := setup(c, io.Discard)
	if err != nil {
		return err
	}
	dep, err := cfg.Deployment()
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
	c, _, err := parse("topics create", domains, args, getenv, stdout, nil)
	if err != nil {
		return err
	}
	cfg, err := setup(c, io.Discard)
	if err != nil {
		return err
	}
	dep, err := cfg.Deployment()
	if err != nil {
		return err
	}
	if err := cfg.EnsureTopics(ctx); err != nil {
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

func postgresFlags(args []string, getenv func(string) string, stdout io.Writer, name string) (postgres.Local, []string, error) {
	fs := flag.NewFlagSet("onceflow "+name, flag.ContinueOnError)
	fs.SetOutput(stdout)
	dataDir := getenv("ONCEFLOW_DATA_DIR")
	if dataDir == "" {
		dataDir = ".data"
	}
	fs.StringVar(&dataDir, "data-dir", dataDir, "the cluster lives in DATA_DIR/postgres (ONCEFLOW_DATA_DIR)")
	port := fs.Int("port", 54329, "port on 127.0.0.1")
	if err := fs.Parse(args); err != nil {
		return postgres.Local{}, nil, err
	}
	return postgres.Local{Dir: filepath.Join(dataDir, "postgres"), Port: *port}, fs.Args(), nil
}

func runPostgresUp(ctx context.Context, domains []*onceflow.Domain, args []string, getenv func(string) string, stdout io.Writer) error {
	local, _, err := postgresFlags(args, getenv, stdout, "postgres up")
	if err != nil {
		return err
	}
	local.Logf = func(f string, a ...any) { fmt.Fprintf(stdout, "# "+f+"\n", a...) }
	url, err := postgres.Resolve(ctx, getenv("DATABASE_URL"), local)
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
	local, _, err := postgresFlags(args, getenv, stdout, "postgres down")
	if err != nil {
		return err
	}
	return local.Stop(ctx, "fast")
}
