package command

import (
	"context"
	"errors"
	"io"

	"github.com/onceflow/onceflow"
)

// The components, each a command of Main and the binary of ComponentMain.
var components = map[string]onceflow.Components{
	"ingest": {Ingest: true}, "relay": {Relay: true}, "processor": {Processor: true}, "projector": {Projector: true},
	"worker": {Worker: true}, "natsink": {NATSink: true},
}

func init() {
	for name, c := range components {
		cmd := componentCommand(name, c)
		cmd.title = "onceflow " + name
		register(cmd)
	}
	register(&command{name: "dev", summary: "run the embedded default: broker, registry, Postgres and every component",
		settings: devCommandSettings(), run: runDev})
}

// The runners the commands start: a test of the settings replaces them to
// see what a command would run with.
var (
	runComponents = onceflow.RunComponents
	runDevStack   = func(ctx context.Context, dc onceflow.DevConfig) error { return RunDev(ctx, dc) }
)

// RunDev runs `onceflow dev` (dev.Run). Package cli sets it; a binary of
// one component (cli/component) leaves it nil, so it does not link the
// embedded broker (TestLeanBinaries), and has no dev command to run.
var RunDev func(context.Context, onceflow.DevConfig) error

// componentCommand runs components of domains with their settings (a
// component binary's main, or a component subcommand of Main).
func componentCommand(name string, components onceflow.Components) *command {
	summary := "run the " + name
	if components.NATSink {
		summary = "run the NATS sink: the events topic to a NATS JetStream stream, each event once as far as JetStream can tell"
	}
	c := &command{name: name, title: name, summary: summary, settings: componentSettings(components)}
	c.run = func(ctx context.Context, domains []*onceflow.Domain, args []string, getenv func(string) string, stdout io.Writer) error {
		cfg, _, err := c.parse(domains, args, getenv, stdout, nil)
		if err != nil {
			return err
		}
		rc := cfg.RunConfig
		rc.Components = components
		stop, err := cfg.exportSpans(ctx, &rc.Config)
		if err != nil {
			return err
		}
		defer stop()
		return runComponents(ctx, rc)
	}
	return c
}

// devCommandSettings are dev's: every component's, the NATS sink's
// included (it runs when ONCEFLOW_NATS_URL is set), but the schema
// registry's (dev serves its own), and dev's own.
func devCommandSettings() []*setting {
	all := onceflow.All
	all.NATSink = true
	var out []*setting
	for _, s := range componentSettings(all) {
		if s.section != registrySection {
			out = append(out, s)
		}
	}
	return use(out, devSettings)
}

func runDev(ctx context.Context, domains []*onceflow.Domain, args []string, getenv func(string) string, stdout io.Writer) error {
	c, _, err := parse("dev", domains, args, getenv, stdout, nil)
	if err != nil {
		return err
	}
	dc := c.DevConfig
	// KAFKA_BROKERS (or -kafka-brokers) names a cluster to run on instead
	// of the embedded broker: Apache Kafka, `make kafka-up`.
	dc.ExternalKafka = c.given[kafkaBrokers]
	// The dev stack is one machine's: ingest, like the admin address,
	// listens on loopback unless HTTP_ADDR says otherwise.
	if !c.given[httpAddr] {
		dc.HTTPAddr = onceflow.DevHTTPAddr
	}
	dc.Out = stdout
	if RunDev == nil {
		return errors.New("this binary runs one component and has no embedded default (dev): run the onceflow binary's dev")
	}
	stop, err := c.exportSpans(ctx, &dc.Config)
	if err != nil {
		return err
	}
	defer stop()
	return runDevStack(ctx, dc)
}
