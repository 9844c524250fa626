package e2e

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/onceflow/onceflow/examples/ledger/ledgerapp"
	"github.com/onceflow/onceflow/pipeline/apiclient"
	"github.com/onceflow/onceflow/pipeline/ingest"
	"github.com/onceflow/onceflow/pipeline/pipelinetest"
	"github.com/onceflow/onceflow/test/kafkacluster"
)

// principals are the Kafka users of a secured deployment: one per
// component, and the operator's (docs/security.md#kafka-acls).
var principals = []string{"ingest", "relay", "processor", "projector", "worker", "operator"}

// securedKafka starts a one-node Apache Kafka cluster of the test's own
// with SASL_SSL listeners, ACLs on and a user per principal. It runs with
// the suite on Apache Kafka (make test-kafka), which has Java.
func securedKafka(t *testing.T) *kafkacluster.Cluster {
	t.Helper()
	if ExternalKafka() == "" {
		t.Skip("runs with the suite on Apache Kafka (make test-kafka, or KAFKA_BROKERS set): it starts a secured node of its own")
	}
	// A bound, not a figure: 30-60 s at load 13-21, 3 minutes before
	// the node listened at load 50.
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	// Few partitions for the internal topics: a quicker start.
	c, err := kafkacluster.Start(ctx, kafkacluster.Config{Dir: t.TempDir(), HeapMB: 384,
		Props:    map[string]string{"offsets.topic.num.partitions": "2", "transaction.state.log.num.partitions": "2"},
		Security: &kafkacluster.Security{Users: principals, ACLs: true}})
	if err != nil {
		t.Fatalf("start the secured cluster: %v", err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("the authorizer's refusals:\n%s", denials(c))
		}
		c.Stop(10 * time.Second)
	})
	return c
}

// kafkaEnv is the environment that connects a component to the secured
// cluster c as user: SCRAM-SHA-512 over TLS, trusting c's CA.
func kafkaEnv(c *kafkacluster.Cluster, user string) map[string]string {
	return map[string]string{
		"KAFKA_BROKERS":        c.Bootstrap(),
		"KAFKA_TLS":            "true",
		"KAFKA_TLS_CA_FILE":    c.CAFile(),
		"KAFKA_SASL_MECHANISM": kafkacluster.SCRAMMechanism,
		"KAFKA_SASL_USER":      user,
		"KAFKA_SASL_PASSWORD":  c.Password(user),
	}
}

// grantACLs grants the ACLs of docs/security.md#kafka-acls for the
// ledger's deployment of prefix: scripts/kafka-acls.sh, run as a user
// runs it, with Apache Kafka's kafka-acls on the cluster's jars.
func grantACLs(t *testing.T, ctx context.Context, c *kafkacluster.Cluster, prefix string) {
	t.Helper()
	bin := t.TempDir()
	if err := c.WriteTools(bin); err != nil {
		t.Fatal(err)
	}
	root, err := repoRoot()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.CommandContext(ctx, "sh", filepath.Join(root, "scripts", "kafka-acls.sh"))
	cmd.Env = append(os.Environ(), "PATH="+bin+string(os.PathListSeparator)+os.Getenv("PATH"),
		"BOOTSTRAP="+c.Bootstrap(), "COMMAND_CONFIG="+c.ToolConfig(), "PREFIX="+prefix,
		"PROCESSOR_GROUP=onceflow-processor", "PROJECTOR_GROUP=onceflow-projector")
	start := time.Now()
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("scripts/kafka-acls.sh: %v\n%s", err, out)
	}
	t.Logf("scripts/kafka-acls.sh granted the ACLs in %s", time.Since(start).Round(time.Second))
}

// deploySecured deploys the ledger on the secured cluster with the ACLs
// of docs/security.md#kafka-acls: the operator makes the topics (the
// registry runs beside, `dev --broker-only`), then each component runs as
// its own user.
func deploySecured(t *testing.T, ctx context.Context, c *kafkacluster.Cluster) *deployment {
	t.Helper()
	pool, url := pipelinetest.Pool(t)
	pl := NewPipeline(binDir, t.TempDir(), url)
	pl.BrokerAddr, pl.External = c.Bootstrap(), true
	pl.Prefix = pl.TopicPrefix("ledger")
	grantACLs(t, ctx, c, pl.Prefix)
	pl.ClientOpts = c.ClientOpts(kafkacluster.AdminUser)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("process logs:\n%s", pl.Logs(80))
		}
		// The ledger's groups and transactional ids are fixed names: the
		// next test's components join them once these have left.
		pl.StopAll(15 * time.Second)
	})
	pl.BrokerEnv = kafkaEnv(c, "operator")
	pl.OperatorEnv = kafkaEnv(c, "operator")
	if _, err := pl.StartBroker(ctx); err != nil {
		t.Fatal(err)
	}
	d := &deployment{Pipeline: pl, pool: pool, comps: map[string]*Component{}}
	for _, kind := range []string{"ingest", "relay", "processor", "projector"} {
		comp, err := d.StartComponent(ctx, kind, kind, kafkaEnv(c, kind))
		if err != nil {
			t.Fatal(err)
		}
		d.comps[kind] = comp
	}
	key := ingest.NewAPIKey()
	if err := ingest.CreateAPIKey(ctx, pool, "acme", "e2e", key); err != nil {
		t.Fatal(err)
	}
	d.client = &ledgerapp.Client{Client: &apiclient.Client{BaseURL: d.comps["ingest"].HTTP, APIKey: key}}
	return d
}

