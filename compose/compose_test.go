// Package compose holds the production-like stack (docker-compose.yml,
// Prometheus with the alert rules, Grafana dashboards). Docker cannot run
// on the machines CI uses, so these tests check what can be checked
// without it: the alert rules with promtool (syntax and unit tests), the
// Prometheus configuration and the dashboards' expressions, that every
// metric the rules and dashboards use is one the components export (the
// embedded default runs in the test and its registry is asked), and that
// the compose file configures the components with the contract's
// variables.
package compose

import (
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"gopkg.in/yaml.v3"

	"github.com/onceflow/onceflow"
	"github.com/onceflow/onceflow/examples/ledger/ledgerapp"
	"github.com/onceflow/onceflow/onceflowtest"
	"github.com/onceflow/onceflow/pipeline/admin"
	"github.com/onceflow/onceflow/pipeline/kafka"
	"github.com/onceflow/onceflow/pipeline/natsink"
	"github.com/onceflow/onceflow/pipeline/pipelinetest"
	"github.com/onceflow/onceflow/pipeline/reconcile"
)

func promtool(t *testing.T, args ...string) {
	t.Helper()
	path, err := exec.LookPath("promtool")
	if err != nil {
		t.Skip("promtool is not installed (Debian package prometheus; .ci/run installs it)")
	}
	out, err := exec.Command(path, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
	}
}

func TestAlertRules(t *testing.T) {
	promtool(t, "check", "rules", "prometheus/alerts.yml")
	// Each alert fires when it should and stays quiet otherwise.
	promtool(t, "test", "rules", "prometheus/alerts_test.yml")
}

func TestPrometheusConfig(t *testing.T) {
	promtool(t, "check", "config", "--syntax-only", "prometheus/prometheus.yml")
}

// prometheusOwn are the series Prometheus makes itself.
var prometheusOwn = setOf("up", "scrape_duration_seconds", "scrape_samples_scraped", "scrape_samples_post_metric_relabeling",
	"scrape_series_added", "ALERTS", "ALERTS_FOR_STATE")

// expression is one PromQL expression of a dashboard or a rule file.
type expression struct {
	where string // file and panel or rule
	expr  string
}

// dashboardExpressions returns every "expr" of every dashboard, wherever
// it sits (panels, rows' panels, targets).
func dashboardExpressions(t *testing.T) []expression {
	t.Helper()
	files, err := filepath.Glob("grafana/dashboards/*.json")
	if err != nil || len(files) == 0 {
		t.Fatalf("no dashboards (%v)", err)
	}
	var out []expression
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		var doc any
		if err := json.Unmarshal(b, &doc); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		var walk func(v any, title string)
		walk = func(v any, title string) {
			switch v := v.(type) {
			case map[string]any:
				if s, ok := v["title"].(string); ok {
					title = s
				}
				for k, c := range v {
					if s, ok := c.(string); ok && k == "expr" {
						out = append(out, expression{f + ": " + title, s})
						continue
					}
					walk(c, title)
				}
			case []any:
				for _, c := range v {
					walk(c, title)
				}
			}
		}
		walk(doc, "")
	}
	return out
}

// ruleFile is the part of a Prometheus rule file the tests read.
type ruleFile struct {
	Groups []struct {
		Name  string `yaml:"name"`
		Rules []struct {
			Alert  string `yaml:"alert"`
			Record string `yaml:"record"`
			Expr   string `yaml:"expr"`
		} `yaml:"rules"`
	} `yaml:"groups"`
}

// ruleExpressions returns the expressions of the alert rules, and the
// names recording rules define.
func ruleExpressions(t *testing.T) ([]expression, map[string]bool) {
	t.Helper()
	b, err := os.ReadFile("prometheus/alerts.yml")
	if err != nil {
		t.Fatal(err)
	}
	var rf ruleFile
	if err := yaml.Unmarshal(b, &rf); err != nil {
		t.Fatalf("alerts.yml: %v", err)
	}
	var out []expression
	recorded := map[string]bool{}
	for _, g := range rf.Groups {
		for _, r := range g.Rules {
			out = append(out, expression{"prometheus/alerts.yml: " + g.Name + "/" + r.Alert + r.Record, r.Expr})
			if r.Record != "" {
				recorded[r.Record] = true
			}
		}
	}
	if len(out) == 0 {
		t.Fatal("alerts.yml has no rules")
	}
	return out, recorded
}

