// Command projector applies events to the Postgres read models through the inbox, exactly once.
//
// Configuration is by environment variable or flag (`projector -h`):
// KAFKA_BROKERS, DATABASE_URL, SCHEMA_REGISTRY_URL, ONCEFLOW_TOPIC_PREFIX,
// HTTP_ADDR, ADMIN_ADDR, LOG_LEVEL, LOG_FORMAT and the KAFKA_SASL_* /
// KAFKA_TLS* settings. It serves /metrics, /healthz and /readyz on ADMIN_ADDR
// and shuts down gracefully on SIGINT or SIGTERM.
package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/onceflow/onceflow/cmd/internal/cli"
	"github.com/onceflow/onceflow/pipeline/stack"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Getenv, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "projector:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string, getenv func(string) string, stdout io.Writer) error {
	return cli.RunComponent(ctx, "projector", stack.Components{Projector: true}, args, getenv, stdout)
}
