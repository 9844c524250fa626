// Package compose holds the production-like stack (docker-compose.yml,
// Prometheus with the alert rules, Grafana dashboards). Docker cannot run
// on the machines CI uses, so these tests check what can be checked
// without it: the alert rules with promtool (syntax and unit tests), the
// Prometheus configuration, that every metric the rules and dashboards use
// is one onceflow exports, and that the compose file configures the
// components with the contract's variables.
package compose

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"
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

// notYetExported are metrics the rules and dashboards use that no code
// exports yet, each with the reason.
var notYetExported = map[string]string{
	"onceflow_worker_idempotency_skipped_total": "the webhook job workers are not built yet; the alert is ready for them",
}

// Every metric an alert or a dashboard queries must be one the code
// declares: a renamed metric silently blinds an alert otherwise.
func TestAlertsAndDashboardsUseExportedMetrics(t *testing.T) {
	declared := declaredMetrics(t)
	used := map[string][]string{}
	name := regexp.MustCompile(`\b(onceflow_[a-z0-9_]+|kafka_consumergroup_[a-z0-9_]+)`)
	files, _ := filepath.Glob("grafana/dashboards/*.json")
	files = append(files, "prometheus/alerts.yml")
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if strings.HasSuffix(f, ".json") && !json.Valid(b) {
			t.Errorf("%s is not valid JSON", f)
		}
		for _, m := range name.FindAllString(string(b), -1) {
			m = strings.TrimSuffix(strings.TrimSuffix(strings.TrimSuffix(m, "_bucket"), "_sum"), "_count")
			used[m] = append(used[m], f)
		}
	}
	var names []string
	for m := range used {
		names = append(names, m)
	}
	sort.Strings(names)
	for _, m := range names {
		if !declared[m] && notYetExported[m] == "" {
			t.Errorf("%s (used in %v) is not exported by any component", m, used[m])
		}
	}
}

// declaredMetrics scans the Go sources for metric names.
func declaredMetrics(t *testing.T) map[string]bool {
	t.Helper()
	decl := regexp.MustCompile(`"((?:onceflow|kafka_consumergroup)_[a-z0-9_]+)"`)
	out := map[string]bool{}
	err := filepath.WalkDir("..", func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == ".data" || d.Name() == ".git" || d.Name() == "compose") {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for _, m := range decl.FindAllStringSubmatch(string(b), -1) {
			out[m[1]] = true
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
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