// Every metric an alert or a dashboard queries must be one the components
// export: a renamed metric silently blinds an alert otherwise. The names
// come from the code: the embedded default (`onceflow dev`, every
// component and the lag of every consumer in one process) runs in this
// test and its registry says what it exports.
func TestAlertsAndDashboardsUseExportedMetrics(t *testing.T) {
	exported, unobserved := exportedMetrics(t)
	rules, recorded := ruleExpressions(t)
	for _, e := range append(dashboardExpressions(t), rules...) {
		names, err := metricNames(e.expr)
		if err != nil {
			t.Errorf("%s: %v", e.where, err)
			continue
		}
		if len(names) == 0 {
			t.Errorf("%s: %q queries no metric", e.where, e.expr)
		}
		for _, n := range names {
			switch {
			case exported[n] || recorded[n] || prometheusOwn[n]:
			case unobserved[strings.TrimSuffix(strings.TrimSuffix(strings.TrimSuffix(n, "_bucket"), "_sum"), "_count")]:
				// a histogram's series before its first observation: the
				// registry describes its name but not its type
				t.Logf("%s: %s is a series of a metric not observed in this run", e.where, n)
			default:
				t.Errorf("%s: %s (in %q) is not exported by any component", e.where, n, e.expr)
			}
		}
	}
}

// exportedMetrics runs the embedded default in process and returns the
// series names its registry exports — every described metric, with a
// histogram's _bucket, _sum and _count — and the described metrics not
// observed yet, whose type the registry cannot tell.
func exportedMetrics(t *testing.T) (exported, unobserved map[string]bool) {
	t.Helper()
	reg := admin.NewRegistry()
	_, stop := onceflowtest.Dev(t, onceflow.DevConfig{
		RunConfig: onceflow.RunConfig{
			Config: onceflow.Config{
				Domains:     []*onceflow.Domain{ledgerapp.Domain()},
				Topics:      kafka.Topics{Prefix: "ledger", Partitions: 2},
				DatabaseURL: pipelinetest.DatabaseURL(t),
				Logger:      slog.New(slog.DiscardHandler),
				InstanceID:  "compose-test",
			},
			Metrics: reg,
			// The relay's periodic reconcile exports its metrics from
			// the start; its first run is after the test.
			Reconcile: reconcile.Config{Interval: time.Hour},
			// So does the NATS sink, before it reaches a server: none
			// listens on port 1 of loopback, and it keeps trying.
			NATSink: natsink.Config{URL: "nats://127.0.0.1:1"},
		},
		Out: io.Discard,
	})
	defer stop()

	exported, unobserved = map[string]bool{}, map[string]bool{}
	descs := make(chan *prometheus.Desc)
	go func() {
		reg.Describe(descs)
		close(descs)
	}()
	fqName := regexp.MustCompile(`fqName: "([^"]+)"`)
	for d := range descs {
		if m := fqName.FindStringSubmatch(d.String()); m != nil {
			exported[m[1]], unobserved[m[1]] = true, true
		}
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		n := mf.GetName()
		exported[n] = true
		delete(unobserved, n)
		switch mf.GetType() {
		case dto.MetricType_HISTOGRAM, dto.MetricType_GAUGE_HISTOGRAM:
			exported[n+"_bucket"], exported[n+"_sum"], exported[n+"_count"] = true, true, true
		case dto.MetricType_SUMMARY:
			exported[n+"_sum"], exported[n+"_count"] = true, true
		}
	}
	for _, must := range []string{"onceflow_api_requests_total", "kafka_consumergroup_group_lag", "onceflow_outbox_backlog_rows"} {
		if !exported[must] {
			t.Fatalf("the registry does not describe %s: the test does not see the components' metrics", must)
		}
	}
	return exported, unobserved
}

