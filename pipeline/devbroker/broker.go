// Package devbroker is the embedded Kafka-compatible broker that `onceflow
// dev` and the tests run: franz-go's kfake with a data directory, so its
// topics survive restarts, and the repair of what a crash of it leaves
// (crash.go; docs/decisions/0052-embedded-broker-crashes.md). It is a
// development broker; the Kafka client adapter is package kafka.
package devbroker

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"

	"github.com/twmb/franz-go/pkg/kfake"
)

// Config configures the embedded broker.
type Config struct {
	// Addr is host:port to listen on. The host must be 127.0.0.1 (kfake
	// listens on loopback only). Port 0 picks a free port. Default
	// "127.0.0.1:9092".
	Addr string
	// DataDir persists topics, offsets, groups and producer state; a
	// restarted broker on the same directory continues where it stopped.
	// Empty keeps everything in memory.
	DataDir string
	// SyncWrites fsyncs every produced batch (slower, survives power loss);
	// without it a killed broker process loses nothing the OS has seen.
	SyncWrites bool
	// Configs are broker-level configs (message.max.bytes,
	// transaction.max.timeout.ms, ...).
	Configs map[string]string
	// Logger receives the broker's warnings; nil is silent.
	Logger *slog.Logger
	// Opts are extra kfake options (tests: session timeouts, faults).
	Opts []kfake.Opt
}

// Broker is the embedded Kafka-compatible broker: franz-go's kfake, one
// node, speaking the Kafka protocol with transactions, read_committed,
// consumer groups and persistence. Real clients (franz-go, kcat, the Java
// client) connect to it as to any broker.
type Broker struct {
	cluster *kfake.Cluster
	dataDir string
}

// Start starts the broker and returns once it listens.
func Start(cfg Config) (*Broker, error) {
	addr := cfg.Addr
	if addr == "" {
		addr = "127.0.0.1:9092"
	}
	host, portStr, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, fmt.Errorf("broker address %q: %w", addr, err)
	}
	if host != "127.0.0.1" && host != "localhost" && host != "" {
		return nil, fmt.Errorf("broker address %q: the embedded broker listens on 127.0.0.1 only", addr)
	}
	port, err := strconv.Atoi(portStr)
	if err != nil {
		return nil, fmt.Errorf("broker port %q: %w", portStr, err)
	}
	opts := []kfake.Opt{kfake.NumBrokers(1), kfake.ClusterID("onceflow-dev")}
	if cfg.SyncWrites {
		opts = append(opts, kfake.SyncWrites())
	}
	if len(cfg.Configs) > 0 {
		opts = append(opts, kfake.BrokerConfigs(cfg.Configs))
	}
	if cfg.Logger != nil {
		opts = append(opts, kfake.WithLogger(kfakeLogger{cfg.Logger}))
	}
	opts = append(opts, cfg.Opts...)
	if cfg.DataDir != "" {
		n, err := abortLeftOpen(cfg.DataDir, opts)
		if err != nil {
			return nil, fmt.Errorf("recover the embedded broker's data directory %s: %w", cfg.DataDir, err)
		}
		if n > 0 && cfg.Logger != nil {
			cfg.Logger.Warn("the broker had stopped without closing; aborted the transactions it left open",
				"partitions", n, "data_dir", cfg.DataDir)
		}
		opts = append(opts, kfake.DataDir(cfg.DataDir))
	}
	if port != 0 { // kfake picks a free port by itself
		opts = append(opts, kfake.Ports(port))
	}
	c, err := kfake.NewCluster(opts...)
	if err != nil {
		return nil, fmt.Errorf("start embedded broker: %w", err)
	}
	return &Broker{cluster: c, dataDir: cfg.DataDir}, nil
}

// Addrs returns the broker's listen addresses (for KAFKA_BROKERS).
func (b *Broker) Addrs() []string { return b.cluster.ListenAddrs() }

// Cluster exposes kfake for fault injection in tests.
func (b *Broker) Cluster() *kfake.Cluster { return b.cluster }

// Close stops the broker, flushing its data directory and marking it
// cleanly stopped (see crash.go).
func (b *Broker) Close() {
	b.cluster.Close()
	if b.dataDir != "" {
		os.WriteFile(filepath.Join(b.dataDir, cleanStopFile), nil, 0o600)
	}
}

// Run blocks until ctx ends, then closes the broker.
func (b *Broker) Run(ctx context.Context) error {
	<-ctx.Done()
	b.Close()
	return nil
}

type kfakeLogger struct{ l *slog.Logger }

func (k kfakeLogger) Logf(level kfake.LogLevel, msg string, args ...any) {
	var lvl slog.Level
	switch level {
	case kfake.LogLevelError:
		lvl = slog.LevelError
	case kfake.LogLevelWarn:
		lvl = slog.LevelWarn
	default:
		return // info and debug are per-request chatter
	}
	k.l.Log(context.Background(), lvl, "embedded broker", "detail", fmt.Sprintf(msg, args...))
}
