package compose

import (
	"bufio"
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/pbkdf2"
	"crypto/sha512"
	"encoding/base64"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"

	"github.com/onceflow/onceflow"
	"github.com/onceflow/onceflow/examples/ledger/ledgerapp"
	"github.com/onceflow/onceflow/pipeline/kafka"
	"github.com/onceflow/onceflow/test/kafkacluster"
)

// The compose stack's Kafka is what the local cluster the tests run proves
// (test/kafkacluster with Security, TestPipelineOverSASLSSL and
// TestSecured): Apache Kafka of the same release line, clients only on
// SASL_SSL with SCRAM-SHA-512, the controller listener on mutual TLS,
// StandardAuthorizer with the broker and an admin as the only super
// users, a SCRAM user per component created with the storage, and the
// ACLs of scripts/kafka-acls.sh granted before anything on Kafka starts.
// Docker cannot run here, so these tests read the files the containers
// would run with; TestComposeConfig has docker compose itself parse them
// where its plugin is installed.

// stack is the part of docker-compose.yml these tests read.
type stack struct {
	Services map[string]stackService `yaml:"services"`
	Secrets  map[string]struct {
		File string `yaml:"file"`
	} `yaml:"secrets"`
}

type stackService struct {
	Image       string            `yaml:"image"`
	Entrypoint  []string          `yaml:"entrypoint"`
	Command     []string          `yaml:"command"`
	Environment map[string]string `yaml:"environment"`
	Secrets     []string          `yaml:"secrets"`
	Volumes     []string          `yaml:"volumes"`
	DependsOn   yaml.Node         `yaml:"depends_on"`
}

func loadStack(t *testing.T) stack {
	t.Helper()
	b, err := os.ReadFile("docker-compose.yml")
	if err != nil {
		t.Fatal(err)
	}
	var s stack
	if err := yaml.Unmarshal(b, &s); err != nil {
		t.Fatalf("docker-compose.yml: %v", err)
	}
	return s
}

// service returns the service name, failing the test without it.
func (s stack) service(t *testing.T, name string) stackService {
	t.Helper()
	svc, ok := s.Services[name]
	if !ok {
		t.Fatalf("docker-compose.yml has no service %s", name)
	}
	return svc
}

// dependsOn returns the condition the service waits for on another
// ("service_started" for the list form), "" if it does not wait for it.
func (svc stackService) dependsOn(other string) string {
	n := svc.DependsOn
	switch n.Kind {
	case yaml.SequenceNode:
		for _, c := range n.Content {
			if c.Value == other {
				return "service_started"
			}
		}
	case yaml.MappingNode:
		for i := 0; i+1 < len(n.Content); i += 2 {
			if n.Content[i].Value != other {
				continue
			}
			var d struct {
				Condition string `yaml:"condition"`
			}
			if err := n.Content[i+1].Decode(&d); err != nil || d.Condition == "" {
				return "service_started"
			}
			return d.Condition
		}
	}
	return ""
}

// mounted returns the file on the host that the service sees at path in
// the container (a volume of the file or of a directory holding it), ""
// if none is mounted there.
func (svc stackService) mounted(path string) string {
	for _, v := range svc.Volumes {
		parts := strings.Split(v, ":")
		if len(parts) < 2 || !strings.HasPrefix(parts[0], ".") {
			continue
		}
		host, in := parts[0], parts[1]
		if rel, err := filepath.Rel(in, path); err == nil && !strings.HasPrefix(rel, "..") {
			return filepath.Join(host, rel)
		}
	}
	return ""
}

// secretFile returns the host file of the secret the service reads at
// path (/run/secrets/NAME), "" if it does not mount it.
func (s stack) secretFile(svc stackService, path string) string {
	name, ok := strings.CutPrefix(path, "/run/secrets/")
	if !ok || !slices.Contains(svc.Secrets, name) {
		return ""
	}
	return s.Secrets[name].File
}

