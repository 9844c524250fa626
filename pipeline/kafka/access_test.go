package kafka_test

import (
	"context"
	"errors"
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
