// Command kafkactl starts, stops and describes the local Apache Kafka
// clusters of `make kafka-up`, `make kafka-down` and `make kafka-logs`
// (package kafkacluster):
//
//	kafkactl up [-nodes 1] [-port 19092] [-dir .data/apache-kafka] [-cache DIR] [-heap 512] [-secure]
//	kafkactl down [-dir .data/apache-kafka] [-timeout 30s]
//	kafkactl logs [-dir .data/apache-kafka]
//	kafkactl fetch [-cache .data/apache-kafka]
//
// A cluster of N nodes lives in DIR/nodes-N (DIR/nodes-N-secure with
// -secure); up prints its bootstrap address on its last line.
//
// fetch only fetches the jars (when missing) and prints their directory
// (scripts/images.sh builds the local stack's Kafka image from it).
//
// -secure starts it with SASL_SSL listeners and ACLs
// (kafkacluster.Security): a SCRAM-SHA-512 user per onceflow component
// and the operator, each with no ACL yet. up writes, into the cluster's
// directory, env/USER.env (the settings that connect onceflow as USER)
// and bin/ (Apache Kafka's tools, kafka-acls.sh among them), and prints
// how to grant the ACLs of docs/security.md#kafka-acls with
// scripts/kafka-acls.sh.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/onceflow/onceflow/test/kafkacluster"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "kafkactl:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string, stdout io.Writer) error {
	if len(args) == 0 {
		return errors.New("want up, down, logs or fetch")
	}
	fs := flag.NewFlagSet("kafkactl "+args[0], flag.ContinueOnError)
	dir := fs.String("dir", filepath.Join(".data", "apache-kafka"), "where the clusters live (nodes-N)")
	cache := fs.String("cache", "", "where the jars live; empty: -dir")
	nodes := fs.Int("nodes", 1, "nodes of the cluster (KAFKA_NODES): 1, or 3 for replication factor 3 and min.insync.replicas 2")
	port := fs.Int("port", 19092, "node i's broker listens on 127.0.0.1:port+2(i-1), its controller one above (KAFKA_PORT)")
	heap := fs.Int("heap", 512, "each node's JVM heap in MB")
	secure := fs.Bool("secure", false, "SASL_SSL listeners, a SCRAM user per onceflow component, ACLs on (KAFKA_SECURE=1; docs/security.md#kafka-acls)")
	timeout := fs.Duration("timeout", 30*time.Second, "down: how long a node may take to stop after SIGTERM before SIGKILL")
	if err := fs.Parse(args[1:]); err != nil {
		return err
	}
	switch args[0] {
	case "up":
		if *cache == "" {
			*cache = *dir
		}
		return up(ctx, stdout, *dir, *cache, *nodes, *port, *heap, *secure)
	case "down":
		return down(stdout, *dir, *timeout)
	case "logs":
		return logs(stdout, *dir)
	case "fetch":
		if *cache == "" {
			*cache = *dir
		}
		lib, err := kafkacluster.Fetch(ctx, *cache)
		if err != nil {
			return err
		}
		fmt.Fprintln(stdout, lib)
		return nil
	}
	return fmt.Errorf("unknown command %q: want up, down, logs or fetch", args[0])
}

func up(ctx context.Context, stdout io.Writer, dir, cache string, nodes, port, heap int, secure bool) error {
	clusterDir := filepath.Join(dir, fmt.Sprintf("nodes-%d", nodes))
	var sec *kafkacluster.Security
	if secure {
		clusterDir += "-secure"
		sec = &kafkacluster.Security{Users: principals, ACLs: true}
	}
	if c, err := kafkacluster.Open(clusterDir); err == nil {
		if err := c.WaitReady(ctx); err != nil {
			return err
		}
		fmt.Fprintf(stdout, "Apache Kafka %s, %d node(s), already running in %s\n", kafkacluster.Version, nodes, clusterDir)
		if secure {
			printSecured(stdout, c)
		}
		fmt.Fprintln(stdout, c.Bootstrap())
		return nil
	}
	if others := running(dir); len(others) > 0 {
		return fmt.Errorf("another cluster runs in %v: make kafka-down first", others)
	}
	start := time.Now()
	lib, err := kafkacluster.Fetch(ctx, cache)
	if err != nil {
		return err
	}
	fetched := time.Since(start)
	ctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	c, err := kafkacluster.Start(ctx, kafkacluster.Config{
		Dir: clusterDir, Nodes: nodes, BasePort: port, HeapMB: heap, LibDir: lib, Detach: true, Log: stdout, Security: sec,
	})
	if err != nil {
		return err
	}
	if secure {
		if err := writeSecured(c); err != nil {
			return err
		}
	}
	fmt.Fprintf(stdout, "Apache Kafka %s, %d node(s), ready in %.1fs (jars %.1fs); logs: make kafka-logs; stop: make kafka-down\n",
		kafkacluster.Version, nodes, time.Since(start).Seconds(), fetched.Seconds())
	if secure {
		printSecured(stdout, c)
	} else {
		fmt.Fprintf(stdout, "Run onceflow on it with KAFKA_BROKERS=%s\n", c.Bootstrap())
	}
	fmt.Fprintln(stdout, c.Bootstrap())
	return nil
}

