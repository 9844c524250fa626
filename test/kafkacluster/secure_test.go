package kafkacluster_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sasl/scram"

	"github.com/onceflow/onceflow/test/kafkacluster"
)

// A secured cluster serves clients only over SASL_SSL: a user with its
// password and the cluster's CA gets in, a plaintext client, a wrong
// password and an untrusted certificate do not; with ACLs, a user may do
// only what an ACL allows, and Apache Kafka's own tools reach it as admin.
func TestSecured(t *testing.T) {
	if testing.Short() {
		t.Skip("starts Apache Kafka; skipped with -short")
	}
	if _, err := exec.LookPath("java"); err != nil {
		t.Skip("Apache Kafka needs Java 17 (java on PATH); .ci/run's machines have it")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	c, err := kafkacluster.Start(ctx, kafkacluster.Config{Dir: t.TempDir(), HeapMB: 384,
		Security: &kafkacluster.Security{Users: []string{"alice"}, ACLs: true}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Log(c.Nodes()[0].Tail(60))
		}
		c.Stop(10 * time.Second)
	})

	client := func(opts ...kgo.Opt) *kgo.Client {
		t.Helper()
		cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(c.Brokers()...), kgo.RequestRetries(0)}, opts...)...)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(cl.Close)
		return cl
	}
	admin := kadm.NewClient(client(c.ClientOpts(kafkacluster.AdminUser)...))
	if _, err := admin.CreateTopic(ctx, 1, -1, nil, "t"); err != nil {
		t.Fatalf("admin creates a topic: %v", err)
	}

	// alice is authenticated, but no ACL lets her write.
	alice := client(append(c.ClientOpts("alice"), kgo.ProducerLinger(0))...)
	produce := func() error {
		pctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		return alice.ProduceSync(pctx, &kgo.Record{Topic: "t", Value: []byte("v")}).FirstErr()
	}
	if err := produce(); !errors.Is(err, kerr.TopicAuthorizationFailed) {
		t.Fatalf("alice produces without an ACL: %v, want TOPIC_AUTHORIZATION_FAILED", err)
	}
	acl := kadm.NewACLs().Allow("User:alice").Topics("t").Operations(kadm.OpWrite).ResourcePatternType(kadm.ACLPatternLiteral)
	if _, err := admin.CreateACLs(ctx, acl); err != nil {
		t.Fatal(err)
	}
	// The ACL reaches the broker through the metadata log: wait for it.
	deadline := time.Now().Add(time.Minute)
	for err := produce(); err != nil; err = produce() {
		if time.Now().After(deadline) || !errors.Is(err, kerr.TopicAuthorizationFailed) {
			t.Fatalf("alice produces with an ACL: %v", err)
		}
	}

	// A wrong password, and the right one without TLS, are refused.
	pingCtx, cancelPing := context.WithTimeout(ctx, 30*time.Second)
	defer cancelPing()
	pool := x509.NewCertPool()
	pem, err := os.ReadFile(c.CAFile())
	if err != nil || !pool.AppendCertsFromPEM(pem) {
		t.Fatalf("the cluster's CA: %v", err)
	}
	trusted := kgo.DialTLSConfig(&tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12})
	wrong := kgo.SASL(scram.Auth{User: "alice", Pass: "wrong"}.AsSha512Mechanism())
	if err := client(wrong, trusted).Ping(pingCtx); !errors.Is(err, kerr.SaslAuthenticationFailed) {
		t.Errorf("a wrong password: %v, want SASL_AUTHENTICATION_FAILED", err)
	} else {
		t.Logf("a wrong password: %v", err)
	}
	untrusted := kgo.DialTLSConfig(&tls.Config{MinVersion: tls.VersionTLS12})
	right := kgo.SASL(scram.Auth{User: "alice", Pass: c.Password("alice")}.AsSha512Mechanism())
	if err := client(right, untrusted).Ping(pingCtx); err == nil || !strings.Contains(err.Error(), "certificate") {
		t.Errorf("a client that does not trust the cluster's CA: %v, want a certificate error", err)
	} else {
		t.Logf("a client that does not trust the CA: %v", err)
	}
	plainCtx, cancelPlain := context.WithTimeout(ctx, 10*time.Second)
	defer cancelPlain()
	if err := client(right).Ping(plainCtx); err == nil {
		t.Error("a client without TLS got an answer")
	} else {
		t.Logf("a client without TLS: %v", err)
	}

	// Apache Kafka's tools reach it as admin.
	args := append(c.Tool("org.apache.kafka.tools.AclCommand"), "--list", "--topic", "t")
	out, err := exec.CommandContext(ctx, args[0], args[1:]...).CombinedOutput()
	if err != nil || !strings.Contains(string(out), "User:alice") {
		t.Errorf("kafka-acls --list: %v\n%s", err, out)
	}
}
