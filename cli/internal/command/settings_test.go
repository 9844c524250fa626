package command

import (
	"bytes"
	"context"
	"encoding/base64"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/onceflow/onceflow"
	"github.com/onceflow/onceflow/pipeline"
	"github.com/onceflow/onceflow/pipeline/jobs"
	"github.com/onceflow/onceflow/pipeline/webhooks"
)

// configure reads the settings of the command called name from env, as
// the command itself reads them.
func configure(name string, env map[string]string) (*config, error) {
	c, _, err := commands[name].parse(nil, nil, func(k string) string { return env[k] }, &bytes.Buffer{}, nil)
	return c, err
}

// started runs the command args name (Main's arguments) with env, up to
// the runner it starts (RunDev or RunComponents), and returns the
// configuration the runner got.
func started(t *testing.T, args []string, env map[string]string) (onceflow.DevConfig, error) {
	t.Helper()
	var got onceflow.DevConfig
	dev, components, exporter, runDev := runDevStack, runComponents, newExporter, RunDev
	t.Cleanup(func() { runDevStack, runComponents, newExporter, RunDev = dev, components, exporter, runDev })
	RunDev = func(context.Context, onceflow.DevConfig) error { return nil }
	runDevStack = func(_ context.Context, dc onceflow.DevConfig) error { got = dc; return nil }
	runComponents = func(_ context.Context, rc onceflow.RunConfig) error { got.RunConfig = rc; return nil }
	exportedTo = ""
	newExporter = func(_ context.Context, url, _ string) (*sdktrace.TracerProvider, error) {
		exportedTo = url
		return sdktrace.NewTracerProvider(), nil
	}
	var out bytes.Buffer
	err := Run(context.Background(), nil, args, func(k string) string { return env[k] }, &out)
	if err != nil {
		err = fmt.Errorf("%w\n%s", err, out.String())
	}
	return got, err
}

// exportedTo is where the command of started would export its spans ("":
// nowhere).
var exportedTo string

// listed are the settings a command's -h lists: its flags and the
// variables it reads alone.
func listed(t *testing.T, name string) []string {
	t.Helper()
	var out bytes.Buffer
	if err := Run(context.Background(), nil, append(strings.Fields(name), "-h"), func(string) string { return "" }, &out); err == nil || !strings.Contains(err.Error(), "help requested") {
		t.Fatalf("%s -h: %v", name, err)
	}
	var names []string
	for _, m := range regexp.MustCompile(`(?m)^  (-[a-z-]+|[A-Z_]+ \(environment only\))`).FindAllStringSubmatch(out.String(), -1) {
		names = append(names, strings.Fields(m[1])[0])
	}
	return names
}

// sample is a value of one setting, other than its default, and what it
// becomes in the configuration of the components that use it.
type sample struct {
	value string
	env   map[string]string // other variables it needs
	// got is the setting where its components read it.
	got  func(onceflow.DevConfig) any
	want any
}