// Every dashboard expression is valid PromQL (promtool checks them as
// recording rules; Grafana's interval variables become 5m).
func TestDashboardExpressionsParse(t *testing.T) {
	var rf struct {
		Groups []map[string]any `yaml:"groups"`
	}
	var rules []map[string]string
	vars := strings.NewReplacer("$__rate_interval", "5m", "$__interval", "5m", "$__range", "5m")
	for i, e := range dashboardExpressions(t) {
		rules = append(rules, map[string]string{"record": fmt.Sprintf("dashboard:expr:%d", i), "expr": vars.Replace(e.expr)})
	}
	rf.Groups = []map[string]any{{"name": "dashboards", "rules": rules}}
	b, err := yaml.Marshal(rf)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "dashboards.yml")
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
	promtool(t, "check", "rules", path)
}

// The components in the compose file are configured only with the
// variables the binaries read, and every component is there.
func TestComposeConfiguresComponents(t *testing.T) {
	b, err := os.ReadFile("docker-compose.yml")
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Services map[string]struct {
			Command     []string          `yaml:"command"`
			Environment map[string]string `yaml:"environment"`
		} `yaml:"services"`
	}
	if err := yaml.Unmarshal(b, &doc); err != nil {
		t.Fatalf("docker-compose.yml: %v", err)
	}
	known := map[string]bool{
		"KAFKA_BROKERS": true, "DATABASE_URL": true, "SCHEMA_REGISTRY_URL": true, "ONCEFLOW_TOPIC_PREFIX": true,
		"HTTP_ADDR": true, "ADMIN_ADDR": true, "LOG_LEVEL": true, "LOG_FORMAT": true, "ONCEFLOW_PARTITIONS": true,
		"ONCEFLOW_INSTANCE_ID": true, "ONCEFLOW_DEV_API_KEY": true, "ONCEFLOW_LAG_EXPORT": true,
		"KAFKA_SASL_MECHANISM": true, "KAFKA_SASL_USER": true, "KAFKA_SASL_PASSWORD_FILE": true, "KAFKA_ALLOW_PLAINTEXT_SASL": true,
		"KAFKA_TLS": true, "KAFKA_TLS_CA_FILE": true,
		"SCHEMA_REGISTRY_USER": true, "SCHEMA_REGISTRY_PASSWORD_FILE": true, "SCHEMA_REGISTRY_CA_FILE": true,
		"ONCEFLOW_TRUSTED_PROXIES": true,
	}
	for _, c := range []string{"ingest", "relay", "processor", "projector"} {
		s, ok := doc.Services[c]
		if !ok {
			t.Errorf("service %s is missing", c)
			continue
		}
		if len(s.Command) != 1 || s.Command[0] != c {
			t.Errorf("service %s runs %v, want [%s]", c, s.Command, c)
		}
		for k := range s.Environment {
			if !known[k] {
				t.Errorf("service %s sets %s, which no binary reads", c, k)
			}
		}
		for _, k := range []string{"KAFKA_BROKERS", "DATABASE_URL", "SCHEMA_REGISTRY_URL", "ADMIN_ADDR"} {
			if s.Environment[k] == "" {
				t.Errorf("service %s does not set %s", c, k)
			}
		}
	}
}

// composeFile is the part of docker-compose.yml the security checks read.
type composeFile struct {
	Services map[string]struct {
		Image       string            `yaml:"image"`
		Build       any               `yaml:"build"`
		Command     []string          `yaml:"command"`
		Environment map[string]string `yaml:"environment"`
		Secrets     []string          `yaml:"secrets"`
		Ports       []string          `yaml:"ports"`
	} `yaml:"services"`
	Secrets map[string]struct {
		File string `yaml:"file"`
	} `yaml:"secrets"`
}

