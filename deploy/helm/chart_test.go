// Package helm tests onceflow's Helm chart (onceflow/): rendered with
// Helm's own library for the default values and for an existing Kafka on
// SASL_SSL and Postgres over TLS (testdata/secured.yaml), every manifest
// decoded strictly into Kubernetes' API types, linted as `helm lint`
// lints. It is a module of its own so that onceflow's go.mod does not take
// Kubernetes' dependency tree; it learns onceflow's settings from the
// binaries' -h (settings_test.go). No cluster is needed.
package helm

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	"helm.sh/helm/v4/pkg/chart/common"
	"helm.sh/helm/v4/pkg/chart/common/util"
	chart "helm.sh/helm/v4/pkg/chart/v2"
	"helm.sh/helm/v4/pkg/chart/v2/lint"
	"helm.sh/helm/v4/pkg/chart/v2/lint/support"
	"helm.sh/helm/v4/pkg/chart/v2/loader"
	"helm.sh/helm/v4/pkg/engine"
	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"
)

const (
	chartDir  = "onceflow"
	release   = "prod"
	namespace = "payments"
)

// valueSets are the values the tests render: the chart's defaults, and an
// existing secured Kafka and Postgres.
var valueSets = map[string][]string{
	"default": nil,
	"secured": {"testdata/secured.yaml"},
}

// kinds are the objects the chart may render, by apiVersion and kind;
// anything else is an error.
var kinds = map[string]func() any{
	"apps/v1 Deployment":                      func() any { return &appsv1.Deployment{} },
	"apps/v1 StatefulSet":                     func() any { return &appsv1.StatefulSet{} },
	"v1 Service":                              func() any { return &corev1.Service{} },
	"v1 ConfigMap":                            func() any { return &corev1.ConfigMap{} },
	"v1 Secret":                               func() any { return &corev1.Secret{} },
	"batch/v1 Job":                            func() any { return &batchv1.Job{} },
	"policy/v1 PodDisruptionBudget":           func() any { return &policyv1.PodDisruptionBudget{} },
	"networking.k8s.io/v1 NetworkPolicy":      func() any { return &networkingv1.NetworkPolicy{} },
	"monitoring.coreos.com/v1 ServiceMonitor": func() any { return &monitoringv1.ServiceMonitor{} },
	"monitoring.coreos.com/v1 PrometheusRule": func() any { return &monitoringv1.PrometheusRule{} },
}

// object is one rendered manifest, decoded.
type object struct {
	template string // the template it came from
	kind     string // "apps/v1 StatefulSet"
	name     string
	obj      any // *appsv1.StatefulSet, ...
}

// manifests is what the chart renders for one set of values.
type manifests []object

func loadChart(t *testing.T) *chart.Chart {
	t.Helper()
	ch, err := loader.LoadDir(chartDir)
	if err != nil {
		t.Fatalf("load the chart: %v", err)
	}
	return ch
}

// values reads files and overrides into one set of values, later ones
// winning, as `helm install -f a -f b --set ...` does.
func values(t *testing.T, files []string, overrides ...map[string]any) map[string]any {
	t.Helper()
	vals := map[string]any{}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		v, err := loader.LoadValues(bytes.NewReader(b))
		if err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		vals = loader.MergeMaps(vals, v)
	}
	for _, o := range overrides {
		vals = loader.MergeMaps(vals, o)
	}
	return vals
}

// renderErr renders the chart as `helm install prod -n payments` would,
// values.schema.json checked, and decodes every manifest strictly.
func renderErr(t *testing.T, vals map[string]any) (manifests, error) {
	t.Helper()
	ch := loadChart(t)
	opts := common.ReleaseOptions{Name: release, Namespace: namespace, Revision: 1, IsInstall: true}
	rv, err := util.ToRenderValuesWithSchemaValidation(ch, vals, opts, common.DefaultCapabilities, false)
	if err != nil {
		return nil, err
	}
	files, err := engine.Render(ch, rv)
	if err != nil {
		return nil, err
	}
	names := make([]string, 0, len(files))
	for name := range files {
		names = append(names, name)
	}
	sort.Strings(names)
	var out manifests
	for _, name := range names {
		if !strings.HasSuffix(name, ".yaml") {
			continue // NOTES.txt, helpers
		}
		for _, doc := range regexp.MustCompile(`(?m)^---\s*$`).Split(files[name], -1) {
			if strings.TrimSpace(doc) == "" {
				continue
			}
			o, err := decode(name, []byte(doc))
			if err != nil {
				return nil, err
			}
			out = append(out, o)
		}
	}
	return out, nil
}

