package kafka_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"github.com/twmb/franz-go/pkg/sasl/scram"

	"github.com/onceflow/onceflow/pipeline/kafka"
	"github.com/onceflow/onceflow/pipeline/pipelinetest"
)

// CheckAccess names every operation of a role that the broker's ACLs do
// not allow its principal, and nothing it allows; a broker without ACLs
// allows all (the embedded broker of onceflow dev).
func TestCheckAccess(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	allow := func(r kmsg.ACLResourceType, name string, op kmsg.ACLOperation) kfake.ACL {
		return kfake.ACL{Resource: r, Name: name, Pattern: kmsg.ACLResourcePatternTypeLiteral, Operation: op, Allow: true}
	}
	b := pipelinetest.Broker(t, kfake.EnableSASL(), kfake.EnableACLs(), kfake.SeedTopics(1, "t.commands", "t.events"),
		kfake.Superuser("SCRAM-SHA-512", "admin", "admin"),
		// The relay may write the commands and its transactional id; it
		// may only describe the events.
		kfake.User("SCRAM-SHA-512", "relay", "pw",
			allow(kmsg.ACLResourceTypeTopic, "t.commands", kmsg.ACLOperationWrite),
			allow(kmsg.ACLResourceTypeTopic, "t.events", kmsg.ACLOperationDescribe),
			allow(kmsg.ACLResourceTypeTransactionalId, "relay-0", kmsg.ACLOperationWrite)))
	cl := pipelinetest.Client(t, b.Addrs(), kgo.SASL(scram.Auth{User: "relay", Pass: "pw"}.AsSha512Mechanism()))

	needs := []kafka.Need{
		{Resource: kafka.Topic, Name: "t.commands", Op: kadm.OpWrite},
		{Resource: kafka.TransactionalID, Name: "relay-0", Op: kadm.OpWrite},
	}
	if err := kafka.CheckAccess(ctx, cl, "relay", "User:relay", needs); err != nil {
		t.Fatalf("everything granted: %v", err)
	}
	refused := []kafka.Need{
		{Resource: kafka.Topic, Name: "t.events", Op: kadm.OpWrite},        // Describe only
		{Resource: kafka.Topic, Name: "t.commands", Op: kadm.OpRead},       // Write only
		{Resource: kafka.Group, Name: "g", Op: kadm.OpRead},                // nothing
		{Resource: kafka.TransactionalID, Name: "other", Op: kadm.OpWrite}, // nothing
	}
	err := kafka.CheckAccess(ctx, cl, "relay", "User:relay", append(needs, refused...))
	var ae *kafka.AccessError
	if !errors.As(err, &ae) {
		t.Fatalf("refused needs: %v, want an *AccessError", err)
	}
	if len(ae.Missing) != len(refused) {
		t.Errorf("missing %v, want %v", ae.Missing, refused)
	}
	for _, n := range refused {
		if !strings.Contains(err.Error(), n.String()) {
			t.Errorf("the error does not name %q: %v", n, err)
		}
	}
	for _, want := range []string{"relay's principal User:relay", "docs/security.md#kafka-acls", "Write on topic t.events", "Read on group g"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("the error does not say %q: %v", want, err)
		}
	}
	t.Log(err)

	// Without ACLs, everything is allowed.
	plain := pipelinetest.Broker(t, kfake.SeedTopics(1, "t.commands", "t.events"))
	if err := kafka.CheckAccess(ctx, pipelinetest.Client(t, plain.Addrs()), "relay", "", append(needs, refused...)); err != nil {
		t.Errorf("a broker without ACLs: %v", err)
	}
}

// BenchmarkStartChecks is what a component's start asks the cluster: the
// topics' check every start makes (provision, the baseline) and the
// access check of a relay, a processor and a projector (access), as a
// principal with every ACL on the embedded broker with ACLs on.
func BenchmarkStartChecks(b *testing.B) {
	ctx := context.Background()
	prefixed := func(r kmsg.ACLResourceType, name string, op kmsg.ACLOperation) kfake.ACL {
		return kfake.ACL{Resource: r, Name: name, Pattern: kmsg.ACLResourcePatternTypePrefixed, Operation: op, Allow: true}
	}
	var acls []kfake.ACL
	for _, op := range []kmsg.ACLOperation{kmsg.ACLOperationRead, kmsg.ACLOperationWrite, kmsg.ACLOperationDescribe, kmsg.ACLOperationDescribeConfigs} {
		acls = append(acls, prefixed(kmsg.ACLResourceTypeTopic, "acme.", op), prefixed(kmsg.ACLResourceTypeGroup, "g-", op),
			prefixed(kmsg.ACLResourceTypeTransactionalId, "acme-", op))
	}
	br := pipelinetest.Broker(b, kfake.EnableSASL(), kfake.EnableACLs(), kfake.Superuser("SCRAM-SHA-512", "admin", "admin"),
		kfake.User("SCRAM-SHA-512", "all", "pw", acls...))
	topics := kafka.Topics{Prefix: "acme", Partitions: 8}
	admin := kadm.NewClient(pipelinetest.Client(b, br.Addrs(), kgo.SASL(scram.Auth{User: "admin", Pass: "admin"}.AsSha512Mechanism())))
	if err := kafka.Provision(ctx, admin, topics); err != nil {
		b.Fatal(err)
	}
	cl := pipelinetest.Client(b, br.Addrs(), kgo.SASL(scram.Auth{User: "all", Pass: "pw"}.AsSha512Mechanism()))
	need := func(r kafka.Resource, name string, op kadm.ACLOperation) kafka.Need {
		return kafka.Need{Resource: r, Name: name, Op: op}
	}
	relay := []kafka.Need{need(kafka.Topic, topics.Commands(), kadm.OpWrite)}
	for s := range 16 {
		relay = append(relay, need(kafka.TransactionalID, fmt.Sprintf("acme-relay-%d", s), kadm.OpWrite))
	}
	processor := []kafka.Need{need(kafka.Group, "g-processor", kadm.OpRead), need(kafka.TransactionalID, "acme-processor-1", kadm.OpWrite)}
	for _, t := range []string{topics.Commands(), topics.State(), topics.Dedup()} {
		processor = append(processor, need(kafka.Topic, t, kadm.OpRead))
	}
	for _, t := range []string{topics.Events(), topics.State(), topics.Dedup(), topics.DLQ(), topics.Commands()} {
		processor = append(processor, need(kafka.Topic, t, kadm.OpWrite))
	}
	projector := []kafka.Need{need(kafka.Topic, topics.Events(), kadm.OpRead), need(kafka.Group, "g-projector", kadm.OpRead)}

	b.Run("provision", func(b *testing.B) {
		adm := kadm.NewClient(cl)
		for b.Loop() {
			if err := kafka.Provision(ctx, adm, topics); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("access", func(b *testing.B) {
		for b.Loop() {
			for role, needs := range map[string][]kafka.Need{"relay": relay, "processor": processor, "projector": projector} {
				if err := kafka.CheckAccess(ctx, cl, role, "User:all", needs); err != nil {
					b.Fatal(err)
				}
			}
		}
	})
}