// The pipeline runs end to end on Apache Kafka over SASL_SSL, each
// component authenticating as its own user (SCRAM-SHA-512, TLS with the
// cluster's CA) with only the ACLs of its role (scripts/kafka-acls.sh):
// the exactly-once workload gives exact balances and one event per
// command. A component started as another role's user, or with a wrong
// password, does not start: it exits non-zero naming what its principal
// is not allowed, or the failed authentication.
func TestPipelineOverSASLSSL(t *testing.T) {
	c := securedKafka(t)
	// A bound: 90 s at load 13, 3 minutes at load 21; at load 60 the
	// ACL script's 13 JVM starts alone took over 4 minutes.
	ctx, cancel := context.WithTimeout(context.Background(), 12*time.Minute)
	defer cancel()
	d := deploySecured(t, ctx, c)
	m := newModel()
	workload(t, ctx, func() *ledgerapp.Client { return d.client }, m, 10, 10, 0)
	if t.Failed() {
		return
	}
	d.checkExact(t, ctx, m)

	p := d.Prefix
	wrongPassword := kafkaEnv(c, "processor")
	wrongPassword["KAFKA_SASL_PASSWORD"] = "wrong"
	for _, w := range []struct {
		kind, user string
		env        map[string]string
		want       []string
	}{
		// Each refusal names the role, the principal and what it lacks.
		{"relay", "projector", kafkaEnv(c, "projector"), []string{
			"the relay's principal User:projector is not allowed",
			"Write on topic " + p + ".commands", "Write on transactional id onceflow-relay-" + p + "-0",
			"docs/security.md#kafka-acls"}},
		{"processor", "relay", kafkaEnv(c, "relay"), []string{
			"the processor's principal User:relay is not allowed",
			"Read on group onceflow-processor", "Read on topic " + p + ".commands", "Write on topic " + p + ".events",
			"Write on transactional id onceflow-processor-processor-as-relay"}},
		{"projector", "processor", kafkaEnv(c, "processor"), []string{
			"the projector's principal User:processor is not allowed",
			"Read on topic " + p + ".events", "Read on group onceflow-projector"}},
		{"processor", "processor with a wrong password", wrongPassword, []string{
			"SASL_AUTHENTICATION_FAILED", "invalid credentials with SASL mechanism SCRAM-SHA-512"}},
	} {
		instance := w.kind + "-as-" + strings.ReplaceAll(w.user, " ", "-")
		launched := time.Now()
		comp, err := d.LaunchComponent(w.kind, instance, w.env)
		if err != nil {
			t.Fatal(err)
		}
		wctx, cancel := context.WithTimeout(ctx, time.Minute)
		err = comp.Wait(wctx)
		ran := wctx.Err() != nil
		cancel()
		log := comp.Tail(40)
		if err == nil || ran {
			t.Errorf("%s as %s: %v, want a non-zero exit\n%s", w.kind, w.user, err, log)
			comp.Kill()
			continue
		}
		for _, want := range w.want {
			if !strings.Contains(log, want) {
				t.Errorf("%s as %s: the log does not say %q:\n%s", w.kind, w.user, want, log)
			}
		}
		t.Logf("%s as %s: exited in %s: %v", w.kind, w.user, time.Since(launched).Round(time.Millisecond), lastLine(log))
	}

	// The refused components changed nothing: the pipeline still serves.
	workload(t, ctx, func() *ledgerapp.Client { return d.client }, m, 2, 5, 0)
	if !t.Failed() {
		d.checkExact(t, ctx, m)
	}
}

// lastLine is s's last line that is not the harness's own.
func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	for i := len(lines) - 1; i >= 0; i-- {
		if !strings.HasPrefix(lines[i], "=== ") {
			return lines[i]
		}
	}
	return ""
}

// denials returns the lines of the secured cluster's log in which its
// authorizer refused a request.
func denials(c *kafkacluster.Cluster) string {
	var out []string
	for _, line := range strings.Split(c.Nodes()[0].Tail(200000), "\n") {
		if strings.Contains(line, " is Denied operation ") {
			out = append(out, line)
		}
	}
	return strings.Join(out, "\n")
}