func samples(t *testing.T) map[string]sample {
	providers := filepath.Join(t.TempDir(), "providers.json")
	if err := os.WriteFile(providers, []byte(`{"providers": [{"name": "payments", "scheme": "standard-webhooks", "secrets_env": "PAYMENTS_SECRETS",
		"tenant": "acme", "aggregate_id": "/data/account_id", "events": {"account.opened": {"command": "OpenAccount", "fields": {"currency": "/data/currency"}}}}]}`), 0o600); err != nil {
		t.Fatal(err)
	}
	secret := "whsec_" + base64.StdEncoding.EncodeToString([]byte("settings-test-secret-0123456789ab"))
	return map[string]sample{
		"-kafka-brokers":                    {value: "127.0.0.1:19093", got: func(d onceflow.DevConfig) any { return d.Kafka.Brokers[0] }, want: "127.0.0.1:19093"},
		"-kafka-sasl-mechanism":             {value: "SCRAM-SHA-256", got: func(d onceflow.DevConfig) any { return d.Kafka.SASLMechanism }, want: "SCRAM-SHA-256"},
		"-kafka-sasl-user":                  {value: "u", got: func(d onceflow.DevConfig) any { return d.Kafka.SASLUser }, want: "u"},
		"-kafka-sasl-password":              {value: "p", got: func(d onceflow.DevConfig) any { return d.Kafka.SASLPassword }, want: "p"},
		"-kafka-tls":                        {value: "true", got: func(d onceflow.DevConfig) any { return d.Kafka.TLS }, want: true},
		"-kafka-tls-ca-file":                {value: "/ca.pem", got: func(d onceflow.DevConfig) any { return d.Kafka.TLSCAFile }, want: "/ca.pem"},
		"-kafka-allow-plaintext-sasl":       {value: "true", got: func(d onceflow.DevConfig) any { return d.Kafka.AllowPlaintextSASL }, want: true},
		"-kafka-max-decompress-batch-bytes": {value: "33554432", got: func(d onceflow.DevConfig) any { return d.Kafka.MaxDecompressBatchBytes }, want: 33554432},
		"-kafka-max-decompress-poll-bytes":  {value: "134217728", got: func(d onceflow.DevConfig) any { return d.Kafka.MaxDecompressPollBytes }, want: 134217728},
		"-schema-registry-url":              {value: "http://r.example", got: func(d onceflow.DevConfig) any { return d.SchemaRegistry.URL }, want: "http://r.example"},
		"-schema-registry-user":             {value: "u", got: func(d onceflow.DevConfig) any { return d.SchemaRegistry.User }, want: "u"},
		"-schema-registry-password":         {value: "p", got: func(d onceflow.DevConfig) any { return d.SchemaRegistry.Password }, want: "p"},
		"-schema-registry-ca-file":          {value: "/ca.pem", got: func(d onceflow.DevConfig) any { return d.SchemaRegistry.CAFile }, want: "/ca.pem"},
		"-database-url":                     {value: "postgres://a@db/x", got: func(d onceflow.DevConfig) any { return d.DatabaseURL }, want: "postgres://a@db/x"},
		"-database-migration-url":           {value: "postgres://o@db/x", got: func(d onceflow.DevConfig) any { return d.DatabaseMigrationURL }, want: "postgres://o@db/x"},
		"-database-max-conns":               {value: "7", got: func(d onceflow.DevConfig) any { return d.DatabaseMaxConns }, want: int32(7)},
		"-topic-prefix":                     {value: "p", got: func(d onceflow.DevConfig) any { return d.Topics.Prefix }, want: "p"},
		"-partitions":                       {value: "5", got: func(d onceflow.DevConfig) any { return d.Topics.Partitions }, want: int32(5)},
		"-dedup-window": {value: "48h", got: func(d onceflow.DevConfig) any {
			return []time.Duration{d.Processor.DedupWindow, d.Topics.DedupRetention}
		},
			want: []time.Duration{48 * time.Hour, 72 * time.Hour}},
		"-admin-addr":            {value: "127.0.0.1:1", got: func(d onceflow.DevConfig) any { return d.AdminAddr }, want: "127.0.0.1:1"},
		"-admin-token":           {value: "t", got: func(d onceflow.DevConfig) any { return d.AdminToken }, want: "t"},
		"-instance-id":           {value: "i-7", got: func(d onceflow.DevConfig) any { return d.InstanceID }, want: "i-7"},
		"-lag-export":            {value: "off", got: func(d onceflow.DevConfig) any { return d.LagExport }, want: "off"},
		"-log-level":             {value: "debug", got: func(d onceflow.DevConfig) any { return d.Logger.Enabled(context.Background(), slog.LevelDebug) }, want: true},
		"-otlp-endpoint":         {value: "http://127.0.0.1:4318", got: func(onceflow.DevConfig) any { return exportedTo }, want: "http://127.0.0.1:4318/v1/traces"},
		"-otlp-traces-endpoint":  {value: "http://127.0.0.1:4318/custom", got: func(onceflow.DevConfig) any { return exportedTo }, want: "http://127.0.0.1:4318/custom"},
		"-log-format":            {value: "json", got: func(d onceflow.DevConfig) any { return fmt.Sprintf("%T", d.Logger.Handler()) }, want: "*slog.JSONHandler"},
		"-outbox-shards":         {value: "3", got: func(d onceflow.DevConfig) any { return d.OutboxShards }, want: 3},
		"-idempotency-retention": {value: "2h", got: func(d onceflow.DevConfig) any { return d.IdempotencyRetention }, want: 2 * time.Hour},
		"-http-addr":             {value: "127.0.0.1:2", got: func(d onceflow.DevConfig) any { return d.HTTPAddr }, want: "127.0.0.1:2"},
		"-tenant-rate-limit":     {value: "5", got: func(d onceflow.DevConfig) any { return d.TenantRateLimit }, want: 5.0},
		"-trusted-proxies":       {value: "10.0.0.0/8", got: func(d onceflow.DevConfig) any { return fmt.Sprint(d.Ingest.TrustedProxies) }, want: "[10.0.0.0/8]"},
		"-inbound-config": {value: providers, env: map[string]string{"PAYMENTS_SECRETS": secret},
			got: func(d onceflow.DevConfig) any { return len(d.Ingest.Providers) }, want: 1},
		"-ingest-write-timeout":         {value: "45s", got: func(d onceflow.DevConfig) any { return d.Ingest.WriteTimeout }, want: 45 * time.Second},
		"-inbound-retention":            {value: "2h", got: func(d onceflow.DevConfig) any { return d.Ingest.InboundRetention }, want: 2 * time.Hour},
		"-relay-lease":                  {value: "3s", got: func(d onceflow.DevConfig) any { return d.Relay.LeaseDuration }, want: 3 * time.Second},
		"-relay-batch-size":             {value: "7", got: func(d onceflow.DevConfig) any { return d.Relay.BatchSize }, want: 7},
		"-reconcile-interval":           {value: "5m", got: func(d onceflow.DevConfig) any { return d.Reconcile.Interval }, want: 5 * time.Minute},
		"-processor-session-timeout":    {value: "7s", got: func(d onceflow.DevConfig) any { return d.Processor.SessionTimeout }, want: 7 * time.Second},
		"-processor-max-clock-skew":     {value: "2m", got: func(d onceflow.DevConfig) any { return d.Processor.MaxClockSkew }, want: 2 * time.Minute},
		"-processor-max-command-age":    {value: "720h", got: func(d onceflow.DevConfig) any { return d.Processor.MaxCommandAge }, want: 720 * time.Hour},
		"-processor-max-command-bytes":  {value: "4096", got: func(d onceflow.DevConfig) any { return d.Processor.MaxCommandBytes }, want: 4096},
		"-projector-session-timeout":    {value: "7s", got: func(d onceflow.DevConfig) any { return d.Projector.SessionTimeout }, want: 7 * time.Second},
		"-projector-parallelism":        {value: "3", got: func(d onceflow.DevConfig) any { return d.Projector.Parallelism }, want: 3},
		"-projector-synchronous-commit": {value: "true", got: func(d onceflow.DevConfig) any { return d.Projector.SynchronousCommit }, want: true},
		"-worker-queue":                 {value: "q", got: func(d onceflow.DevConfig) any { return d.Worker.Queue }, want: "q"},
		"-worker-max-workers":           {value: "3", got: func(d onceflow.DevConfig) any { return d.Worker.MaxWorkers }, want: 3},
		"-worker-backlog-workers":       {value: "4", got: func(d onceflow.DevConfig) any { return d.Worker.BacklogWorkers }, want: 4},
		"-worker-lease":                 {value: "30s", got: func(d onceflow.DevConfig) any { return d.Worker.Lease }, want: 30 * time.Second},
		"-worker-attempt-timeout":       {value: "20s", got: func(d onceflow.DevConfig) any { return d.Worker.AttemptTimeout }, want: 20 * time.Second},
		"-worker-max-attempts":          {value: "3", got: func(d onceflow.DevConfig) any { return d.Worker.MaxAttempts }, want: 3},
		"-worker-base-delay":            {value: "2s", got: func(d onceflow.DevConfig) any { return d.Worker.BaseDelay }, want: 2 * time.Second},
		"-worker-max-delay":             {value: "3m", got: func(d onceflow.DevConfig) any { return d.Worker.MaxDelay }, want: 3 * time.Minute},
		"-webhook-timeout":              {value: "3s", got: func(d onceflow.DevConfig) any { return d.Webhooks.Timeout }, want: 3 * time.Second},
		"-webhook-allow-networks":       {value: "127.0.0.1/32", got: func(d onceflow.DevConfig) any { return fmt.Sprint(d.Webhooks.Allow) }, want: "[127.0.0.1/32]"},
		"-webhook-breaker-failures":     {value: "3", got: func(d onceflow.DevConfig) any { return d.Webhooks.BreakerFailures }, want: 3},
		"-webhook-breaker-cooldown":     {value: "7s", got: func(d onceflow.DevConfig) any { return d.Webhooks.BreakerCooldown }, want: 7 * time.Second},
		"-webhook-max-per-tenant":       {value: "3", got: func(d onceflow.DevConfig) any { return d.Webhooks.MaxPerTenant }, want: 3},
		"-nats-url":                     {value: "nats://127.0.0.1:1", got: func(d onceflow.DevConfig) any { return d.NATSink.URL }, want: "nats://127.0.0.1:1"},
		"-nats-creds-file":              {value: "/u.creds", got: func(d onceflow.DevConfig) any { return d.NATSink.CredsFile }, want: "/u.creds"},
		"-nats-ca-file":                 {value: "/ca.pem", got: func(d onceflow.DevConfig) any { return d.NATSink.CAFile }, want: "/ca.pem"},
		"-nats-duplicate-window":        {value: "1h", got: func(d onceflow.DevConfig) any { return d.NATSink.DuplicateWindow }, want: time.Hour},
		"-nats-stream-replicas":         {value: "5", got: func(d onceflow.DevConfig) any { return d.NATSink.Replicas }, want: 5},
		"-nats-allow-single-replica":    {value: "true", got: func(d onceflow.DevConfig) any { return d.NATSink.AllowSingleReplica }, want: true},
		"-nats-max-in-flight":           {value: "1", got: func(d onceflow.DevConfig) any { return d.NATSink.MaxInFlight }, want: 1},
		"-nats-session-timeout":         {value: "3s", got: func(d onceflow.DevConfig) any { return d.NATSink.SessionTimeout }, want: 3 * time.Second},
		"-webhook-max-pending":          {value: "500", got: func(d onceflow.DevConfig) any { return d.Webhooks.MaxPending }, want: 500},
		"-webhook-retention":            {value: "48h", got: func(d onceflow.DevConfig) any { return d.Webhooks.Retention }, want: 48 * time.Hour},
		"-data-dir":                     {value: "/tmp/x", got: func(d onceflow.DevConfig) any { return d.DataDir }, want: "/tmp/x"},
		"-registry-addr":                {value: "127.0.0.1:3", got: func(d onceflow.DevConfig) any { return d.RegistryAddr }, want: "127.0.0.1:3"},
		"-broker-addr":                  {value: "127.0.0.1:4", got: func(d onceflow.DevConfig) any { return d.BrokerAddr }, want: "127.0.0.1:4"},
		"-broker-only":                  {value: "true", got: func(d onceflow.DevConfig) any { return d.BrokerOnly }, want: true},
		"-group-min-session-timeout":    {value: "2s", got: func(d onceflow.DevConfig) any { return d.GroupMinSessionTimeout }, want: 2 * time.Second},
		"ONCEFLOW_DEV_API_KEY":          {value: "of_key", got: func(d onceflow.DevConfig) any { return d.APIKey }, want: "of_key"},
	}
}

