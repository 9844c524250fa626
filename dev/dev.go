// Package dev is `onceflow dev`, the embedded default: a Kafka-compatible
// broker (kfake, pipeline/devbroker) and a schema registry in process,
// Postgres, the demo tenant and every component, run from a
// onceflow.DevConfig. It is a package of its own so that only what runs
// dev links the embedded broker: cli.Main and the tests do, a binary of
// one component (cli/component) does not (TestLeanBinaries).
package dev

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/onceflow/onceflow"
	"github.com/onceflow/onceflow/pipeline/avro"
	"github.com/onceflow/onceflow/pipeline/devbroker"
	"github.com/onceflow/onceflow/pipeline/ingest"
	"github.com/onceflow/onceflow/pipeline/kafka"
	"github.com/onceflow/onceflow/pipeline/natsink"
	"github.com/onceflow/onceflow/pipeline/postgres"
)

// Run runs the embedded default: a Kafka-compatible broker and a schema
// registry in process, Postgres (DATABASE_URL or a private cluster), the
// demo tenant, and all five components, until ctx ends; with ExternalKafka,
// the same on a Kafka cluster of its own instead of the embedded broker.
// It exports the lag of every consumer of the cluster unless
// RunConfig.LagExport says otherwise.
func Run(ctx context.Context, dc onceflow.DevConfig) error {
	setDefaults(&dc)
	logger := dc.Logger.With("component", "dev")

	kafkaAddr, kafkaNote, stopBroker, err := startBroker(ctx, &dc, logger)
	if err != nil {
		return err
	}
	defer stopBroker()

	// The dev stack always serves its own registry, so other clients
	// (kcat, other processes) can use the same ids. It keeps them next to
	// the broker's data: records there carry them.
	reg, err := avro.OpenEmbedded(filepath.Join(dc.DataDir, "registry.json"))
	if err != nil {
		return err
	}
	dep, err := dc.Deployment()
	if err != nil {
		return err
	}
	if err := dep.RegisterSchemas(ctx, reg); err != nil {
		return err
	}
	// The topics first: a registry that answers says they exist (the
	// components of `dev --broker-only` wait for it, and on a cluster
	// with ACLs they may not create topics).
	if err := dc.Config.EnsureTopics(ctx); err != nil {
		return fmt.Errorf("topics: %w", err)
	}
	registryLn, err := net.Listen("tcp", dc.RegistryAddr)
	if err != nil {
		return fmt.Errorf("registry listen: %w", err)
	}
	registrySrv := &http.Server{Handler: reg.Handler(), ReadHeaderTimeout: 5 * time.Second}
	go registrySrv.Serve(registryLn)
	defer registrySrv.Close()
	registryURL := "http://" + loopback(registryLn.Addr().String())

	if dc.BrokerOnly {
		fmt.Fprintf(dc.Out, "onceflow dev (broker only) is running\n  kafka      %s   (%s)\n  registry   %s\nRun the components against them with KAFKA_BROKERS=%s SCHEMA_REGISTRY_URL=%s.\n",
			kafkaAddr, kafkaNote, registryURL, kafkaAddr, registryURL)
		<-ctx.Done()
		return nil
	}

	dc.DatabaseURL, err = postgres.Resolve(ctx, dc.DatabaseURL, postgres.Local{
		Dir:  filepath.Join(dc.DataDir, "postgres"),
		Logf: func(f string, a ...any) { logger.Info(fmt.Sprintf(f, a...)) },
	})
	if err != nil {
		return err
	}
	pool, err := dc.Config.OpenDatabase(ctx, 4)
	if err != nil {
		return err
	}
	key, shown := dc.APIKey, "$ONCEFLOW_DEV_API_KEY"
	if key == "" {
		key = ingest.NewAPIKey()
		shown = key
	}
	err = ingest.CreateAPIKey(ctx, pool, onceflow.DemoTenant, "onceflow dev", key)
	pool.Close()
	if err != nil {
		return err
	}

	rc := dc.RunConfig
	rc.Config = dc.Config
	rc.Components = onceflow.All
	rc.Components.NATSink = rc.NATSink.URL != ""
	rc.Registry = reg
	if rc.LagExport == "" {
		rc.LagExport = onceflow.LagExportCluster // one process: every group once
	}
	started := rc.Started
	rc.Started = func(a onceflow.Addrs) {
		defer func() {
			if started != nil {
				a.Kafka, a.RegistryURL = kafkaAddr, registryURL
				started(a)
			}
		}()
		fmt.Fprintf(dc.Out, `onceflow dev is running
  kafka      %s   (%s)
  registry   %s
  postgres   %s
  ingest     http://%s
  admin      http://%s/status  (the status page; /metrics /healthz /readyz)
  tenant %q  API key: %s
%s%s
Every route, with its body: curl -s http://%s/openapi.json
Send commands with -H "Authorization: Bearer %s" -H "Idempotency-Key: <one per operation>".
Outbound webhooks: POST /v1/webhooks {"url","event_types"} (docs/webhooks.md); %s
`, kafkaAddr, kafkaNote, registryURL, postgres.Redact(dc.DatabaseURL),
			loopback(a.HTTP), loopback(a.Admin), onceflow.DemoTenant, shown, routeList(dep), natsBanner(rc, dep), loopback(a.HTTP), shown, webhookNote(dc.Webhooks.Allow))
	}
	err = onceflow.RunComponents(ctx, rc)
	if errors.Is(err, context.Canceled) {
		return nil
	}
	return err
}