// The stack authenticates everything and holds no secret in the file
// (docs/security.md#the-compose-stack): images pinned by digest; no
// password, token or key as a value, only files under /run/secrets (or
// values compose/secrets.sh writes into compose/.env); Kafka's clients
// with SCRAM over TLS (TestComposeKafkaIsSecuredAsTheLocalCluster); the
// registry on https with basic auth; Postgres with TLS, passwords and no
// trust over the network, reached with verify-full; the components as the
// runtime role and only migrate as the owner; Grafana without anonymous
// access. Every secret a service mounts is declared and made by
// compose/secrets.sh.
func TestComposeIsAuthenticated(t *testing.T) {
	b, err := os.ReadFile("docker-compose.yml")
	if err != nil {
		t.Fatal(err)
	}
	var doc composeFile
	if err := yaml.Unmarshal(b, &doc); err != nil {
		t.Fatalf("docker-compose.yml: %v", err)
	}
	script, err := os.ReadFile("secrets.sh")
	if err != nil {
		t.Fatal(err)
	}
	pinned := regexp.MustCompile(`^[a-z0-9./-]+:[A-Za-z0-9._-]+@sha256:[0-9a-f]{64}$`)
	secretKey := regexp.MustCompile(`PASSWORD|TOKEN|SECRET|JAAS_CONFIG`)
	components := map[string]bool{"ingest": true, "relay": true, "processor": true, "projector": true, "lag": true}
	for name, s := range doc.Services {
		if s.Build == nil && !pinned.MatchString(s.Image) {
			t.Errorf("service %s: image %q is not pinned by digest (name:tag@sha256:...)", name, s.Image)
		}
		for k, v := range s.Environment {
			fromFile := strings.HasSuffix(k, "_FILE") && strings.HasPrefix(v, "/run/secrets/")
			fromEnvFile := strings.HasPrefix(v, "${ONCEFLOW_") && strings.Contains(v, ":?")
			if secretKey.MatchString(k) && !fromFile && !fromEnvFile && k != "ONCEFLOW_DEV_API_KEY" {
				t.Errorf("service %s: %s is set in the file; read it from a secret (%s_FILE=/run/secrets/...)", name, k, k)
			}
			if strings.HasPrefix(v, "postgres://") {
				if regexp.MustCompile(`//[^/@]*:[^/@]*@`).MatchString(v) || !strings.Contains(v, "sslmode=verify-full") || !strings.Contains(v, "passfile=/run/secrets/") {
					t.Errorf("service %s: %s=%s: want no password in the URL, sslmode=verify-full and a passfile", name, k, v)
				}
			}
		}
		if components[name] {
			if s.Environment["DATABASE_MIGRATION_URL"] != "" || !strings.Contains(s.Environment["DATABASE_URL"], "//onceflow_app@") {
				t.Errorf("service %s: want the runtime role (onceflow_app) and no DATABASE_MIGRATION_URL", name)
			}
			if s.Environment["KAFKA_SASL_MECHANISM"] == "" || !strings.HasPrefix(s.Environment["SCHEMA_REGISTRY_URL"], "https://") {
				t.Errorf("service %s: want SASL to Kafka and https to the registry", name)
			}
		}
		for _, sec := range s.Secrets {
			f, ok := doc.Secrets[sec]
			if !ok {
				t.Errorf("service %s mounts secret %s, which is not declared", name, sec)
				continue
			}
			if base := filepath.Base(f.File); !strings.Contains(string(script), base) && !strings.Contains(string(script), strings.TrimSuffix(base, filepath.Ext(base))) {
				t.Errorf("secret %s (%s) is not made by compose/secrets.sh", sec, f.File)
			}
		}
	}
	svc := doc.Services
	if !strings.Contains(svc["migrate"].Environment["DATABASE_MIGRATION_URL"], "//onceflow_owner@") {
		t.Error("migrate: want DATABASE_MIGRATION_URL as the owner")
	}
	// Kafka's listeners: TestComposeKafkaIsSecuredAsTheLocalCluster.
	if reg := svc["schema-registry"].Environment; reg["SCHEMA_REGISTRY_AUTHENTICATION_METHOD"] != "BASIC" || !strings.HasPrefix(reg["SCHEMA_REGISTRY_LISTENERS"], "https://") ||
		reg["SCHEMA_REGISTRY_KAFKASTORE_SECURITY_PROTOCOL"] != "SASL_SSL" || reg["SCHEMA_REGISTRY_KAFKASTORE_SASL_MECHANISM"] != "SCRAM-SHA-512" ||
		reg["SCHEMA_REGISTRY_KAFKASTORE_SSL_TRUSTSTORE_LOCATION"] != "/run/secrets/ca_crt" {
		t.Errorf("schema-registry: want basic auth over https, and SCRAM-SHA-512 over TLS to Kafka: %v", reg)
	}
	pg := svc["postgres"]
	if pg.Environment["POSTGRES_PASSWORD_FILE"] == "" || !slices.Contains(pg.Command, "ssl=on") {
		t.Errorf("postgres: want POSTGRES_PASSWORD_FILE and ssl=on: %v %v", pg.Environment, pg.Command)
	}
	hba, err := os.ReadFile("postgres/pg_hba.conf")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(hba), "\n") {
		f := strings.Fields(line)
		if len(f) > 0 && f[0] != "local" && !strings.HasPrefix(f[0], "#") && f[len(f)-1] != "scram-sha-256" && f[len(f)-1] != "reject" {
			t.Errorf("pg_hba.conf: %q lets a connection in without TLS and a password", line)
		}
		if len(f) > 0 && f[0] == "host" && f[len(f)-1] != "reject" {
			t.Errorf("pg_hba.conf: %q allows a connection without TLS", line)
		}
	}
	if g := svc["grafana"].Environment; g["GF_AUTH_ANONYMOUS_ENABLED"] != "false" || g["GF_SECURITY_ADMIN_PASSWORD__FILE"] == "" {
		t.Errorf("grafana: want anonymous access off and the admin password from a secret: %v", g)
	}
}

