// Package onceflow is the API a team writes its domains against and runs
// them with on the onceflow pipeline.
//
// A Domain declares one domain: its aggregate types (Aggregate: a decider
// and the Avro schemas of its commands and state), the schema of its
// events, its read models (projections and their migrations) and its HTTP
// routes (Route) and queries (Query). docs/your-first-domain.md builds one;
// examples/ledger and examples/inventory are two.
//
// A program runs domains in one of two ways. The command line, package
// github.com/onceflow/onceflow/cli, makes a binary of them: cli.Main is
// every component, `dev` and the operator commands, configured by
// environment variables and flags (it lives above this package, as the
// command line should: docs/decisions/0061-main-is-cli-main.md).
// Or the program builds the typed
// configuration itself: a Config (the domains, Kafka, Postgres, the schema
// registry) in a RunConfig for RunComponents (the components it selects,
// as one process) or in a DevConfig for dev.Run (package
// github.com/onceflow/onceflow/dev, the embedded default: a
// Kafka-compatible broker, a schema registry, Postgres and every component
// in one process). Config.Deployment resolves the names every component
// and operator command agrees on (docs/architecture.md#topics-keys-and-headers).
//
// This package also assembles the library (the pipeline packages) from
// that configuration, in one place, so a component started on its own and
// the same component inside `onceflow dev` are built the same way.
package onceflow