// Every setting `onceflow dev -h` and each component's -h list reaches
// the configuration the command starts its components with (RunDev's or
// RunComponents'), from its environment variable and from its flag.
// `onceflow dev` once ignored 16 of the settings its -h listed, each
// read only where a component ran on its own: the projector's 3, the
// worker's 7, the webhook deliveries' 5 and the reconcile interval.
func TestEverySettingReachesItsComponent(t *testing.T) {
	all := samples(t)
	for _, command := range []string{"dev", "ingest", "relay", "processor", "projector", "worker", "natsink"} {
		names := listed(t, command)
		if len(names) < 10 {
			t.Fatalf("%s -h lists %d settings: %v", command, len(names), names)
		}
		base, err := started(t, []string{command}, nil)
		if err != nil {
			t.Fatalf("%s with no settings: %v", command, err)
		}
		for _, name := range names {
			s, ok := all[name]
			if !ok {
				t.Errorf("%s -h lists %s, which this test has no sample of", command, name)
				continue
			}
			if fmt.Sprint(s.got(base)) == fmt.Sprint(s.want) {
				t.Errorf("%s %s: the sample %q is the default", command, name, s.value)
			}
			st := settingNamed(name)
			ways := map[string][]string{}
			if st.env != "" {
				ways["variable "+st.env] = nil
			}
			if st.flag != "" {
				ways["flag"] = []string{name + "=" + s.value}
			}
			for way, args := range ways {
				env := map[string]string{}
				for k, v := range s.env {
					env[k] = v
				}
				if args == nil {
					env[st.env] = s.value
				}
				got, err := started(t, append([]string{command}, args...), env)
				if err != nil {
					t.Errorf("%s %s=%s (%s): %v", command, name, s.value, way, err)
					continue
				}
				if g := s.got(got); fmt.Sprint(g) != fmt.Sprint(s.want) {
					t.Errorf("%s %s=%s (%s): its component got %v, want %v", command, name, s.value, way, g, s.want)
				}
			}
		}
	}
}

