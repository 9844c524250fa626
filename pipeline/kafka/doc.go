// Package kafka is onceflow's adapter to Kafka (through franz-go): client
// options from configuration, topic provisioning
// (docs/architecture.md#topics-keys-and-headers), and Broker, the embedded
// Kafka-compatible broker (franz-go's kfake) that `onceflow dev` and the
// tests run, with a data directory so its topics survive restarts.
//
// Role packages use *kgo.Client directly; this package only builds them.
package kafka
