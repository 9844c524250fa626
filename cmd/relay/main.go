// Command relay ships the Postgres outbox to {prefix}.commands and runs the retention janitor.
//
// Configuration is by environment variable or flag (`relay -h`):
// KAFKA_BROKERS, DATABASE_URL, SCHEMA_REGISTRY_URL, ONCEFLOW_TOPIC_PREFIX,
// ONCEFLOW_INSTANCE_ID, ONCEFLOW_OUTBOX_SHARDS, ADMIN_ADDR, LOG_LEVEL,
// LOG_FORMAT and the KAFKA_SASL_* / KAFKA_TLS* settings, plus the relay's
// own ONCEFLOW_RELAY_LEASE and ONCEFLOW_RELAY_BATCH_SIZE. It serves
// /metrics, /healthz and /readyz on ADMIN_ADDR and shuts down gracefully
// on SIGINT or SIGTERM (finishing its batches in flight and handing its
// shards over).
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"strconv"
	"time"

	"github.com/onceflow/onceflow/cmd/internal/cli"
	"github.com/onceflow/onceflow/pipeline/relay"
	"github.com/onceflow/onceflow/pipeline/stack"
)

func main() { cli.Main("relay", run) }

func run(ctx context.Context, args []string, getenv func(string) string, stdout io.Writer) error {
	fs := flag.NewFlagSet("relay", flag.ContinueOnError)
	fs.SetOutput(stdout)
	c := cli.Register(fs, getenv)
	var rcfg relay.Config
	lease, err := envDuration(getenv, "ONCEFLOW_RELAY_LEASE", 10*time.Second)
	if err != nil {
		return err
	}
	batch, err := envInt(getenv, "ONCEFLOW_RELAY_BATCH_SIZE", 500)
	if err != nil {
		return err
	}
	fs.DurationVar(&rcfg.LeaseDuration, "lease", lease, "shard lease period: a silent relay's shards move to the others after it (ONCEFLOW_RELAY_LEASE)")
	fs.IntVar(&rcfg.BatchSize, "batch-size", batch, "rows per Kafka transaction (ONCEFLOW_RELAY_BATCH_SIZE)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments: %v", fs.Args())
	}
	logger, err := c.Logger(stdout)
	if err != nil {
		return err
	}
	cfg, err := c.Stack(logger)
	if err != nil {
		return err
	}
	return stack.Run(ctx, stack.RunConfig{
		Config:     cfg,
		Components: stack.Components{Relay: true},
		HTTPAddr:   c.HTTPAddr,
		AdminAddr:  c.AdminAddr,
		Relay:      rcfg,
	})
}

func envDuration(getenv func(string) string, name string, def time.Duration) (time.Duration, error) {
	v := getenv(name)
	if v == "" {
		return def, nil
	}
	d, err := time.ParseDuration(v)
	if err != nil {
		return 0, fmt.Errorf("%s=%q: want a duration like 10s", name, v)
	}
	return d, nil
}

func envInt(getenv func(string) string, name string, def int) (int, error) {
	v := getenv(name)
	if v == "" {
		return def, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil {
		return 0, fmt.Errorf("%s=%q: want a number", name, v)
	}
	return n, nil
}
