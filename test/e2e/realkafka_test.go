package e2e

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/onceflow/onceflow/examples/ledger/ledgerapp"
	"github.com/testcontainers/testcontainers-go"
	tckafka "github.com/testcontainers/testcontainers-go/modules/kafka"
)

// The same exactly-once workload as TestDepositsExactlyOnce, on Apache
// Kafka (Confluent's single-node KRaft image) instead of the embedded
// broker: transactions, read_committed, stable offset fetches and group
// rebalances behave as the pipeline expects on the real thing. Needs a
// Docker engine; skipped where there is none (the CI machines of this
// project have only the Docker client). Without Docker the same workload,
// and the rest of the suite, runs on Apache Kafka as JVM processes: `make
// test-kafka` (TestDepositsExactlyOnce with KAFKA_BROKERS set).
func TestDepositsExactlyOnceOnApacheKafka(t *testing.T) {
	if testing.Short() {
		t.Skip("needs Docker; skipped with -short")
	}
	if _, err := os.Stat("/var/run/docker.sock"); err != nil && os.Getenv("DOCKER_HOST") == "" {
		t.Skip("needs a Docker engine, and none runs here; the same workload runs on Apache Kafka without one: TestDepositsExactlyOnce under make test-kafka")
	}
	testcontainers.SkipIfProviderIsNotHealthy(t)
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()

	kc, err := tckafka.Run(ctx, "confluentinc/confluent-local:7.7.1", tckafka.WithClusterID("onceflow"))
	testcontainers.CleanupContainer(t, kc)
	if err != nil {
		t.Fatalf("start Kafka: %v", err)
	}
	brokers, err := kc.Brokers(ctx)
	if err != nil {
		t.Fatal(err)
	}
	d := deployOn(t, ctx, brokers[0], nil)
	m := newModel()
	workload(t, ctx, func() *ledgerapp.Client { return d.client }, m, 10, 20, 0)
	if t.Failed() {
		return
	}
	d.checkExact(t, ctx, m)
}
