package cli

import (
	"bytes"
	"context"
	"flag"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/onceflow/onceflow"
	"github.com/onceflow/onceflow/pipeline/jobs"
	"github.com/onceflow/onceflow/pipeline/webhooks"
)

// A malformed number in the environment stops the start with its name and
// value, rather than becoming 0 and an error about 0.
func TestMalformedNumericVariable(t *testing.T) {
	env := map[string]string{"ONCEFLOW_OUTBOX_SHARDS": "16x", "ONCEFLOW_PARTITIONS": "8"}
	fs := flag.NewFlagSet("test", flag.ContinueOnError)
	c := Register(fs, func(k string) string { return env[k] })
	if err := fs.Parse(nil); err != nil {
		t.Fatal(err)
	}
	_, err := c.Stack(slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err == nil || !strings.Contains(err.Error(), `ONCEFLOW_OUTBOX_SHARDS="16x"`) {
		t.Fatalf("Stack with ONCEFLOW_OUTBOX_SHARDS=16x: %v, want an error naming it", err)
	}
}

// secretEnv sets every variable that holds a secret to a value the tests
// look for in what a binary prints.
var secretEnv = map[string]string{
	"DATABASE_URL":             "postgres://onceflow:SECRET-DB@db.example:5432/onceflow",
	"DATABASE_MIGRATION_URL":   "postgres://owner:SECRET-OWNER@db.example:5432/onceflow",
	"KAFKA_SASL_MECHANISM":     "PLAIN",
	"KAFKA_SASL_USER":          "onceflow",
	"KAFKA_SASL_PASSWORD":      "SECRET-SASL",
	"SCHEMA_REGISTRY_URL":      "https://onceflow:SECRET-REGURL@registry.example",
	"SCHEMA_REGISTRY_PASSWORD": "SECRET-REGPW",
	"ONCEFLOW_ADMIN_TOKEN":     "SECRET-ADMIN",
}

// Neither -h nor a flag error of any component prints a secret: secret
// flags have no default to show, only "(set)".
func TestUsageHidesSecrets(t *testing.T) {
	getenv := func(k string) string { return secretEnv[k] }
	for _, name := range []string{"ingest", "relay", "processor", "projector"} {
		for _, args := range [][]string{{"-h"}, {"-no-such-flag"}, {"-partitions", "many"}, {"extra"}, {"-log-level", "error"}} {
			var out bytes.Buffer
			err := runComponent(context.Background(), name, onceflow.Components{Relay: true}, nil, args, getenv, &out)
			if err == nil {
				t.Fatalf("%s %v succeeded", name, args)
			}
			text := out.String() + err.Error()
			if strings.Contains(text, "SECRET") {
				t.Errorf("%s %v prints a secret:\n%s", name, args, text)
			}
			if args[0] == "-h" && !strings.Contains(text, "(DATABASE_URL or DATABASE_URL_FILE) (set)") {
				t.Errorf("%s -h does not say DATABASE_URL is set:\n%s", name, text)
			}
		}
	}
}

// A malformed boolean variable stops the start rather than reading as
// false (KAFKA_TLS=yes used to mean no TLS).
func TestBooleanVariables(t *testing.T) {
	for _, tc := range []struct {
		val     string
		want    bool
		wantErr bool
	}{
		{"true", true, false}, {"1", true, false}, {"TRUE", true, false},
		{"false", false, false}, {"0", false, false}, {"", false, false},
		{"yes", false, true}, {"on", false, true},
	} {
		fs := flag.NewFlagSet("test", flag.ContinueOnError)
		c := Register(fs, func(k string) string {
			if k == "KAFKA_TLS" {
				return tc.val
			}
			return ""
		})
		if err := fs.Parse(nil); err != nil {
			t.Fatal(err)
		}
		_, err := c.Stack(slog.New(slog.DiscardHandler))
		if (err != nil) != tc.wantErr || (err == nil && c.TLS != tc.want) {
			t.Errorf("KAFKA_TLS=%q: TLS %v, err %v; want %v, error %v", tc.val, c.TLS, err, tc.want, tc.wantErr)
		}
		if tc.wantErr && (err == nil || !strings.Contains(err.Error(), "KAFKA_TLS")) {
			t.Errorf("KAFKA_TLS=%q: %v, want an error naming KAFKA_TLS", tc.val, err)
		}
	}
}

// SASL without TLS stops the start unless KAFKA_ALLOW_PLAINTEXT_SASL=true.
func TestPlaintextSASLRefused(t *testing.T) {
	for _, allow := range []string{"", "true"} {
		env := map[string]string{"KAFKA_SASL_MECHANISM": "PLAIN", "KAFKA_SASL_USER": "u", "KAFKA_SASL_PASSWORD": "SECRET-SASL",
			"KAFKA_ALLOW_PLAINTEXT_SASL": allow}
		fs := flag.NewFlagSet("test", flag.ContinueOnError)
		c := Register(fs, func(k string) string { return env[k] })
		if err := fs.Parse(nil); err != nil {
			t.Fatal(err)
		}
		cfg, err := c.Stack(slog.New(slog.DiscardHandler))
		if err != nil {
			t.Fatal(err)
		}
		_, err = cfg.Kafka.Opts()
		if (err == nil) != (allow == "true") {
			t.Errorf("KAFKA_ALLOW_PLAINTEXT_SASL=%q: %v", allow, err)
		}
	}
}

// The processor's limits on what a producer may send are set from the
// environment, unset means the processor's defaults, and a bad value
// stops the start naming the variable.
func TestProcessorLimits(t *testing.T) {
	for _, tc := range []struct {
		env       map[string]string
		skew      string
		bytes     int
		wantError string
	}{
		{env: nil},
		{env: map[string]string{"ONCEFLOW_PROCESSOR_MAX_CLOCK_SKEW": "2m", "ONCEFLOW_PROCESSOR_MAX_COMMAND_BYTES": "4096"}, skew: "2m0s", bytes: 4096},
		{env: map[string]string{"ONCEFLOW_PROCESSOR_MAX_CLOCK_SKEW": "soon"}, wantError: `ONCEFLOW_PROCESSOR_MAX_CLOCK_SKEW "soon"`},
		{env: map[string]string{"ONCEFLOW_PROCESSOR_MAX_COMMAND_BYTES": "-1"}, wantError: "ONCEFLOW_PROCESSOR_MAX_COMMAND_BYTES -1"},
	} {
		fs := flag.NewFlagSet("test", flag.ContinueOnError)
		c := Register(fs, func(k string) string { return tc.env[k] })
		if err := fs.Parse(nil); err != nil {
			t.Fatal(err)
		}
		cfg, err := c.Processor()
		if tc.wantError != "" {
			if err == nil || !strings.Contains(err.Error(), tc.wantError) {
				t.Errorf("%v: Processor() = %v, want an error naming %s", tc.env, err, tc.wantError)
			}
			continue
		}
		if err != nil {
			t.Fatalf("%v: %v", tc.env, err)
		}
		skew := ""
		if cfg.MaxClockSkew != 0 {
			skew = cfg.MaxClockSkew.String()
		}
		if skew != tc.skew || cfg.MaxCommandBytes != tc.bytes {
			t.Errorf("%v: skew %q, max command bytes %d; want %q and %d", tc.env, skew, cfg.MaxCommandBytes, tc.skew, tc.bytes)
		}
	}
}

// A secret may come from the file its _FILE variable names (a container
// secret), with the trailing newline editors leave; the variable itself
// wins; a file that cannot be read stops the start, naming the variable.
func TestSecretsFromFiles(t *testing.T) {
	dir := t.TempDir()
	write := func(name, text string) string {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
		return path
	}
	env := map[string]string{
		"KAFKA_SASL_PASSWORD_FILE":      write("sasl", "from-file\n"),
		"SCHEMA_REGISTRY_PASSWORD_FILE": write("registry", "ignored"),
		"SCHEMA_REGISTRY_PASSWORD":      "from-env",
		"DATABASE_URL_FILE":             write("db", "postgres://app@db/onceflow\n"),
	}
	fs := flag.NewFlagSet("test", flag.ContinueOnError)
	c := Register(fs, func(k string) string { return env[k] })
	if err := fs.Parse(nil); err != nil {
		t.Fatal(err)
	}
	if c.SASLPassword != "from-file" || c.SchemaRegistryPassword != "from-env" || c.DatabaseURL != "postgres://app@db/onceflow" {
		t.Errorf("got SASL %q, registry %q, database %q; want from-file, from-env and the file's URL", c.SASLPassword, c.SchemaRegistryPassword, c.DatabaseURL)
	}
	env = map[string]string{"ONCEFLOW_ADMIN_TOKEN_FILE": filepath.Join(dir, "missing")}
	c = Register(flag.NewFlagSet("test", flag.ContinueOnError), func(k string) string { return env[k] })
	if _, err := c.Stack(slog.New(slog.DiscardHandler)); err == nil || !strings.Contains(err.Error(), "ONCEFLOW_ADMIN_TOKEN_FILE") {
		t.Errorf("an unreadable ONCEFLOW_ADMIN_TOKEN_FILE: %v, want an error naming it", err)
	}
}

// DATABASE_MAX_CONNS sizes the pools (default 10) and must be positive;
// ONCEFLOW_TRUSTED_PROXIES is a list of networks, and nothing else.
func TestPoolAndProxySettings(t *testing.T) {
	parse := func(env map[string]string) *Common {
		fs := flag.NewFlagSet("test", flag.ContinueOnError)
		c := Register(fs, func(k string) string { return env[k] })
		if err := fs.Parse(nil); err != nil {
			t.Fatal(err)
		}
		return c
	}
	cfg, err := parse(nil).Stack(slog.New(slog.DiscardHandler))
	if err != nil || cfg.DatabaseMaxConns != onceflow.DefaultDatabaseMaxConns {
		t.Errorf("default pool size %d (%v), want %d", cfg.DatabaseMaxConns, err, onceflow.DefaultDatabaseMaxConns)
	}
	if _, err := parse(map[string]string{"DATABASE_MAX_CONNS": "0"}).Stack(slog.New(slog.DiscardHandler)); err == nil {
		t.Error("DATABASE_MAX_CONNS=0 was accepted")
	}
	icfg, err := parse(map[string]string{"ONCEFLOW_TRUSTED_PROXIES": "10.0.0.0/8, fd00::/8"}).ingest(func(string) string { return "" })
	if err != nil || len(icfg.TrustedProxies) != 2 || icfg.TrustedProxies[1].String() != "fd00::/8" {
		t.Errorf("trusted proxies %v (%v)", icfg.TrustedProxies, err)
	}
	if _, err := parse(map[string]string{"ONCEFLOW_TRUSTED_PROXIES": "10.0.0.1"}).ingest(func(string) string { return "" }); err == nil {
		t.Error("an address without a prefix length was accepted as a network")
	}
}

// The worker's settings: each variable read, each refused with its name.
func TestWorkerSettings(t *testing.T) {
	parse := func(env map[string]string) (jobs.Config, webhooks.Config, error) {
		fs := flag.NewFlagSet("worker", flag.ContinueOnError)
		c := Register(fs, func(k string) string { return env[k] })
		if err := fs.Parse(nil); err != nil {
			t.Fatal(err)
		}
		return c.Worker()
	}
	w, h, err := parse(nil)
	if err != nil || w.Lease != jobs.DefaultLease || w.MaxAttempts != jobs.DefaultMaxAttempts || h.Timeout != webhooks.DefaultTimeout || len(h.Allow) != 0 {
		t.Fatalf("defaults: %+v %+v %v", w, h, err)
	}
	w, h, err = parse(map[string]string{"ONCEFLOW_WORKER_LEASE": "4s", "ONCEFLOW_WORKER_ATTEMPT_TIMEOUT": "3s", "ONCEFLOW_WEBHOOK_TIMEOUT": "2s",
		"ONCEFLOW_WORKER_MAX_ATTEMPTS": "3", "ONCEFLOW_WEBHOOK_ALLOW_NETWORKS": "10.0.0.0/8, 192.168.1.7/32", "ONCEFLOW_WORKER_QUEUE": "q"})
	if err != nil || w.Lease != 4*time.Second || w.AttemptTimeout != 3*time.Second || h.Timeout != 2*time.Second || w.MaxAttempts != 3 ||
		len(h.Allow) != 2 || w.Queue != "q" {
		t.Fatalf("set: %+v %+v %v", w, h, err)
	}
	for env, want := range map[string]string{
		"ONCEFLOW_WORKER_LEASE=soon":             "ONCEFLOW_WORKER_LEASE",
		"ONCEFLOW_WORKER_MAX_ATTEMPTS=0":         "ONCEFLOW_WORKER_MAX_ATTEMPTS",
		"ONCEFLOW_WEBHOOK_ALLOW_NETWORKS=10.0.0": "ONCEFLOW_WEBHOOK_ALLOW_NETWORKS",
		"ONCEFLOW_WEBHOOK_TIMEOUT=40s":           "ONCEFLOW_WEBHOOK_TIMEOUT",
		"ONCEFLOW_WORKER_ATTEMPT_TIMEOUT=2m":     "ONCEFLOW_WORKER_ATTEMPT_TIMEOUT",
		"ONCEFLOW_WEBHOOK_MAX_PER_TENANT=0":      "ONCEFLOW_WEBHOOK_MAX_PER_TENANT",
	} {
		k, v, _ := strings.Cut(env, "=")
		if _, _, err := parse(map[string]string{k: v}); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: got %v, want an error naming %s", env, err, want)
		}
	}
}
