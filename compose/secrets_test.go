package compose

import (
	"crypto/tls"
	"crypto/x509"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/onceflow/onceflow/test/kafkacluster"
)

// runSecrets runs compose/secrets.sh in a copy of compose/ and returns the
// copy: its secrets/ and .env are what the stack would mount.
func runSecrets(t *testing.T) string {
	t.Helper()
	if _, err := exec.LookPath("openssl"); err != nil {
		t.Skip("openssl is not installed (compose/secrets.sh makes the certificates with it)")
	}
	dir := t.TempDir()
	script, err := os.ReadFile("secrets.sh")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "secrets.sh"), script, 0o755); err != nil { // #nosec G306 -- an executable script
		t.Fatal(err)
	}
	if out, err := exec.Command("bash", filepath.Join(dir, "secrets.sh")).CombinedOutput(); err != nil { // #nosec G204 -- the test's copy
		t.Fatalf("compose/secrets.sh: %v\n%s", err, out)
	}
	return dir
}

// compose/secrets.sh makes every secret the stack mounts, and what makes
// Kafka's listeners work: a key and certificate chain (one PEM file) that
// the stack's CA signed for kafka and localhost, as a server and as the
// client the controller listener requires, named kafka-node (a super
// user); the broker's JAAS login as the user broker; the admin's client
// settings (SCRAM-SHA-512 over TLS trusting the CA); the registry's login
// as its own user; and a distinct password per Kafka user.
func TestSecrets(t *testing.T) {
	s := loadStack(t)
	dir := runSecrets(t)
	read := func(name string) string {
		t.Helper()
		f, ok := s.Secrets[name]
		if !ok {
			t.Fatalf("docker-compose.yml declares no secret %s", name)
		}
		b, err := os.ReadFile(filepath.Join(dir, f.File))
		if err != nil {
			t.Fatalf("secret %s: %v", name, err)
		}
		return string(b)
	}
	for name := range s.Secrets {
		read(name)
	}

	pem := []byte(read("kafka_keystore"))
	pair, err := tls.X509KeyPair(pem, pem)
	if err != nil {
		t.Fatalf("kafka_keystore: want the node's key and certificate in one PEM file: %v", err)
	}
	leaf, err := x509.ParseCertificate(pair.Certificate[0])
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM([]byte(read("ca_crt"))) {
		t.Fatal("ca_crt holds no certificate")
	}
	for _, host := range []string{"kafka", "localhost"} {
		for _, usage := range []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth} {
			if _, err := leaf.Verify(x509.VerifyOptions{DNSName: host, Roots: roots, KeyUsages: []x509.ExtKeyUsage{usage}}); err != nil {
				t.Errorf("kafka_keystore: the node's certificate for %s (usage %v): %v", host, usage, err)
			}
		}
	}
	if leaf.Subject.CommonName != "kafka-node" {
		t.Errorf("kafka_keystore: common name %q, want kafka-node, its principal on the controller listener", leaf.Subject.CommonName)
	}
	if !strings.Contains(string(pem), "-----BEGIN PRIVATE KEY-----") {
		t.Error("kafka_keystore: want an unencrypted PKCS#8 key, which Kafka's PEM key store reads without ssl.key.password")
	}

	login := func(user string) string {
		return `org.apache.kafka.common.security.scram.ScramLoginModule required username="` + user + `" password="` + strings.TrimRight(read("kafka_"+user), "\n") + `";`
	}
	if jaas := read("kafka_jaas"); !strings.Contains(jaas, "KafkaServer {") || !strings.Contains(jaas, login("broker")) {
		t.Errorf("kafka_jaas: want the broker's SCRAM login as broker in KafkaServer:\n%s", jaas)
	}
	admin := readProperties(t, filepath.Join(dir, s.Secrets["kafka_admin_properties"].File))
	if admin["security.protocol"] != "SASL_SSL" || admin["sasl.mechanism"] != kafkacluster.SCRAMMechanism || admin["sasl.jaas.config"] != login(kafkacluster.AdminUser) ||
		admin["ssl.truststore.type"] != "PEM" || admin["ssl.truststore.location"] != "/run/secrets/ca_crt" {
		t.Errorf("kafka_admin_properties: want admin's SCRAM-SHA-512 login over TLS trusting /run/secrets/ca_crt: %v", admin)
	}
	env, err := os.ReadFile(filepath.Join(dir, ".env"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(env), "ONCEFLOW_REGISTRY_KAFKA_JAAS="+login(registryUser)+"\n") {
		t.Errorf(".env: want the schema registry's SCRAM login as %s:\n%s", registryUser, env)
	}
	passwords := map[string]string{}
	for _, u := range scramUsers(t, s) {
		pw := strings.TrimRight(read("kafka_"+u), "\n")
		if other, dup := passwords[pw]; dup || len(strings.TrimSpace(pw)) < 32 {
			t.Errorf("kafka_%s: a password of its own, want at least 32 characters and none shared (with %s)", u, other)
		}
		passwords[pw] = u
	}
	if !slices.Contains(scramUsers(t, s), registryUser) {
		t.Errorf("kafka: the schema registry's user %s is not among SCRAM_USERS", registryUser)
	}
}
