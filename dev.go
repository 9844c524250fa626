package onceflow

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/onceflow/onceflow/pipeline/avro"
	"github.com/onceflow/onceflow/pipeline/devbroker"
	"github.com/onceflow/onceflow/pipeline/ingest"
	"github.com/onceflow/onceflow/pipeline/postgres"
)

// DevConfig configures `onceflow dev`.
type DevConfig struct {
	RunConfig
	// DataDir holds the broker's data (DataDir/kafka), the schema
	// registry's (DataDir/registry.json) and, when
	// DATABASE_URL does not answer, the private Postgres cluster
	// (DataDir/postgres). Default ".data".
	DataDir string
	// BrokerAddr is where the embedded broker listens. Default
	// "127.0.0.1:9092".
	BrokerAddr string
	// RegistryAddr serves the embedded schema registry. Default
	// "127.0.0.1:8081": it accepts new schemas from anyone who reaches it.
	RegistryAddr string
	// BrokerOnly runs just the broker and the registry, so the components
	// can run as separate processes against them.
	BrokerOnly bool
	// GroupMinSessionTimeout is the smallest group session timeout the
	// broker accepts (tests of rebalances and zombies lower it). Default
	// 6s, Kafka's.
	GroupMinSessionTimeout time.Duration
	// APIKey is the demo tenant's key (ONCEFLOW_DEV_API_KEY); empty
	// generates one and prints it, once. A key given is not printed: its
	// owner has it.
	APIKey string
	// Out receives the banner.
	Out io.Writer
}

// DemoTenant is the tenant `onceflow dev` creates.
const DemoTenant = "demo"

// DevAdminAddr is the admin address of `onceflow dev` when ADMIN_ADDR is
// not set: loopback only.
const DevAdminAddr = "127.0.0.1:9090"

// RunDev runs the embedded default: a Kafka-compatible broker and a schema
// registry in process, Postgres (DATABASE_URL or a private cluster), the
// demo tenant, and all four components, until ctx ends. It exports the lag
// of every consumer of the cluster unless RunConfig.LagExport says
// otherwise.
func RunDev(ctx context.Context, dc DevConfig) error {
	dc.setDefaults()
	logger := dc.Logger.With("component", "dev")

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
		return err
	}
	defer broker.Close()
	dc.Kafka.Brokers = broker.Addrs()
	// SIGUSR1 crashes the process between two of the broker's requests:
	// the hard restart the chaos harness injects (CrashAtNextRequest).
	crash := make(chan os.Signal, 1)
	signal.Notify(crash, syscall.SIGUSR1)
	defer signal.Stop(crash)
	go func() {
		select {
		case <-crash:
			logger.Warn("SIGUSR1: crashing at the broker's next request")
			broker.CrashAtNextRequest()
		case <-ctx.Done():
		}
	}()

	// The dev stack always serves its own registry, so other clients
	// (kcat, other processes) can use the same ids. It keeps them next to
	// the broker's data: records there carry them.
	reg, err := avro.OpenEmbedded(filepath.Join(dc.DataDir, "registry.json"))
	if err != nil {
		return err
	}
	dep, err := dc.deployment()
	if err != nil {
		return err
	}
	if err := registerSchemas(ctx, reg, dep); err != nil {
		return err
	}
	registryLn, err := net.Listen("tcp", dc.RegistryAddr)
	if err != nil {
		return fmt.Errorf("registry listen: %w", err)
	}
	registrySrv := &http.Server{Handler: reg.Handler(), ReadHeaderTimeout: 5 * time.Second}
	go registrySrv.Serve(registryLn)
	defer registrySrv.Close()

	if err := ensureTopics(ctx, dc.Config, dep); err != nil {
		return fmt.Errorf("topics: %w", err)
	}
	registryURL := "http://" + loopback(registryLn.Addr().String())

	if dc.BrokerOnly {
		fmt.Fprintf(dc.Out, "onceflow dev (broker only) is running\n  kafka      %s   (data %s)\n  registry   %s\nRun the components against them with KAFKA_BROKERS=%s SCHEMA_REGISTRY_URL=%s.\n",
			broker.Addrs()[0], filepath.Join(dc.DataDir, "kafka"), registryURL, broker.Addrs()[0], registryURL)
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
	pool, err := openDatabase(ctx, dc.Config, dep, 4)
	if err != nil {
		return err
	}
	key, shown := dc.APIKey, "$ONCEFLOW_DEV_API_KEY"
	if key == "" {
		key = ingest.NewAPIKey()
		shown = key
	}
	err = ingest.CreateAPIKey(ctx, pool, DemoTenant, "onceflow dev", key)
	pool.Close()
	if err != nil {
		return err
	}

	rc := dc.RunConfig
	rc.Config = dc.Config
	rc.Components = All
	rc.Registry = reg
	if rc.LagExport == "" {
		rc.LagExport = LagExportCluster // one process: every group once
	}
	started := rc.Started
	rc.Started = func(a Addrs) {
		defer func() {
			if started != nil {
				a.Kafka, a.RegistryURL = broker.Addrs()[0], registryURL
				started(a)
			}
		}()
		fmt.Fprintf(dc.Out, `onceflow dev is running
  kafka      %s   (data %s)
  registry   %s
  postgres   %s
  ingest     http://%s
  admin      http://%s/status  (the status page; /metrics /healthz /readyz)
  tenant %q  API key: %s
%s
Every route, with its body: curl -s http://%s/openapi.json
Send commands with -H "Authorization: Bearer %s" -H "Idempotency-Key: <one per operation>".
Outbound webhooks: POST /v1/webhooks {"url","event_types"} (docs/webhooks.md); a receiver on this
machine needs ONCEFLOW_WEBHOOK_ALLOW_NETWORKS=127.0.0.0/8.
`, broker.Addrs()[0], filepath.Join(dc.DataDir, "kafka"), registryURL, postgres.Redact(dc.DatabaseURL),
			loopback(a.HTTP), loopback(a.Admin), DemoTenant, shown, dep.routeList(), loopback(a.HTTP), shown)
	}
	err = RunComponents(ctx, rc)
	if errors.Is(err, context.Canceled) {
		return nil
	}
	return err
}

func (dc *DevConfig) setDefaults() {
	if dc.DataDir == "" {
		dc.DataDir = ".data"
	}
	if dc.BrokerAddr == "" {
		dc.BrokerAddr = "127.0.0.1:9092"
	}
	if dc.RegistryAddr == "" {
		dc.RegistryAddr = "127.0.0.1:8081"
	}
	if dc.AdminAddr == "" {
		// The dev stack is one machine's: its metrics and probes stay on
		// it unless ADMIN_ADDR says otherwise.
		dc.AdminAddr = DevAdminAddr
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
func (dep *deployment) routeList() string {
	var b strings.Builder
	for _, d := range dep.domains {
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