func render(t *testing.T, vals map[string]any) manifests {
	t.Helper()
	m, err := renderErr(t, vals)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// decode decodes one manifest into its Kubernetes type, strictly: an
// unknown or misspelt field, a duplicate key or a value of the wrong type
// is an error, as the API server's strict field validation would make it.
func decode(template string, doc []byte) (object, error) {
	var tm metav1.TypeMeta
	if err := yaml.Unmarshal(doc, &tm); err != nil {
		return object{}, fmt.Errorf("%s: %v\n%s", template, err, doc)
	}
	kind := strings.TrimSpace(tm.APIVersion + " " + tm.Kind)
	newObj, ok := kinds[kind]
	if !ok {
		return object{}, fmt.Errorf("%s: an object of kind %q, which the tests do not know", template, kind)
	}
	obj := newObj()
	if err := yaml.UnmarshalStrict(doc, obj); err != nil {
		return object{}, fmt.Errorf("%s: %s: %v\n%s", template, kind, err, doc)
	}
	var meta struct {
		Metadata metav1.ObjectMeta `json:"metadata"`
	}
	if err := yaml.Unmarshal(doc, &meta); err != nil {
		return object{}, err
	}
	if meta.Metadata.Name == "" {
		return object{}, fmt.Errorf("%s: a %s without a name", template, kind)
	}
	return object{template: template, kind: kind, name: meta.Metadata.Name, obj: obj}, nil
}

// get returns the object of kind and name, or fails.
func (m manifests) get(t *testing.T, kind, name string) any {
	t.Helper()
	for _, o := range m {
		if o.kind == kind && o.name == name {
			return o.obj
		}
	}
	t.Fatalf("no %s %s among %v", kind, name, m.names())
	return nil
}

func (m manifests) names() []string {
	var out []string
	for _, o := range m {
		out = append(out, o.kind+" "+o.name)
	}
	return out
}

// pod is one pod template the chart renders, with what runs it.
type pod struct {
	workload string // "StatefulSet prod-onceflow-relay"
	kind     string // StatefulSet, Deployment, Job
	name     string
	replicas int32
	spec     corev1.PodSpec
	labels   map[string]string
}

func (m manifests) pods() []pod {
	var out []pod
	for _, o := range m {
		switch w := o.obj.(type) {
		case *appsv1.StatefulSet:
			out = append(out, pod{"StatefulSet " + w.Name, "StatefulSet", w.Name, deref(w.Spec.Replicas), w.Spec.Template.Spec, w.Spec.Template.Labels})
		case *appsv1.Deployment:
			out = append(out, pod{"Deployment " + w.Name, "Deployment", w.Name, deref(w.Spec.Replicas), w.Spec.Template.Spec, w.Spec.Template.Labels})
		case *batchv1.Job:
			out = append(out, pod{"Job " + w.Name, "Job", w.Name, 1, w.Spec.Template.Spec, w.Spec.Template.Labels})
		}
	}
	return out
}

func deref(p *int32) int32 {
	if p == nil {
		return 1
	}
	return *p
}

// containers are a pod's containers, its init containers first.
func (p pod) containers() []corev1.Container {
	return append(append([]corev1.Container(nil), p.spec.InitContainers...), p.spec.Containers...)
}

// TestChartRendersStrictly renders the chart for each set of values and
// decodes every manifest strictly into Kubernetes' types (decode): a
// field misspelt, misplaced or of the wrong type fails here rather than at
// `kubectl apply`. Each long-running component is there with its Service,
// and every Service and PodDisruptionBudget selects pods the chart runs.
func TestChartRendersStrictly(t *testing.T) {
	for name, files := range valueSets {
		t.Run(name, func(t *testing.T) {
			m := render(t, values(t, files))
			for _, c := range []string{"ingest", "relay", "processor", "projector", "worker", "lag"} {
				m.get(t, "v1 Service", release+"-onceflow-"+c)
			}
			m.get(t, "batch/v1 Job", release+"-onceflow-migrate")
			pods := m.pods()
			selects := func(sel map[string]string) bool {
				for _, p := range pods {
					if matches(sel, p.labels) {
						return true
					}
				}
				return false
			}
			for _, o := range m {
				switch x := o.obj.(type) {
				case *corev1.Service:
					if !selects(x.Spec.Selector) {
						t.Errorf("Service %s selects no pod the chart runs: %v", x.Name, x.Spec.Selector)
					}
				case *policyv1.PodDisruptionBudget:
					if !selects(x.Spec.Selector.MatchLabels) {
						t.Errorf("PodDisruptionBudget %s selects no pod the chart runs", x.Name)
					}
				case *appsv1.StatefulSet:
					if !matches(x.Spec.Selector.MatchLabels, x.Spec.Template.Labels) {
						t.Errorf("StatefulSet %s's selector does not select its own pods", x.Name)
					}
				case *appsv1.Deployment:
					if !matches(x.Spec.Selector.MatchLabels, x.Spec.Template.Labels) {
						t.Errorf("Deployment %s's selector does not select its own pods", x.Name)
					}
				}
			}
		})
	}
}

func matches(sel, labels map[string]string) bool {
	if len(sel) == 0 {
		return false
	}
	for k, v := range sel {
		if labels[k] != v {
			return false
		}
	}
	return true
}

// TestChartLints runs Helm's chart linter (`helm lint`, through the
// library) on both sets of values; a warning fails as an error does.
func TestChartLints(t *testing.T) {
	for name, files := range valueSets {
		t.Run(name, func(t *testing.T) {
			res := lint.RunAll(chartDir, values(t, files), namespace)
			for _, msg := range res.Messages {
				if msg.Severity >= support.WarningSev {
					t.Errorf("helm lint: %s", msg)
				} else {
					t.Logf("helm lint: %s", msg)
				}
			}
		})
	}
}

// TestSchemaRefusesMistakes: values.schema.json refuses a misspelt key, a
// value of the wrong kind and a grace shorter than the shutdown; the
// templates refuse a secret setting given as a value.
func TestSchemaRefusesMistakes(t *testing.T) {
	for name, override := range map[string]map[string]any{
		"misspelt key":                {"procesor": map[string]any{"replicas": 2}},
		"replicas as text":            {"relay": map[string]any{"replicas": "two"}},
		"unknown SASL mechanism":      {"kafka": map[string]any{"sasl": map[string]any{"mechanism": "GSSAPI"}}},
		"short grace":                 {"terminationGracePeriodSeconds": 10},
		"secret in env":               {"env": map[string]any{"DATABASE_URL": "postgres://onceflow:hunter2@db/onceflow"}},
		"secret in a component's env": {"relay": map[string]any{"env": map[string]any{"KAFKA_SASL_PASSWORD": "hunter2"}}},
		"SASL without passwords":      {"kafka": map[string]any{"sasl": map[string]any{"mechanism": "SCRAM-SHA-512"}}},
		"token without a secret":      {"adminToken": map[string]any{"components": []any{"processor"}}},
	} {
		t.Run(name, func(t *testing.T) {
			if _, err := renderErr(t, values(t, nil, override)); err == nil {
				t.Errorf("rendered with %v, want an error", override)
			} else {
				t.Log(err)
			}
		})
	}
}

// TestAlertRulesAreComposes: the PrometheusRule's rules are
// compose/prometheus/alerts.yml's, which promtool checks and unit-tests
// (compose's TestAlertRules): files/alerts.yml is a copy (a chart reads
// only its own files), equal byte for byte, and the rendered rule holds
// every group and alert of it.
func TestAlertRulesAreComposes(t *testing.T) {
	compose, err := os.ReadFile(filepath.Join("..", "..", "compose", "prometheus", "alerts.yml"))
	if err != nil {
		t.Fatal(err)
	}
	copied, err := os.ReadFile(filepath.Join(chartDir, "files", "alerts.yml"))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(compose, copied) {
		t.Fatal("onceflow/files/alerts.yml differs from compose/prometheus/alerts.yml: cp compose/prometheus/alerts.yml deploy/helm/onceflow/files/alerts.yml")
	}
	var want monitoringv1.PrometheusRuleSpec
	if err := yaml.UnmarshalStrict(compose, &want); err != nil {
		t.Fatalf("alerts.yml as a PrometheusRule's spec: %v", err)
	}
	m := render(t, values(t, valueSets["secured"]))
	got := m.get(t, "monitoring.coreos.com/v1 PrometheusRule", release+"-onceflow").(*monitoringv1.PrometheusRule)
	gb, _ := yaml.Marshal(got.Spec)
	wb, _ := yaml.Marshal(want)
	if !bytes.Equal(gb, wb) {
		t.Errorf("the PrometheusRule's spec is not alerts.yml's:\n%s\nwant\n%s", gb, wb)
	}
	alerts := 0
	for _, g := range got.Spec.Groups {
		alerts += len(g.Rules)
	}
	if n := bytes.Count(compose, []byte("- alert:")); alerts != n {
		t.Errorf("the PrometheusRule has %d alerts, alerts.yml %d", alerts, n)
	}
	sm := m.get(t, "monitoring.coreos.com/v1 ServiceMonitor", release+"-onceflow").(*monitoringv1.ServiceMonitor)
	// The alerts ask for job="onceflow" and a component label, as
	// compose's Prometheus names them.
	if sm.Spec.JobLabel != "app.kubernetes.io/part-of" {
		t.Errorf("ServiceMonitor jobLabel %q, want app.kubernetes.io/part-of (whose value is onceflow)", sm.Spec.JobLabel)
	}
	for _, o := range m {
		if s, ok := o.obj.(*corev1.Service); ok {
			if s.Labels["app.kubernetes.io/part-of"] != "onceflow" || !matches(sm.Spec.Selector.MatchLabels, s.Labels) {
				t.Errorf("the ServiceMonitor does not scrape Service %s as job onceflow", s.Name)
			}
		}
	}
}