// settingNamed is the setting -h lists as name (-flag, or VARIABLE).
func settingNamed(name string) *setting {
	for _, c := range commands {
		for _, s := range c.settings {
			if "-"+s.flag == name || s.flag == "" && s.env == name {
				return s
			}
		}
	}
	return nil
}

// A command lists, and reads, only the settings it uses: a rebuild takes
// its own flags and what connects it to Kafka, the registry and Postgres,
// and no component's; the webhooks' and jobs' commands read the database
// only.
func TestCommandsListOnlyTheirSettings(t *testing.T) {
	rebuild := listed(t, "projections rebuild")
	want := []string{"-consumer", "-lock-timeout", "-restart", "-verify",
		"-kafka-brokers", "-kafka-sasl-mechanism", "-kafka-sasl-user", "-kafka-sasl-password", "-kafka-tls", "-kafka-tls-ca-file", "-kafka-allow-plaintext-sasl",
		"-kafka-max-decompress-batch-bytes", "-kafka-max-decompress-poll-bytes",
		"-schema-registry-url", "-schema-registry-user", "-schema-registry-password", "-schema-registry-ca-file",
		"-database-url", "-database-migration-url", "-topic-prefix", "-log-level", "-log-format"}
	if !slices.Equal(rebuild, want) {
		t.Errorf("projections rebuild -h lists %v, want %v", rebuild, want)
	}
	for _, name := range []string{"webhooks list", "webhooks redeliver", "jobs list", "outbox status", "tenants keys list", "idempotency-check"} {
		for _, s := range listed(t, name) {
			if st := settingNamed(s); st != nil && st != databaseURL {
				t.Errorf("%s -h lists %s", name, s)
			}
		}
	}
	// A variable a command does not use is not read: a malformed one does
	// not stop it.
	if _, err := configure("outbox status", map[string]string{"ONCEFLOW_PARTITIONS": "many", "LOG_LEVEL": "loud"}); err != nil {
		t.Errorf("outbox status with settings it does not use, malformed: %v", err)
	}
}