// readProperties reads a Java properties file of key=value lines.
func readProperties(t *testing.T, path string) map[string]string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	props := map[string]string{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		k, v, _ := strings.Cut(line, "=")
		props[strings.TrimSpace(k)] = strings.TrimSpace(v)
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return props
}

// brokerConfig returns the kafka service's server.properties: the file
// kafka/start.sh runs the node on, as the service mounts it.
func brokerConfig(t *testing.T, s stack) map[string]string {
	t.Helper()
	k := s.service(t, "kafka")
	if !slices.Contains(k.Entrypoint, "/onceflow/kafka/start.sh") {
		t.Fatalf("kafka: entrypoint %v does not run /onceflow/kafka/start.sh, which formats the storage with the SCRAM users", k.Entrypoint)
	}
	start, conf := k.mounted("/onceflow/kafka/start.sh"), k.mounted("/onceflow/kafka/server.properties")
	if start == "" || conf == "" {
		t.Fatalf("kafka: volumes %v do not mount kafka/start.sh and kafka/server.properties at /onceflow/kafka", k.Volumes)
	}
	formatted(t, s, start, conf)
	return readProperties(t, conf)
}

// formatted runs the kafka service's start script as the container would,
// with its environment and secrets of the test's, on the jars of the
// local cluster's Apache Kafka, its configuration beside it with the log
// directory moved into the test's: the storage is formatted for real.
// It checks that the storage has the cluster id and a SCRAM-SHA-512 user
// per SCRAM_USERS whose stored key is its secret's password's, that no
// password was on the command line of any process the script ran (ps
// shows command lines to every user of the host; the tool reads them from
// an argument file, removed once it ran), then that the node runs on the
// configuration it formatted with.
func formatted(t *testing.T, s stack, start, conf string) {
	t.Helper()
	env := s.Services["kafka"].Environment
	if id, err := base64.RawURLEncoding.DecodeString(env["CLUSTER_ID"]); err != nil || len(id) != 16 {
		t.Errorf("kafka: CLUSTER_ID %q, want a KRaft cluster id (16 bytes, base64url without padding): %v", env["CLUSTER_ID"], err)
	}
	lib, err := kafkacluster.Fetch(context.Background(), "")
	if err != nil {
		t.Fatalf("Apache Kafka's jars: %v", err)
	}
	java, err := exec.LookPath("java")
	if err != nil {
		t.Fatalf("no java: %v", err)
	}
	dir := t.TempDir()
	home, bin, secrets, node, data := filepath.Join(dir, "kafka-home"), filepath.Join(dir, "bin"), filepath.Join(dir, "secrets"), filepath.Join(dir, "onceflow", "kafka"), filepath.Join(dir, "data")
	for _, d := range []string{filepath.Join(home, "bin"), bin, secrets, node} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink(lib, filepath.Join(home, "libs")); err != nil {
		t.Fatal(err)
	}
	// The script and its configuration, as mounted, the log directory the
	// test's.
	script, err := os.ReadFile(start)
	if err != nil {
		t.Fatal(err)
	}
	props, err := os.ReadFile(conf)
	if err != nil {
		t.Fatal(err)
	}
	props = regexp.MustCompile(`(?m)^log\.dirs=.*$`).ReplaceAll(props, []byte("log.dirs="+data))
	for path, b := range map[string][]byte{filepath.Join(node, "start.sh"): script, filepath.Join(node, "server.properties"): props} {
		if err := os.WriteFile(path, b, 0o755); err != nil { // #nosec G306 -- the script must run
			t.Fatal(err)
		}
	}
	// java and kafka-server-start.sh record their arguments, and java runs.
	calls := filepath.Join(dir, "calls")
	record := func(name, then string) string {
		return "#!/bin/sh\nprintf '%s' " + name + " >> \"" + calls + "\"\nfor a; do printf '\\t%s' \"$a\"; done >> \"" + calls + "\"\necho >> \"" + calls + "\"\n" + then
	}
	for path, body := range map[string]string{filepath.Join(bin, "java"): record("java", "exec "+java+" \"$@\"\n"),
		filepath.Join(home, "bin", "kafka-server-start.sh"): record("kafka-server-start.sh", "")} {
		if err := os.WriteFile(path, []byte(body), 0o755); err != nil { // #nosec G306 -- an executable script
			t.Fatal(err)
		}
	}
	users := strings.Fields(env["SCRAM_USERS"])
	passwords := map[string]string{}
	for _, u := range users {
		passwords[u] = "pw-" + u + "-" + strings.Repeat("7f", 12)
		if err := os.WriteFile(filepath.Join(secrets, "kafka_"+u), []byte(passwords[u]+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	cmd := exec.Command("/bin/sh", filepath.Join(node, "start.sh")) // #nosec G204 -- the compose stack's script
	cmd.Env = []string{"PATH=" + bin + ":" + os.Getenv("PATH"), "CLUSTER_ID=" + env["CLUSTER_ID"], "SCRAM_USERS=" + env["SCRAM_USERS"],
		"KAFKA_HOME=" + home, "SECRETS_DIR=" + secrets}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s: %v\n%s", start, err, out)
	}
	b, err := os.ReadFile(calls)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	if len(lines) != 2 || !strings.HasPrefix(lines[0], "java\t") || lines[1] != "kafka-server-start.sh\t"+filepath.Join(node, "server.properties") {
		t.Fatalf("%s ran\n%s\nwant java, then kafka-server-start.sh on its configuration", start, b)
	}
	for u, pw := range passwords {
		if strings.Contains(string(b), pw) {
			t.Errorf("%s put %s's password on a command line:\n%s", start, u, b)
		}
	}
	for _, a := range strings.Split(lines[0], "\t") {
		if f, ok := strings.CutPrefix(a, "@"); ok {
			if _, err := os.Stat(f); err == nil {
				t.Errorf("the argument file %s, with the passwords, is left behind", f)
			}
		}
	}
	meta, err := os.ReadFile(filepath.Join(data, "meta.properties"))
	if err != nil || !strings.Contains(string(meta), "cluster.id="+env["CLUSTER_ID"]) {
		t.Errorf("the formatted storage's meta.properties: %v\n%s", err, meta)
	}
	scramUsersMatch(t, string(out), passwords)
}

// scramUsersMatch checks the SCRAM-SHA-512 credentials the storage tool
// printed (its bootstrap metadata) against the passwords: each user's
// stored key is H(HMAC(PBKDF2(password, salt, iterations), "Client Key")).
func scramUsersMatch(t *testing.T, out string, passwords map[string]string) {
	t.Helper()
	re := regexp.MustCompile(`UserScramCredentialRecord\(name='([^']+)', mechanism=2, salt=\[([^\]]*)\], storedKey=\[([^\]]*)\], serverKey=\[[^\]]*\], iterations=(\d+)\)`)
	bytesOf := func(list string) []byte {
		var b []byte
		for _, f := range strings.Split(list, ", ") {
			n, err := strconv.Atoi(f)
			if err != nil {
				t.Fatalf("%q in %q: %v", f, list, err)
			}
			b = append(b, byte(int8(n)))
		}
		return b
	}
	seen := map[string]bool{}
	for _, m := range re.FindAllStringSubmatch(out, -1) {
		user, salt, stored := m[1], bytesOf(m[2]), bytesOf(m[3])
		iterations, _ := strconv.Atoi(m[4])
		salted, err := pbkdf2.Key(sha512.New, passwords[user], salt, iterations, sha512.Size)
		if err != nil {
			t.Fatal(err)
		}
		mac := hmac.New(sha512.New, salted)
		mac.Write([]byte("Client Key"))
		if want := sha512.Sum512(mac.Sum(nil)); !bytes.Equal(stored, want[:]) {
			t.Errorf("SCRAM user %s: the stored key is not its password's", user)
		}
		seen[user] = true
	}
	for u := range passwords {
		if !seen[u] {
			t.Errorf("SCRAM user %s was not created:\n%s", u, out)
		}
	}
}

// The stack runs the release line of Apache Kafka the local cluster runs
// (test/kafkacluster/pom.xml), the ACLs' init service the same image.
func TestComposeKafkaIsTheLocalClustersRelease(t *testing.T) {
	s := loadStack(t)
	image := regexp.MustCompile(`^apache/kafka:(\d+)\.(\d+)\.(\d+)@sha256:[0-9a-f]{64}$`)
	local := strings.Split(kafkacluster.Version, ".")
	for _, name := range []string{"kafka", "kafka-acls"} {
		svc, ok := s.Services[name]
		if !ok {
			t.Errorf("docker-compose.yml has no service %s", name)
			continue
		}
		m := image.FindStringSubmatch(svc.Image)
		if m == nil || m[1] != local[0] || m[2] != local[1] {
			t.Errorf("%s: image %s, want apache/kafka:%s.%s.x pinned by digest, the release line of the local cluster (Apache Kafka %s)",
				name, svc.Image, local[0], local[1], kafkacluster.Version)
		}
	}
}

// testOnlySettings are the local cluster's settings for its tests that a
// production-like cluster does not have
// (docs/decisions/0053-apache-kafka-local-cluster.md).
var testOnlySettings = []string{"group.initial.rebalance.delay.ms", "group.min.session.timeout.ms", "offsets.topic.num.partitions",
	"transaction.state.log.num.partitions", "num.network.threads", "num.io.threads", "background.threads", "num.recovery.threads.per.data.dir"}

// The broker serves clients only over SASL_SSL with SCRAM-SHA-512, its
// controller listener over mutual TLS, with StandardAuthorizer and no
// allow.everyone.if.no.acl.found; its super users are the broker (its
// SCRAM user and its certificate) and the admin; it creates no topic
// itself and has none of the local cluster's test-only settings.
func TestComposeKafkaIsSecuredAsTheLocalCluster(t *testing.T) {
	s := loadStack(t)
	props := brokerConfig(t, s)
	protocols := map[string]string{}
	for _, l := range strings.Split(props["listener.security.protocol.map"], ",") {
		name, proto, _ := strings.Cut(l, ":")
		protocols[name] = proto
	}
	controller := props["controller.listener.names"]
	if protocols[controller] != "SSL" || props["listener.name."+strings.ToLower(controller)+".ssl.client.auth"] != "required" {
		t.Errorf("kafka: controller listener %q is %q with client auth %q, want SSL with client certificates required (only the node speaks to the quorum)",
			controller, protocols[controller], props["listener.name."+strings.ToLower(controller)+".ssl.client.auth"])
	}
	for _, key := range []string{"listeners", "advertised.listeners"} {
		for _, l := range strings.Split(props[key], ",") {
			name, _, _ := strings.Cut(l, "://")
			if name != controller && protocols[name] != "SASL_SSL" {
				t.Errorf("kafka: %s has %s, on %q; clients must authenticate over TLS (SASL_SSL)", key, l, protocols[name])
			}
		}
	}
	if props["listeners"] == "" || props["advertised.listeners"] == "" || protocols[props["inter.broker.listener.name"]] != "SASL_SSL" {
		t.Errorf("kafka: want listeners, advertised.listeners and an inter-broker listener on SASL_SSL: %v", props)
	}
	for _, key := range []string{"sasl.enabled.mechanisms", "sasl.mechanism.inter.broker.protocol"} {
		if props[key] != kafkacluster.SCRAMMechanism {
			t.Errorf("kafka: %s=%q, want %s", key, props[key], kafkacluster.SCRAMMechanism)
		}
	}
	if got := props["authorizer.class.name"]; got != "org.apache.kafka.metadata.authorizer.StandardAuthorizer" {
		t.Errorf("kafka: authorizer.class.name=%q, want KRaft's StandardAuthorizer", got)
	}
	if v, ok := props["allow.everyone.if.no.acl.found"]; ok && v != "false" {
		t.Errorf("kafka: allow.everyone.if.no.acl.found=%s lets a principal without ACLs do anything", v)
	}
	supers := strings.Split(props["super.users"], ";")
	sort.Strings(supers)
	if want := []string{"User:" + kafkacluster.AdminUser, "User:broker", "User:kafka-node"}; !slices.Equal(supers, want) {
		t.Errorf("kafka: super.users %v, want %v: the admin, and the broker as its SCRAM user and its certificate", supers, want)
	}
	if props["ssl.keystore.type"] != "PEM" || s.secretFile(s.Services["kafka"], props["ssl.keystore.location"]) == "" ||
		s.secretFile(s.Services["kafka"], props["ssl.truststore.location"]) == "" {
		t.Errorf("kafka: want the node's PEM key store and the CA as mounted secrets: %s, %s",
			props["ssl.keystore.location"], props["ssl.truststore.location"])
	}
	if props["auto.create.topics.enable"] != "false" {
		t.Error("kafka: want auto.create.topics.enable=false: the operator creates onceflow's topics")
	}
	kenv := s.Services["kafka"].Environment
	for _, key := range testOnlySettings {
		env := "KAFKA_" + strings.ToUpper(strings.ReplaceAll(key, ".", "_"))
		if _, ok := props[key]; ok {
			t.Errorf("kafka: %s is a setting of the local cluster's tests (docs/decisions/0053-apache-kafka-local-cluster.md), not of a production-like broker", key)
		}
		if _, ok := kenv[env]; ok {
			t.Errorf("kafka: %s (%s) is a setting of the local cluster's tests (docs/decisions/0053-apache-kafka-local-cluster.md), not of a production-like broker", env, key)
		}
	}
}

// scramUsers returns the users the kafka service creates with its
// storage, each checked to have its password mounted.
func scramUsers(t *testing.T, s stack) []string {
	t.Helper()
	k := s.service(t, "kafka")
	users := strings.Fields(k.Environment["SCRAM_USERS"])
	for _, must := range []string{kafkacluster.AdminUser, "broker"} {
		if !slices.Contains(users, must) {
			t.Errorf("kafka: SCRAM_USERS %v lacks %s", users, must)
		}
	}
	for _, u := range users {
		if s.secretFile(k, "/run/secrets/kafka_"+u) == "" {
			t.Errorf("kafka: SCRAM user %s has no password: mount the secret kafka_%s", u, u)
		}
	}
	return users
}

// kafkaRoles are the services of the stack that use Kafka, by the role
// whose ACLs their principal must have: the variable of
// scripts/kafka-acls.sh that names it, "" for ingest, which has none.
var kafkaRoles = map[string]string{
	"migrate": "OPERATOR", "ingest": "", "relay": "RELAY", "processor": "PROCESSOR", "projector": "PROJECTOR", "lag": "LAG",
}

// Every service on Kafka authenticates as a SCRAM user of its own, over
// TLS trusting the stack's CA, with the password from a secret only it
// mounts, and starts after the ACLs are granted; its user is the
// principal scripts/kafka-acls.sh grants its role's ACLs to. The worker
// has no Kafka user.
func TestComposeComponentsAreTheirOwnPrincipals(t *testing.T) {
	s := loadStack(t)
	users := scramUsers(t, s)
	script, err := os.ReadFile("../scripts/kafka-acls.sh")
	if err != nil {
		t.Fatal(err)
	}
	defaults := map[string]string{}
	for _, m := range regexp.MustCompile(`(?m)^([A-Z]+)=\$\{[A-Z]+:-(User:[a-z-]+)\}$`).FindAllStringSubmatch(string(script), -1) {
		defaults[m[1]] = m[2]
	}
	acls := s.service(t, "kafka-acls").Environment
	seen := map[string]string{}
	for name, role := range kafkaRoles {
		svc, ok := s.Services[name]
		if !ok {
			t.Errorf("docker-compose.yml has no service %s", name)
			continue
		}
		env := svc.Environment
		user := env["KAFKA_SASL_USER"]
		if env["KAFKA_SASL_MECHANISM"] != kafkacluster.SCRAMMechanism || env["KAFKA_TLS"] != "true" || env["KAFKA_ALLOW_PLAINTEXT_SASL"] != "" ||
			s.secretFile(svc, env["KAFKA_TLS_CA_FILE"]) != s.Secrets["ca_crt"].File {
			t.Errorf("%s: want SCRAM-SHA-512 over TLS trusting the stack's CA (KAFKA_TLS_CA_FILE=/run/secrets/ca_crt), no plaintext SASL: %v", name, env)
		}
		if !slices.Contains(users, user) || user == kafkacluster.AdminUser || user == "broker" || user == registryUser {
			t.Errorf("%s: KAFKA_SASL_USER %q, want a SCRAM user of its own (kafka's SCRAM_USERS %v, not a super user's or the registry's)", name, user, users)
		}
		if other, dup := seen[user]; dup {
			t.Errorf("%s and %s share the Kafka user %q: a principal per component", name, other, user)
		}
		seen[user] = name
		if pw := env["KAFKA_SASL_PASSWORD_FILE"]; pw != "/run/secrets/kafka_"+user || s.secretFile(svc, pw) == "" {
			t.Errorf("%s: KAFKA_SASL_PASSWORD_FILE %q, want the mounted secret /run/secrets/kafka_%s", name, pw, user)
		}
		for _, sec := range svc.Secrets {
			if strings.HasPrefix(sec, "kafka_") && sec != "kafka_"+user {
				t.Errorf("%s mounts %s, another Kafka user's password", name, sec)
			}
		}
		if c := svc.dependsOn("kafka-acls"); c != "service_completed_successfully" {
			t.Errorf("%s: depends on kafka-acls with %q, want service_completed_successfully: it starts once its ACLs are there", name, c)
		}
		if role == "" {
			continue
		}
		want := defaults[role]
		if v := acls[role]; v != "" {
			want = v
		}
		if want != "User:"+user {
			t.Errorf("%s authenticates as User:%s; scripts/kafka-acls.sh grants the %s ACLs to %q", name, user, strings.ToLower(role), want)
		}
	}
	for k := range s.service(t, "worker").Environment {
		if strings.HasPrefix(k, "KAFKA_") {
			t.Errorf("worker: sets %s; the worker runs jobs from Postgres and has no Kafka user", k)
		}
	}
	if c := s.service(t, "schema-registry").dependsOn("kafka-acls"); c != "service_completed_successfully" {
		t.Errorf("schema-registry: depends on kafka-acls with %q, want service_completed_successfully", c)
	}
}

// acl is one ACL kafka-acls.sh was asked to add.
type acl struct {
	principal, op, resource, name string
	prefixed                      bool
}

func (a acl) allows(principal, op, resource, name string) bool {
	if a.principal != principal || a.op != op || a.resource != resource {
		return false
	}
	return a.name == name || a.prefixed && strings.HasPrefix(name, a.name)
}

// grantedACLs runs the kafka-acls service's command as the container
// would, its scripts from the files the service mounts and its
// environment, with a kafka-acls.sh that records what it is asked to add
// instead of Apache Kafka's, and returns the ACLs.
func grantedACLs(t *testing.T, s stack) []acl {
	t.Helper()
	svc := s.service(t, "kafka-acls")
	if len(svc.Entrypoint) != 2 || svc.Entrypoint[1] != "-c" || len(svc.Command) != 1 {
		t.Fatalf("kafka-acls: entrypoint %v, command %v: want a shell command (/bin/sh -c)", svc.Entrypoint, svc.Command)
	}
	command := svc.Command[0]
	if svc.mounted("/onceflow/kafka-acls.sh") != "../scripts/kafka-acls.sh" || !strings.Contains(command, "/onceflow/kafka-acls.sh") {
		t.Fatalf("kafka-acls: want scripts/kafka-acls.sh mounted at /onceflow/kafka-acls.sh and run: %v %q", svc.Volumes, command)
	}
	for _, v := range svc.Volumes {
		host, in, _ := strings.Cut(strings.TrimSuffix(v, ":ro"), ":")
		abs, err := filepath.Abs(host)
		if err != nil {
			t.Fatal(err)
		}
		command = strings.ReplaceAll(command, in, abs)
	}
	if got := svc.Environment["KAFKA_ACLS"]; got != "/opt/kafka/bin/kafka-acls.sh" {
		t.Errorf("kafka-acls: KAFKA_ACLS=%q, want Apache Kafka's tool in its image, /opt/kafka/bin/kafka-acls.sh", got)
	}
	if file := s.secretFile(svc, svc.Environment["COMMAND_CONFIG"]); file != s.Secrets["kafka_admin_properties"].File {
		t.Errorf("kafka-acls: COMMAND_CONFIG %q, want the admin's client settings (the secret kafka_admin_properties)", svc.Environment["COMMAND_CONFIG"])
	}
	if c := svc.dependsOn("kafka"); c != "service_healthy" {
		t.Errorf("kafka-acls: depends on kafka with %q, want service_healthy", c)
	}

	dir := t.TempDir()
	log, tool := filepath.Join(dir, "acls.log"), filepath.Join(dir, "kafka-acls.sh")
	if err := os.WriteFile(tool, []byte("#!/bin/sh\nfor a; do printf '%s\\t' \"$a\"; done >> \""+log+"\"\necho >> \""+log+"\"\n"), 0o755); err != nil { // #nosec G306 -- an executable script
		t.Fatal(err)
	}
	cmd := exec.Command("/bin/sh", "-c", command) // #nosec G204 -- the compose file's command
	cmd.Env = []string{"PATH=" + os.Getenv("PATH")}
	for k, v := range svc.Environment {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	cmd.Env = append(cmd.Env, "KAFKA_ACLS="+tool)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("kafka-acls: %q: %v\n%s", command, err, out)
	}
	b, err := os.ReadFile(log)
	if err != nil {
		t.Fatal(err)
	}
	var out []acl
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		args := strings.Split(strings.TrimSuffix(line, "\t"), "\t")
		var principals, ops []string
		var resources [][2]string
		prefixed := false
		for i := 0; i+1 < len(args); i++ {
			switch v := args[i+1]; args[i] {
			case "--bootstrap-server":
				if v != svc.Environment["BOOTSTRAP"] || v != "kafka:9092" {
					t.Errorf("kafka-acls: --bootstrap-server %s, want kafka:9092", v)
				}
			case "--allow-principal":
				principals = append(principals, v)
			case "--operation":
				ops = append(ops, v)
			case "--resource-pattern-type":
				prefixed = v == "prefixed"
			case "--topic", "--group", "--transactional-id":
				resources = append(resources, [2]string{strings.TrimPrefix(args[i], "--"), v})
			}
		}
		for _, p := range principals {
			for _, op := range ops {
				for _, r := range resources {
					out = append(out, acl{principal: p, op: op, resource: r[0], name: r[1], prefixed: prefixed})
				}
			}
		}
	}
	if len(out) == 0 {
		t.Fatalf("kafka-acls: %q granted no ACL", command)
	}
	return out
}

// need is an operation a principal needs on a resource.
type need struct{ op, resource, name string }

// roleNeeds are what each service on Kafka does there: what the
// components check at start (onceflow's checkAccess: kafka.CheckAccess on
// the needs of docs/security.md#kafka-acls) and what the operator's
// commands and the lag exporter do, for the ledger deployed with the
// topic prefix of the stack.
func roleNeeds(t *testing.T, prefix string) map[string][]need {
	t.Helper()
	dep, err := onceflow.Config{Domains: []*onceflow.Domain{ledgerapp.Domain()}, Topics: kafka.Topics{Prefix: prefix}}.Deployment()
	if err != nil {
		t.Fatal(err)
	}
	topics := dep.Aggregates()[0].Topics
	group := ledgerapp.AccountType().Group
	consumer := dep.Domains[0].ProjectorConsumer()
	all := []string{topics.Commands(), topics.Events(), topics.State(), topics.Dedup(), topics.DLQ()}
	described := func(ops ...string) []need {
		var out []need
		for _, tp := range all {
			for _, op := range ops {
				out = append(out, need{op, "topic", tp})
			}
		}
		return out
	}
	return map[string][]need{
		// The relay's transactional ids are onceflow-relay-{prefix}-{shard}
		// (stack.go; TestPipelineOverSASLSSL shows them on Apache Kafka).
		"relay": append(described("Describe", "DescribeConfigs"), need{"Write", "topic", topics.Commands()},
			need{"Write", "transactional-id", "onceflow-relay-" + prefix + "-0"}),
		"processor": append(described("Describe", "DescribeConfigs"), need{"Read", "group", group},
			need{"Read", "topic", topics.Commands()}, need{"Read", "topic", topics.State()}, need{"Read", "topic", topics.Dedup()},
			need{"Write", "topic", topics.Events()}, need{"Write", "topic", topics.State()}, need{"Write", "topic", topics.Dedup()},
			need{"Write", "topic", topics.DLQ()}, need{"Write", "topic", topics.Commands()},
			need{"Write", "transactional-id", group + "-processor-1"}),
		"projector": append(described("Describe", "DescribeConfigs"), need{"Read", "topic", topics.Events()}, need{"Read", "group", consumer}),
		// migrate runs `onceflow topics create`.
		"migrate": described("Create", "Describe", "DescribeConfigs"),
		"lag": append(described("Describe"), need{"Describe", "group", group}, need{"Describe", "group", consumer},
			need{"Read", "topic", topics.Commands()}, need{"Read", "topic", topics.Events()}),
	}
}

// The ACLs' init service grants, with scripts/kafka-acls.sh run as the
// container runs it, every service's principal what the service does on
// Kafka, for the topic prefix and groups the components use; ingest's
// user nothing, and the schema registry's its store's topic and groups.
func TestComposeGrantsEachComponentItsACLs(t *testing.T) {
	s := loadStack(t)
	granted := grantedACLs(t, s)
	prefix := s.service(t, "relay").Environment["ONCEFLOW_TOPIC_PREFIX"]
	for name := range kafkaRoles {
		if p := s.Services[name].Environment["ONCEFLOW_TOPIC_PREFIX"]; p != prefix || p == "" {
			t.Errorf("%s: ONCEFLOW_TOPIC_PREFIX %q, want the relay's %q: one deployment", name, p, prefix)
		}
	}
	if p := s.Services["kafka-acls"].Environment["PREFIX"]; p != prefix {
		t.Errorf("kafka-acls: PREFIX %q, want the components' ONCEFLOW_TOPIC_PREFIX %q", p, prefix)
	}
	needs := roleNeeds(t, prefix)
	needs["schema-registry"] = []need{{"Create", "topic", "_schemas"}, {"Describe", "topic", "_schemas"}, {"DescribeConfigs", "topic", "_schemas"},
		{"Read", "topic", "_schemas"}, {"Write", "topic", "_schemas"}, {"Read", "group", "schema-registry"}, {"Read", "group", "schema-registry-schema-registry-8081"}}
	principal := func(name string) string {
		if name == "schema-registry" {
			return "User:" + registryUser // its Kafka login (TestSecrets)
		}
		return "User:" + s.Services[name].Environment["KAFKA_SASL_USER"]
	}
	for name, ns := range needs {
		p := principal(name)
		for _, n := range ns {
			if !slices.ContainsFunc(granted, func(a acl) bool { return a.allows(p, n.op, n.resource, n.name) }) {
				t.Errorf("%s: its principal %s is not granted %s on %s %s", name, p, n.op, n.resource, n.name)
			}
		}
	}
	ingest := principal("ingest")
	for _, a := range granted {
		if a.principal == ingest || a.principal == "User:*" {
			t.Errorf("kafka-acls grants %s %s on %s %s: ingest needs no Kafka right, and no ACL is for everyone", a.principal, a.op, a.resource, a.name)
		}
	}
}

// registryUser is the schema registry's Kafka user, kafka/registry-acls.sh's
// default principal.
const registryUser = "registry"
