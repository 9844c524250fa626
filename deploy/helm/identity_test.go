package helm

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
)

// instanceIDs resolves each pod's ONCEFLOW_INSTANCE_ID the way the kubelet
// would for the pod of ordinal i: a StatefulSet's pod i is named
// NAME-i, whichever node it runs on and however often it restarted; a
// Deployment's or a Job's pods are named NAME-HASH-RANDOM, new at every
// replacement, so an id from their name is an error here.
func instanceIDs(t *testing.T, p pod, c corev1.Container) []string {
	t.Helper()
	var ids []string
	for _, e := range c.Env {
		if e.Name != "ONCEFLOW_INSTANCE_ID" {
			continue
		}
		for i := range int(p.replicas) {
			switch {
			case e.ValueFrom == nil && strings.Contains(e.Value, "$("):
				t.Fatalf("%s: ONCEFLOW_INSTANCE_ID=%s names other variables; resolve them here first", p.workload, e.Value)
			case e.ValueFrom == nil:
				ids = append(ids, e.Value) // the same for every replica: caught below
			case e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "metadata.name" && p.kind == "StatefulSet":
				ids = append(ids, fmt.Sprintf("%s-%d", p.name, i))
			default:
				t.Fatalf("%s: ONCEFLOW_INSTANCE_ID from %+v, which is not a stable name", p.workload, e.ValueFrom)
			}
		}
	}
	return ids
}

// TestInstanceIDsAreStable: the components that read an instance id (by
// their -h: today the relay, whose lease-table name it is, and the
// processor, whose transactional id ends in it) are StatefulSets whose
// pods take the id from their own stable name; the others read none and
// are given none. Each replica's id is unique, and the same after the pod
// is replaced and after an upgrade that rolls every pod (a new image, a
// setting changed, more replicas): the pod that replaces a zombie
// processor initializes the same transactional id and fences it.
func TestInstanceIDsAreStable(t *testing.T) {
	for name, files := range valueSets {
		t.Run(name, func(t *testing.T) {
			before := idsByWorkload(t, render(t, values(t, files)))
			if len(before) == 0 {
				t.Fatal("no component reads an instance id: the test reads -h wrong?")
			}
			rolled := render(t, values(t, files, map[string]any{
				"image":     map[string]any{"tag": "next", "digest": ""},
				"logLevel":  "debug",
				"relay":     map[string]any{"replicas": 4},
				"processor": map[string]any{"replicas": 5, "env": map[string]any{"ONCEFLOW_PROCESSOR_SESSION_TIMEOUT": "20s"}},
			}))
			after := idsByWorkload(t, rolled)
			for w, ids := range before {
				got := after[w]
				if len(got) < len(ids) || !slices.Equal(got[:len(ids)], ids) {
					t.Errorf("%s: instance ids %v before the upgrade, %v after: each ordinal must keep its id", w, ids, got)
				}
			}
			if len(after) != len(before) {
				t.Errorf("workloads with an instance id: %v before, %v after", keys(before), keys(after))
			}
		})
	}
}

// idsByWorkload checks each pod's identity and returns the instance ids of
// those that have one, by workload, in ordinal order.
func idsByWorkload(t *testing.T, m manifests) map[string][]string {
	t.Helper()
	out := map[string][]string{}
	for _, p := range m.pods() {
		for _, c := range p.containers() {
			reads := settings(t, commandOf(c)...).vars["ONCEFLOW_INSTANCE_ID"]
			ids := instanceIDs(t, p, c)
			switch {
			case reads && p.kind != "StatefulSet":
				t.Errorf("%s (onceflow %s) reads an instance id and is a %s: its pods' names change at every replacement", p.workload, strings.Join(commandOf(c), " "), p.kind)
			case reads && len(ids) != int(p.replicas):
				t.Errorf("%s: %d instance ids for %d replicas; the default (the host name) is not left to chance", p.workload, len(ids), p.replicas)
			case !reads && len(ids) > 0:
				t.Errorf("%s: sets ONCEFLOW_INSTANCE_ID, which its command does not read", p.workload)
			}
			seen := map[string]bool{}
			for _, id := range ids {
				if seen[id] {
					t.Errorf("%s: two replicas with instance id %s: they would fence each other", p.workload, id)
				}
				seen[id] = true
			}
			if len(ids) > 0 {
				out[p.workload+"/"+c.Name] = ids
			}
		}
	}
	return out
}

// shutdownBound is how long a component may take to stop after SIGTERM:
// RunConfig.ShutdownTimeout's default (20 s, run.go) for the work in
// flight, then up to 5 s to export the last spans.
const shutdownBound = 25

