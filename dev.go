package onceflow

import (
	"io"
	"time"
)

// DevConfig configures `onceflow dev`, which package dev runs (dev.Run):
// the embedded broker lives there, so that a binary of one component,
// which imports this package, does not link it.
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
	// ExternalKafka runs the components on the Kafka cluster of
	// RunConfig.Kafka (KAFKA_BROKERS: Apache Kafka, `make kafka-up`)
	// instead of an embedded broker; BrokerAddr and
	// GroupMinSessionTimeout are then unused. Topics are created with the
	// cluster's default replication factor.
	ExternalKafka bool
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

// DevHTTPAddr is ingest's address in `onceflow dev` when HTTP_ADDR is not
// set: loopback only, as the admin address.
const DevHTTPAddr = "127.0.0.1:8080"