// A malformed number in the environment stops the start with its name and
// value, rather than becoming 0 and an error about 0.
func TestMalformedNumericVariable(t *testing.T) {
	_, err := configure("relay", map[string]string{"ONCEFLOW_OUTBOX_SHARDS": "16x", "ONCEFLOW_PARTITIONS": "8"})
	if err == nil || !strings.Contains(err.Error(), `ONCEFLOW_OUTBOX_SHARDS "16x"`) {
		t.Fatalf("ONCEFLOW_OUTBOX_SHARDS=16x: %v, want an error naming it", err)
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
	"ONCEFLOW_DEV_API_KEY":     "SECRET-KEY",
}

// Neither -h nor a flag error of any component prints a secret: secret
// flags have no default to show, only "(set)".
func TestUsageHidesSecrets(t *testing.T) {
	getenv := func(k string) string { return secretEnv[k] }
	for _, name := range []string{"ingest", "relay", "processor", "projector", "worker"} {
		for _, args := range [][]string{{"-h"}, {"-no-such-flag"}, {"-partitions", "many"}, {"extra"}, {"-log-level", "error"}} {
			var out bytes.Buffer
			err := componentCommand(name, components[name]).run(context.Background(), nil, args, getenv, &out)
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
		c, err := configure("relay", map[string]string{"KAFKA_TLS": tc.val})
		if (err != nil) != tc.wantErr || (err == nil && c.Kafka.TLS != tc.want) {
			t.Errorf("KAFKA_TLS=%q: err %v; want TLS %v, error %v", tc.val, err, tc.want, tc.wantErr)
		}
		if tc.wantErr && (err == nil || !strings.Contains(err.Error(), "KAFKA_TLS")) {
			t.Errorf("KAFKA_TLS=%q: %v, want an error naming KAFKA_TLS", tc.val, err)
		}
	}
}

// SASL without TLS stops the start unless KAFKA_ALLOW_PLAINTEXT_SASL=true.
func TestPlaintextSASLRefused(t *testing.T) {
	for _, allow := range []string{"", "true"} {
		c, err := configure("relay", map[string]string{"KAFKA_SASL_MECHANISM": "PLAIN", "KAFKA_SASL_USER": "u", "KAFKA_SASL_PASSWORD": "SECRET-SASL",
			"KAFKA_ALLOW_PLAINTEXT_SASL": allow})
		if err != nil {
			t.Fatal(err)
		}
		if _, err = c.Kafka.Opts(); (err == nil) != (allow == "true") {
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
		skew, age time.Duration
		bytes     int
		wantError string
	}{
		{env: nil},
		{env: map[string]string{"ONCEFLOW_PROCESSOR_MAX_CLOCK_SKEW": "2m", "ONCEFLOW_PROCESSOR_MAX_COMMAND_BYTES": "4096"}, skew: 2 * time.Minute, bytes: 4096},
		{env: map[string]string{"ONCEFLOW_PROCESSOR_MAX_COMMAND_AGE": "720h"}, age: 720 * time.Hour},
		{env: map[string]string{"ONCEFLOW_PROCESSOR_MAX_COMMAND_AGE": "1h"}, wantError: `ONCEFLOW_PROCESSOR_MAX_COMMAND_AGE "1h"`},
		{env: map[string]string{"ONCEFLOW_PROCESSOR_MAX_CLOCK_SKEW": "soon"}, wantError: `ONCEFLOW_PROCESSOR_MAX_CLOCK_SKEW "soon"`},
		{env: map[string]string{"ONCEFLOW_PROCESSOR_MAX_COMMAND_BYTES": "-1"}, wantError: `ONCEFLOW_PROCESSOR_MAX_COMMAND_BYTES "-1"`},
	} {
		c, err := configure("processor", tc.env)
		if tc.wantError != "" {
			if err == nil || !strings.Contains(err.Error(), tc.wantError) {
				t.Errorf("%v: %v, want an error naming %s", tc.env, err, tc.wantError)
			}
			continue
		}
		if err != nil {
			t.Fatalf("%v: %v", tc.env, err)
		}
		if c.Processor.MaxClockSkew != tc.skew || c.Processor.MaxCommandAge != tc.age || c.Processor.MaxCommandBytes != tc.bytes {
			t.Errorf("%v: skew %s, age %s, max command bytes %d; want %s, %s and %d", tc.env, c.Processor.MaxClockSkew, c.Processor.MaxCommandAge, c.Processor.MaxCommandBytes, tc.skew, tc.age, tc.bytes)
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
	c, err := configure("relay", map[string]string{
		"KAFKA_SASL_PASSWORD_FILE":      write("sasl", "from-file\n"),
		"SCHEMA_REGISTRY_PASSWORD_FILE": write("registry", "ignored"),
		"SCHEMA_REGISTRY_PASSWORD":      "from-env",
		"DATABASE_URL_FILE":             write("db", "postgres://app@db/onceflow\n"),
	})
	if err != nil {
		t.Fatal(err)
	}
	if c.Kafka.SASLPassword != "from-file" || c.SchemaRegistry.Password != "from-env" || c.DatabaseURL != "postgres://app@db/onceflow" {
		t.Errorf("got SASL %q, registry %q, database %q; want from-file, from-env and the file's URL", c.Kafka.SASLPassword, c.SchemaRegistry.Password, c.DatabaseURL)
	}
	if _, err := configure("relay", map[string]string{"ONCEFLOW_ADMIN_TOKEN_FILE": filepath.Join(dir, "missing")}); err == nil || !strings.Contains(err.Error(), "ONCEFLOW_ADMIN_TOKEN_FILE") {
		t.Errorf("an unreadable ONCEFLOW_ADMIN_TOKEN_FILE: %v, want an error naming it", err)
	}
}

// DATABASE_MAX_CONNS sizes the pools (default 10) and must be positive;
// ONCEFLOW_TRUSTED_PROXIES is a list of networks, and nothing else.
func TestPoolAndProxySettings(t *testing.T) {
	c, err := configure("ingest", nil)
	if err != nil || c.DatabaseMaxConns != onceflow.DefaultDatabaseMaxConns {
		t.Errorf("default pool size %d (%v), want %d", c.DatabaseMaxConns, err, onceflow.DefaultDatabaseMaxConns)
	}
	if _, err := configure("ingest", map[string]string{"DATABASE_MAX_CONNS": "0"}); err == nil {
		t.Error("DATABASE_MAX_CONNS=0 was accepted")
	}
	c, err = configure("ingest", map[string]string{"ONCEFLOW_TRUSTED_PROXIES": "10.0.0.0/8, fd00::/8"})
	if err != nil || len(c.Ingest.TrustedProxies) != 2 || c.Ingest.TrustedProxies[1].String() != "fd00::/8" {
		t.Errorf("trusted proxies %v (%v)", c.Ingest.TrustedProxies, err)
	}
	if _, err := configure("ingest", map[string]string{"ONCEFLOW_TRUSTED_PROXIES": "10.0.0.1"}); err == nil {
		t.Error("an address without a prefix length was accepted as a network")
	}
}

// The worker's settings: each variable read, each refused with its name.
func TestWorkerSettings(t *testing.T) {
	c, err := configure("worker", nil)
	if err != nil || c.Worker.Lease != jobs.DefaultLease || c.Worker.MaxAttempts != jobs.DefaultMaxAttempts || c.Webhooks.Timeout != webhooks.DefaultTimeout || len(c.Webhooks.Allow) != 0 {
		t.Fatalf("defaults: %+v %+v %v", c.Worker, c.Webhooks, err)
	}
	c, err = configure("worker", map[string]string{"ONCEFLOW_WORKER_LEASE": "4s", "ONCEFLOW_WORKER_ATTEMPT_TIMEOUT": "3s", "ONCEFLOW_WEBHOOK_TIMEOUT": "2s",
		"ONCEFLOW_WORKER_MAX_ATTEMPTS": "3", "ONCEFLOW_WEBHOOK_ALLOW_NETWORKS": "10.0.0.0/8, 192.168.1.7/32", "ONCEFLOW_WORKER_QUEUE": "q",
		"ONCEFLOW_WEBHOOK_MAX_PENDING": "500", "ONCEFLOW_WEBHOOK_RETENTION": "48h", "ONCEFLOW_WORKER_BACKLOG_WORKERS": "4"})
	if err != nil || c.Worker.Lease != 4*time.Second || c.Worker.AttemptTimeout != 3*time.Second || c.Webhooks.Timeout != 2*time.Second || c.Worker.MaxAttempts != 3 ||
		len(c.Webhooks.Allow) != 2 || c.Worker.Queue != "q" || c.Webhooks.MaxPending != 500 || c.Webhooks.Retention != 48*time.Hour || c.Worker.BacklogWorkers != 4 {
		t.Fatalf("set: %+v %+v %v", c.Worker, c.Webhooks, err)
	}
	for env, want := range map[string]string{
		"ONCEFLOW_WORKER_LEASE=soon":             "ONCEFLOW_WORKER_LEASE",
		"ONCEFLOW_WORKER_MAX_ATTEMPTS=0":         "ONCEFLOW_WORKER_MAX_ATTEMPTS",
		"ONCEFLOW_WEBHOOK_ALLOW_NETWORKS=10.0.0": "ONCEFLOW_WEBHOOK_ALLOW_NETWORKS",
		"ONCEFLOW_WEBHOOK_TIMEOUT=40s":           "ONCEFLOW_WEBHOOK_TIMEOUT",
		"ONCEFLOW_WORKER_ATTEMPT_TIMEOUT=2m":     "ONCEFLOW_WORKER_ATTEMPT_TIMEOUT",
		"ONCEFLOW_WEBHOOK_MAX_PER_TENANT=0":      "ONCEFLOW_WEBHOOK_MAX_PER_TENANT",
		"ONCEFLOW_WEBHOOK_MAX_PENDING=0":         "ONCEFLOW_WEBHOOK_MAX_PENDING",
		"ONCEFLOW_WEBHOOK_RETENTION=1h":          "ONCEFLOW_WEBHOOK_RETENTION",
		"ONCEFLOW_WORKER_BACKLOG_WORKERS=0":      "ONCEFLOW_WORKER_BACKLOG_WORKERS",
	} {
		k, v, _ := strings.Cut(env, "=")
		if _, err := configure("worker", map[string]string{k: v}); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: got %v, want an error naming %s", env, err, want)
		}
	}
}

// Every setting's variable is documented: README.md's table, or the page
// of the component it belongs to.
func TestSettingsDocumented(t *testing.T) {
	var docs strings.Builder
	for _, pattern := range []string{"../../../README.md", "../../../docs/*.md"} {
		files, err := filepath.Glob(pattern)
		if err != nil || len(files) == 0 {
			t.Fatalf("%s: %v", pattern, err)
		}
		for _, f := range files {
			b, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			docs.Write(b)
		}
	}
	seen := map[*setting]bool{}
	for _, c := range commands {
		for _, s := range c.settings {
			if !seen[s] && s.env != "" && !strings.Contains(docs.String(), s.env) {
				t.Errorf("%s is in no page of README.md or docs/", s.env)
			}
			seen[s] = true
		}
	}
}

// onceflow dev listens on loopback, ingest as the admin address, unless
// HTTP_ADDR says otherwise (it listened on every interface); a component
// keeps ingest's default of every interface.
func TestDevListensOnLoopback(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"dev"}, "127.0.0.1:8080"},
		{[]string{"dev", "-http-addr", ":8080"}, ":8080"},
		{[]string{"ingest"}, ":8080"},
	} {
		got, err := started(t, c.args, nil)
		if err != nil {
			t.Fatal(err)
		}
		if got.HTTPAddr != c.want {
			t.Errorf("%v: ingest on %q, want %q", c.args, got.HTTPAddr, c.want)
		}
	}
}

// ingest and the relay take and refuse the same ONCEFLOW_OUTBOX_SHARDS
// (pipeline.CheckOutboxShards): the ingest binary once started with 5000,
// which its relay refused.
func TestIngestAndRelayTakeTheSameOutboxShards(t *testing.T) {
	for _, v := range []string{"0", "1", "16", "4096", "4097", "5000"} {
		n, _ := strconv.Atoi(v)
		want := pipeline.CheckOutboxShards(n) == nil
		for _, command := range []string{"ingest", "relay"} {
			_, err := started(t, []string{command}, map[string]string{"ONCEFLOW_OUTBOX_SHARDS": v})
			if (err == nil) != want {
				t.Errorf("%s with ONCEFLOW_OUTBOX_SHARDS=%s: %v, want it taken: %v", command, v, err, want)
			}
		}
	}
}