// principals are the users of a secured cluster: one per onceflow
// component, and the operator's (docs/security.md#kafka-acls).
var principals = []string{"ingest", "relay", "processor", "projector", "worker", "operator"}

// writeSecured writes into a secured cluster's directory what connects to
// it: env/USER.env, the settings of onceflow as USER, and bin/, Apache
// Kafka's tools.
func writeSecured(c *kafkacluster.Cluster) error {
	envDir := filepath.Join(c.Dir(), "env")
	if err := os.MkdirAll(envDir, 0o700); err != nil {
		return err
	}
	for _, u := range principals {
		env := fmt.Sprintf("KAFKA_BROKERS=%s\nKAFKA_TLS=true\nKAFKA_TLS_CA_FILE=%s\nKAFKA_SASL_MECHANISM=%s\nKAFKA_SASL_USER=%s\nKAFKA_SASL_PASSWORD=%s\n",
			c.Bootstrap(), c.CAFile(), kafkacluster.SCRAMMechanism, u, c.Password(u))
		if err := os.WriteFile(filepath.Join(envDir, u+".env"), []byte(env), 0o600); err != nil {
			return err
		}
	}
	return c.WriteTools(filepath.Join(c.Dir(), "bin"))
}

// printSecured says how to grant a secured cluster's ACLs and run
// onceflow on it.
func printSecured(stdout io.Writer, c *kafkacluster.Cluster) {
	fmt.Fprintf(stdout, `SASL_SSL (%s over TLS; the CA is %s), ACLs on, no ACL granted yet.
Grant each component its role's ACLs (docs/security.md#kafka-acls), for the topic prefix you run:
  PATH=%s:$PATH BOOTSTRAP=%s COMMAND_CONFIG=%s PREFIX=ledger \
  PROCESSOR_GROUP=onceflow-processor PROJECTOR_GROUP=onceflow-projector scripts/kafka-acls.sh
The operator makes the topics; then each component runs as its own user (env/USER.env),
its other settings (DATABASE_URL, SCHEMA_REGISTRY_URL, ...) beside:
  env $(cat %s) bin/onceflow topics create
  env $(cat %s) DATABASE_URL=... SCHEMA_REGISTRY_URL=... bin/relay
`, kafkacluster.SCRAMMechanism, c.CAFile(), filepath.Join(c.Dir(), "bin"), c.Bootstrap(), c.ToolConfig(),
		filepath.Join(c.Dir(), "env", "operator.env"), filepath.Join(c.Dir(), "env", "relay.env"))
}

// running returns the directories of the clusters under dir with a node
// running.
func running(dir string) []string {
	matches, _ := filepath.Glob(filepath.Join(dir, "nodes-*"))
	var out []string
	for _, m := range matches {
		if _, err := kafkacluster.Open(m); err == nil {
			out = append(out, m)
		}
	}
	return out
}

func down(stdout io.Writer, dir string, timeout time.Duration) error {
	matches, _ := filepath.Glob(filepath.Join(dir, "nodes-*"))
	stopped := 0
	for _, m := range matches {
		c, err := kafkacluster.Open(m)
		if err != nil {
			continue
		}
		if err := c.Stop(timeout); err != nil {
			fmt.Fprintln(stdout, err)
		}
		fmt.Fprintf(stdout, "stopped the cluster in %s (its topics stay; remove the directory to start afresh)\n", m)
		stopped++
	}
	if stopped == 0 {
		fmt.Fprintln(stdout, "no local Apache Kafka cluster is running")
	}
	return nil
}

func logs(stdout io.Writer, dir string) error {
	matches, _ := filepath.Glob(filepath.Join(dir, "nodes-*"))
	if len(matches) == 0 {
		return fmt.Errorf("no cluster in %s: make kafka-up first", dir)
	}
	for _, m := range matches {
		c, err := kafkacluster.Open(m)
		state := "running"
		if kafkacluster.IsNotRunning(err) {
			state = "stopped"
		} else if err != nil {
			continue
		}
		fmt.Fprintf(stdout, "%s (%s):\n", m, state)
		for _, n := range c.Nodes() {
			fmt.Fprintf(stdout, "  node %d  %s  log %s  (JVM output %s)\n", n.ID, n.Addr, n.LogPath(), filepath.Join(n.Dir, "stdout.log"))
		}
		if state == "running" {
			fmt.Fprintf(stdout, "  Apache Kafka's tools (kafka-topics; TransactionsCommand, MetadataQuorumCommand, consumer.group.ConsumerGroupCommand alike):\n    %s --describe\n",
				shellLine(c.Tool("org.apache.kafka.tools.TopicCommand")))
		}
	}
	fmt.Fprintln(stdout, "Follow one with tail -F LOG.")
	return nil
}

// shellLine joins args for a shell, quoting the class path's wildcard.
func shellLine(args []string) string {
	out := make([]string, len(args))
	for i, a := range args {
		if strings.Contains(a, "*") {
			a = "'" + a + "'"
		}
		out[i] = a
	}
	return strings.Join(out, " ")
}
