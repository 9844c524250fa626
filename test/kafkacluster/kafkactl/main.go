// Command kafkactl starts, stops and describes the local Apache Kafka
// clusters of `make kafka-up`, `make kafka-down` and `make kafka-logs`
// (package kafkacluster):
//
//	kafkactl up [-nodes 1] [-port 19092] [-dir .data/apache-kafka] [-cache DIR] [-heap 512]
//	kafkactl down [-dir .data/apache-kafka] [-timeout 30s]
//	kafkactl logs [-dir .data/apache-kafka]
//
// A cluster of N nodes lives in DIR/nodes-N; up prints its bootstrap
// address on its last line.
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
		return errors.New("want up, down or logs")
	}
	fs := flag.NewFlagSet("kafkactl "+args[0], flag.ContinueOnError)
	dir := fs.String("dir", filepath.Join(".data", "apache-kafka"), "where the clusters live (nodes-N)")
	cache := fs.String("cache", "", "where the jars live; empty: -dir")
	nodes := fs.Int("nodes", 1, "nodes of the cluster (KAFKA_NODES): 1, or 3 for replication factor 3 and min.insync.replicas 2")
	port := fs.Int("port", 19092, "node i's broker listens on 127.0.0.1:port+2(i-1), its controller one above (KAFKA_PORT)")
	heap := fs.Int("heap", 512, "each node's JVM heap in MB")
	timeout := fs.Duration("timeout", 30*time.Second, "down: how long a node may take to stop after SIGTERM before SIGKILL")
	if err := fs.Parse(args[1:]); err != nil {
		return err
	}
	switch args[0] {
	case "up":
		if *cache == "" {
			*cache = *dir
		}
		return up(ctx, stdout, *dir, *cache, *nodes, *port, *heap)
	case "down":
		return down(stdout, *dir, *timeout)
	case "logs":
		return logs(stdout, *dir)
	}
	return fmt.Errorf("unknown command %q: want up, down or logs", args[0])
}

func up(ctx context.Context, stdout io.Writer, dir, cache string, nodes, port, heap int) error {
	clusterDir := filepath.Join(dir, fmt.Sprintf("nodes-%d", nodes))
	if c, err := kafkacluster.Open(clusterDir); err == nil {
		if err := c.WaitReady(ctx); err != nil {
			return err
		}
		fmt.Fprintf(stdout, "Apache Kafka %s, %d node(s), already running in %s\n%s\n", kafkacluster.Version, nodes, clusterDir, c.Bootstrap())
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
		Dir: clusterDir, Nodes: nodes, BasePort: port, HeapMB: heap, LibDir: lib, Detach: true, Log: stdout,
	})
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "Apache Kafka %s, %d node(s), ready in %.1fs (jars %.1fs); logs: make kafka-logs; stop: make kafka-down\n",
		kafkacluster.Version, nodes, time.Since(start).Seconds(), fetched.Seconds())
	fmt.Fprintf(stdout, "Run onceflow on it with KAFKA_BROKERS=%s\n%s\n", c.Bootstrap(), c.Bootstrap())
	return nil
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