// webhookNote is the banner's word on where webhooks may go: the networks
// allowed although the guard refuses them (ONCEFLOW_WEBHOOK_ALLOW_NETWORKS),
// or how to allow a receiver on this machine.
func webhookNote(allow []netip.Prefix) string {
	if len(allow) == 0 {
		return "a receiver on this\nmachine needs ONCEFLOW_WEBHOOK_ALLOW_NETWORKS=127.0.0.0/8."
	}
	nets := make([]string, len(allow))
	for i, p := range allow {
		nets[i] = p.String()
	}
	return "receivers may also be\nin " + strings.Join(nets, ", ") + " (ONCEFLOW_WEBHOOK_ALLOW_NETWORKS)."
}

// startBroker starts the embedded broker, or checks that the external
// cluster answers, and points the components at it. It returns the
// brokers' address and what they are, for the banner, and what stops the
// embedded broker.
func startBroker(ctx context.Context, dc *onceflow.DevConfig, logger *slog.Logger) (addr, note string, stop func(), err error) {
	if dc.ExternalKafka {
		if err := pingKafka(ctx, dc.Kafka); err != nil {
			return "", "", nil, err
		}
		return strings.Join(dc.Kafka.Brokers, ","), "KAFKA_BROKERS, not embedded", func() {}, nil
	}
	var brokerOpts []kfake.Opt
	if dc.GroupMinSessionTimeout > 0 {
		brokerOpts = append(brokerOpts, kfake.GroupMinSessionTimeout(dc.GroupMinSessionTimeout))
	}
	broker, err := devbroker.Start(devbroker.Config{
		Addr:    dc.BrokerAddr,
		DataDir: filepath.Join(dc.DataDir, "kafka"),
		Logger:  logger,
		Opts:    brokerOpts,
	})
	if err != nil {
		return "", "", nil, err
	}
	dc.Kafka.Brokers = broker.Addrs()
	// SIGUSR1 crashes the process between two of the broker's requests:
	// the hard restart the chaos harness injects (CrashAtNextRequest).
	crash := make(chan os.Signal, 1)
	signal.Notify(crash, syscall.SIGUSR1)
	stopped := make(chan struct{})
	go func() {
		select {
		case <-crash:
			logger.Warn("SIGUSR1: crashing at the broker's next request")
			broker.CrashAtNextRequest()
		case <-stopped:
		}
	}()
	stop = func() {
		signal.Stop(crash)
		close(stopped)
		broker.Close()
	}
	return broker.Addrs()[0], "data " + filepath.Join(dc.DataDir, "kafka"), stop, nil
}

// pingKafka checks that the external cluster answers, so that a wrong
// KAFKA_BROKERS is one clear error rather than components retrying.
func pingKafka(ctx context.Context, kc kafka.Config) error {
	cl, err := kc.NewClient()
	if err != nil {
		return err
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	if _, err := kadm.NewClient(cl).BrokerMetadata(ctx); err != nil {
		return fmt.Errorf("no Kafka answers at KAFKA_BROKERS=%s (%w): start one (make kafka-up), or unset KAFKA_BROKERS for the embedded broker (its address: -broker-addr)", strings.Join(kc.Brokers, ","), err)
	}
	return nil
}

func setDefaults(dc *onceflow.DevConfig) {
	if dc.DataDir == "" {
		dc.DataDir = ".data"
	}
	if dc.BrokerAddr == "" {
		dc.BrokerAddr = "127.0.0.1:9092"
	}
	if dc.RegistryAddr == "" {
		dc.RegistryAddr = "127.0.0.1:8081"
	}
	if dc.NATSink.Replicas == 0 {
		// A trial's NATS is one server (its stream is created with one
		// replica, which production refuses unless told that the server
		// syncs every write: docs/consumers.md#nats-jetstream).
		dc.NATSink.Replicas, dc.NATSink.AllowSingleReplica = 1, true
	}
	if dc.AdminAddr == "" {
		// The dev stack is one machine's: its metrics and probes stay on
		// it unless ADMIN_ADDR says otherwise.
		dc.AdminAddr = onceflow.DevAdminAddr
	}
}

// loopback turns ":8080" or "[::]:8080" into "127.0.0.1:8080" for printing.
func loopback(addr string) string {
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		return addr
	}
	return net.JoinHostPort("127.0.0.1", port)
}

// routeList lists the deployment's routes for the dev banner.
func routeList(dep *onceflow.Deployment) string {
	var b strings.Builder
	for _, d := range dep.Domains {
		fmt.Fprintf(&b, "  %s:\n", d.Name)
		for _, r := range d.Routes {
			fmt.Fprintf(&b, "    %s\n", r.Pattern)
		}
		for _, q := range d.Queries {
			fmt.Fprintf(&b, "    %s\n", q.Pattern)
		}
	}
	return b.String()
}

// natsBanner is the banner's line of each domain's NATS sink, when it
// runs: where its events go.
func natsBanner(rc onceflow.RunConfig, dep *onceflow.Deployment) string {
	if !rc.Components.NATSink {
		return ""
	}
	var b strings.Builder
	for _, d := range dep.Domains {
		fmt.Fprintf(&b, "NATS sink: %s -> JetStream stream %s, subjects %s.{tenant}.{event-type} (group %s; docs/consumers.md#nats-jetstream)\n",
			d.EventsTopic(), natsink.DefaultStream(d.EventsTopic()), d.EventsTopic(), d.NATSinkGroup())
	}
	return b.String()
}