// TestPodsAreRunnable: every long-running pod is probed on the admin
// endpoints (/readyz for readiness, /healthz for liveness, on the port
// ADMIN_ADDR listens on), has requests and a memory limit, a grace
// longer than the components' shutdown, runs as non-root on a read-only
// root, and every component of more than one replica has a
// PodDisruptionBudget that lets at most one go at a time.
func TestPodsAreRunnable(t *testing.T) {
	for name, files := range valueSets {
		t.Run(name, func(t *testing.T) {
			m := render(t, values(t, files))
			for _, p := range m.pods() {
				if g := p.spec.TerminationGracePeriodSeconds; p.kind != "Job" && (g == nil || *g <= shutdownBound) {
					t.Errorf("%s: termination grace %v, want more than %d s", p.workload, g, shutdownBound)
				}
				if sc := p.spec.SecurityContext; sc == nil || sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot {
					t.Errorf("%s: may run as root", p.workload)
				}
				for _, c := range p.containers() {
					if c.Resources.Requests.Cpu().IsZero() || c.Resources.Requests.Memory().IsZero() || c.Resources.Limits.Memory().IsZero() {
						t.Errorf("%s container %s: resources %v, want cpu and memory requests and a memory limit", p.workload, c.Name, c.Resources)
					}
					if sc := c.SecurityContext; sc == nil || sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem {
						t.Errorf("%s container %s: a writable root", p.workload, c.Name)
					}
					if p.kind == "Job" {
						continue
					}
					if envValue(c, "ADMIN_ADDR") != ":9090" && c.Name != "lag" {
						t.Errorf("%s: ADMIN_ADDR %q, want :9090, the admin port", p.workload, envValue(c, "ADMIN_ADDR"))
					}
					probe(t, p.workload+" readiness", c.ReadinessProbe, "/readyz", c)
					probe(t, p.workload+" liveness", c.LivenessProbe, "/healthz", c)
				}
				if p.kind == "Job" || p.replicas < 2 {
					continue
				}
				var pdbs []*policyv1.PodDisruptionBudget
				for _, o := range m {
					if b, ok := o.obj.(*policyv1.PodDisruptionBudget); ok && matches(b.Spec.Selector.MatchLabels, p.labels) {
						pdbs = append(pdbs, b)
					}
				}
				if len(pdbs) != 1 || pdbs[0].Spec.MaxUnavailable == nil || pdbs[0].Spec.MaxUnavailable.IntValue() != 1 {
					t.Errorf("%s: PodDisruptionBudgets %v, want one with maxUnavailable 1", p.workload, pdbs)
				}
			}
			for _, o := range m {
				if s, ok := o.obj.(*appsv1.StatefulSet); ok {
					svc := m.get(t, "v1 Service", s.Spec.ServiceName).(*corev1.Service)
					if svc.Spec.ClusterIP != corev1.ClusterIPNone {
						t.Errorf("StatefulSet %s's Service %s is not headless", s.Name, svc.Name)
					}
				}
			}
		})
	}
}

// probe checks that a probe asks path on the container's admin port.
func probe(t *testing.T, what string, p *corev1.Probe, path string, c corev1.Container) {
	t.Helper()
	if p == nil || p.HTTPGet == nil {
		t.Errorf("%s: no HTTP probe", what)
		return
	}
	if p.HTTPGet.Path != path {
		t.Errorf("%s: probes %s, want %s", what, p.HTTPGet.Path, path)
	}
	port := p.HTTPGet.Port.String()
	for _, cp := range c.Ports {
		if (cp.Name == port || fmt.Sprint(cp.ContainerPort) == port) && cp.ContainerPort == 9090 {
			return
		}
	}
	t.Errorf("%s: probes port %s, not the admin port 9090", what, port)
}

// TestWorkerEgress: the worker's NetworkPolicy lets it reach DNS,
// Postgres and public addresses, and private ones only where the values
// allow them, the same networks its address guard is told
// (ONCEFLOW_WEBHOOK_ALLOW_NETWORKS).
func TestWorkerEgress(t *testing.T) {
	m := render(t, values(t, valueSets["secured"]))
	np := m.get(t, "networking.k8s.io/v1 NetworkPolicy", release+"-onceflow-worker-egress").(*networkingv1.NetworkPolicy)
	worker := m.get(t, "apps/v1 Deployment", release+"-onceflow-worker").(*appsv1.Deployment)
	if !matches(np.Spec.PodSelector.MatchLabels, worker.Spec.Template.Labels) {
		t.Fatal("the NetworkPolicy does not select the worker's pods")
	}
	if !slices.Equal(np.Spec.PolicyTypes, []networkingv1.PolicyType{networkingv1.PolicyTypeEgress}) {
		t.Errorf("policy types %v, want Egress", np.Spec.PolicyTypes)
	}
	var cidrs, excepted []string
	dns, postgres := false, false
	for _, r := range np.Spec.Egress {
		for _, p := range r.Ports {
			dns = dns || p.Port.IntValue() == 53
			postgres = postgres || p.Port.IntValue() == 5432 && slices.ContainsFunc(r.To, func(p networkingv1.NetworkPolicyPeer) bool {
				return p.IPBlock != nil && p.IPBlock.CIDR == "10.20.0.0/16"
			})
		}
		for _, to := range r.To {
			if to.IPBlock != nil {
				cidrs = append(cidrs, to.IPBlock.CIDR)
				excepted = append(excepted, to.IPBlock.Except...)
			}
		}
	}
	if !dns || !postgres {
		t.Errorf("egress to DNS %v, to Postgres (10.20.0.0/16:5432) %v; want both", dns, postgres)
	}
	for _, want := range []string{"0.0.0.0/0", "::/0", "10.30.0.0/16"} {
		if !slices.Contains(cidrs, want) {
			t.Errorf("egress to %s missing from %v", want, cidrs)
		}
	}
	for _, private := range []string{"10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "169.254.0.0/16", "127.0.0.0/8", "fc00::/7", "fe80::/10"} {
		if !slices.Contains(excepted, private) {
			t.Errorf("the public egress does not except %s", private)
		}
	}
	if got := envValue(worker.Spec.Template.Spec.Containers[0], "ONCEFLOW_WEBHOOK_ALLOW_NETWORKS"); got != "10.30.0.0/16" {
		t.Errorf("the worker's ONCEFLOW_WEBHOOK_ALLOW_NETWORKS %q, want the policy's 10.30.0.0/16", got)
	}
}