// Ingest counts failed authentications per client address, so a client
// must not choose the address it is counted as: ingest trusts
// X-Forwarded-For from the stack's own nginx only (its fixed address on
// the stack's subnet, nothing wider: the published port's clients arrive
// from Docker's gateway, a private address), and nginx writes the peer it
// saw over whatever the client sent, never appending to it or taking a
// client's header as the peer (real_ip). What ingest makes of such a
// header: pipeline/ingest's TestForgedForwardedForBuysNoBudget.
func TestComposeTrustsOnlyItsProxy(t *testing.T) {
	b, err := os.ReadFile("docker-compose.yml")
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Services map[string]struct {
			Environment map[string]string `yaml:"environment"`
			Networks    map[string]struct {
				IPv4 string `yaml:"ipv4_address"`
			} `yaml:"networks"`
		} `yaml:"services"`
		Networks map[string]struct {
			IPAM struct {
				Config []struct {
					Subnet string `yaml:"subnet"`
				} `yaml:"config"`
			} `yaml:"ipam"`
		} `yaml:"networks"`
	}
	if err := yaml.Unmarshal(b, &doc); err != nil {
		t.Fatalf("docker-compose.yml: %v", err)
	}
	lb, err := netip.ParseAddr(doc.Services["lb"].Networks["default"].IPv4)
	if err != nil {
		t.Fatalf("lb has no fixed address on the default network: %v", err)
	}
	subnets := doc.Networks["default"].IPAM.Config
	if len(subnets) != 1 {
		t.Fatalf("the default network has %d subnets, want one fixed subnet", len(subnets))
	}
	if sub, err := netip.ParsePrefix(subnets[0].Subnet); err != nil || !sub.Contains(lb) {
		t.Errorf("lb's address %s is not in the stack's subnet %q (%v)", lb, subnets[0].Subnet, err)
	}
	trusted := doc.Services["ingest"].Environment["ONCEFLOW_TRUSTED_PROXIES"]
	for _, s := range strings.Split(trusted, ",") {
		p, err := netip.ParsePrefix(strings.TrimSpace(s))
		if err != nil || !p.IsSingleIP() || p.Addr() != lb {
			t.Errorf("ingest trusts %q for X-Forwarded-For; want only nginx's address %s/32", s, lb)
		}
	}

	conf, err := os.ReadFile("nginx/nginx.conf")
	if err != nil {
		t.Fatal(err)
	}
	var sets []string
	for _, line := range strings.Split(string(conf), "\n") {
		line = strings.TrimSpace(line)
		if strings.HasPrefix(line, "#") {
			continue
		}
		for _, bad := range []string{"$proxy_add_x_forwarded_for", "$http_x_forwarded_for", "real_ip_header", "set_real_ip_from"} {
			if strings.Contains(line, bad) {
				t.Errorf("nginx.conf: %q lets the client's own header through", line)
			}
		}
		if f := strings.Fields(strings.TrimSuffix(line, ";")); len(f) == 3 && f[0] == "proxy_set_header" && strings.EqualFold(f[1], "X-Forwarded-For") {
			sets = append(sets, f[2])
		}
	}
	if len(sets) == 0 || slices.ContainsFunc(sets, func(v string) bool { return v != "$remote_addr" }) {
		t.Errorf("nginx.conf sets X-Forwarded-For to %v; want $remote_addr, the peer nginx saw", sets)
	}
}
