// Package kafka is onceflow's adapter to Kafka (through franz-go): client
// options from configuration, topic provisioning and what a command and an
// event are on Kafka (docs/architecture.md#topics-keys-and-headers), reading
// topics, and consumer lag. The embedded broker of `onceflow dev` and the
// tests is package devbroker.
//
// Role packages use *kgo.Client directly; this package only builds them.
package kafka
