package kafka_test

import (
	"context"
	"strings"
	"testing"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"github.com/twmb/franz-go/pkg/sasl/scram"

	"github.com/onceflow/onceflow/pipeline/kafka"
	"github.com/onceflow/onceflow/pipeline/pipelinetest"
)

func TestProvisionCreatesTopicsPerContract(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := pipelinetest.Broker(t)
	adm := kadm.NewClient(pipelinetest.Client(t, b.Addrs()))
	topics := kafka.Topics{Prefix: "acme", Partitions: 3}
	if err := kafka.Provision(ctx, adm, topics); err != nil {
		t.Fatal(err)
	}
	// A second provision (another component starting) is a no-op.
	if err := kafka.Provision(ctx, adm, topics); err != nil {
		t.Fatalf("second provision: %v", err)
	}
	want := map[string]map[string]string{
		"acme.commands":     {"cleanup.policy": "delete", "retention.ms": "604800000"},
		"acme.events":       {"cleanup.policy": "delete", "retention.ms": "-1"},
		"acme.state":        {"cleanup.policy": "compact"},
		"acme.commands.dlq": {"cleanup.policy": "delete", "retention.ms": "2592000000"},
	}
	cfgs, err := adm.DescribeTopicConfigs(ctx, "acme.commands", "acme.events", "acme.state", "acme.commands.dlq")
	if err != nil {
		t.Fatal(err)
	}
	for topic, kv := range want {
		rc, err := cfgs.On(topic, nil)
		if err != nil {
			t.Fatalf("%s: %v", topic, err)
		}
		got := map[string]string{}
		for _, c := range rc.Configs {
			got[c.Key] = c.MaybeValue()
		}
		for k, v := range kv {
			if got[k] != v {
				t.Errorf("%s %s: got %q, want %q", topic, k, got[k], v)
			}
		}
	}
	details, err := adm.ListTopics(ctx, "acme.commands", "acme.state")
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"acme.commands", "acme.state"} {
		if got := len(details[name].Partitions); got != 3 {
			t.Errorf("%s partitions: got %d, want 3", name, got)
		}
	}
}

func TestCheckRejectsUnequalStatePartitions(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := pipelinetest.Broker(t)
	adm := kadm.NewClient(pipelinetest.Client(t, b.Addrs()))
	topics := kafka.Topics{Prefix: "skew", Partitions: 2}
	// Someone created the state topic by hand with the wrong count.
	if _, err := adm.CreateTopic(ctx, 5, -1, map[string]*string{"cleanup.policy": kadm.StringPtr("compact")}, "skew.state"); err != nil {
		t.Fatal(err)
	}
	err := kafka.Provision(ctx, adm, topics)
	if err == nil || !strings.Contains(err.Error(), "must be equal") {
		t.Fatalf("got %v, want a partition-count mismatch error", err)
	}
}

func TestCheckRejectsWrongCleanupPolicy(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := pipelinetest.Broker(t)
	adm := kadm.NewClient(pipelinetest.Client(t, b.Addrs()))
	topics := kafka.Topics{Prefix: "pol", Partitions: 2}
	if _, err := adm.CreateTopic(ctx, 2, -1, map[string]*string{"cleanup.policy": kadm.StringPtr("delete")}, "pol.state"); err != nil {
		t.Fatal(err)
	}
	err := kafka.Provision(ctx, adm, topics)
	if err == nil || !strings.Contains(err.Error(), "cleanup.policy=delete, want compact") {
		t.Fatalf("got %v, want a cleanup policy error", err)
	}
}

func TestCheckReportsMissingTopics(t *testing.T) {
	t.Parallel()
	b := pipelinetest.Broker(t)
	adm := kadm.NewClient(pipelinetest.Client(t, b.Addrs()))
	err := kafka.Check(context.Background(), adm, kafka.Topics{Prefix: "none"})
	if err == nil || !strings.Contains(err.Error(), "none.commands does not exist") {
		t.Fatalf("got %v, want missing topic error", err)
	}
}

// A principal that may describe the topics but not create them (every
// component's on a cluster with ACLs, docs/security.md#kafka-acls)
// provisions topics the operator made; before they exist, it is told to
// have the operator make them.
func TestProvisionWithoutCreate(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	describe := func(op kmsg.ACLOperation) kfake.ACL {
		return kfake.ACL{Resource: kmsg.ACLResourceTypeTopic, Name: "acme.", Pattern: kmsg.ACLResourcePatternTypePrefixed, Operation: op, Allow: true}
	}
	b := pipelinetest.Broker(t, kfake.EnableSASL(), kfake.EnableACLs(),
		kfake.Superuser("SCRAM-SHA-512", "operator", "op"),
		kfake.User("SCRAM-SHA-512", "relay", "pw", describe(kmsg.ACLOperationDescribe), describe(kmsg.ACLOperationDescribeConfigs)))
	relay := kadm.NewClient(pipelinetest.Client(t, b.Addrs(), kgo.SASL(scram.Auth{User: "relay", Pass: "pw"}.AsSha512Mechanism())))
	operator := kadm.NewClient(pipelinetest.Client(t, b.Addrs(), kgo.SASL(scram.Auth{User: "operator", Pass: "op"}.AsSha512Mechanism())))
	topics := kafka.Topics{Prefix: "acme", Partitions: 2}

	err := kafka.Provision(ctx, relay, topics)
	if err == nil || !strings.Contains(err.Error(), "onceflow topics create") {
		t.Fatalf("provision before the topics exist: %v, want the operator told to create them", err)
	}
	t.Log(err)
	if err := kafka.Provision(ctx, operator, topics); err != nil {
		t.Fatal(err)
	}
	if err := kafka.Provision(ctx, relay, topics); err != nil {
		t.Errorf("provision of existing topics without Create: %v", err)
	}
}
