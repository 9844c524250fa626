package kafkacluster

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sasl/scram"
)

// Security secures a cluster (Config.Security): clients reach the brokers
// only over SASL_SSL, authenticating with SCRAM-SHA-512 over TLS whose
// certificates the cluster makes (a CA of its own, CAFile); the nodes
// replicate among themselves on that listener as the user "broker", and
// their controllers talk over mutual TLS (SSL, each node presenting the
// cluster's node certificate). With ACLs, KRaft's StandardAuthorizer
// refuses every principal what no ACL allows it.
type Security struct {
	// Users are SCRAM-SHA-512 users created when the storage is formatted
	// (Apache Kafka's own `kafka-storage format --add-scram`), each with
	// a random password (Cluster.Password). "admin" and "broker" always
	// exist: admin is what the cluster's own clients, Tool and
	// ClientOpts(AdminUser) authenticate as; broker is the nodes'.
	Users []string
	// ACLs turns the StandardAuthorizer on: a principal may only do what
	// an ACL allows it, except the super users admin, broker and the
	// controllers' certificate (User:kafka-node). Off, every
	// authenticated user may do anything.
	ACLs bool
}

// SCRAMMechanism is the SASL mechanism of a secured cluster's clients.
const SCRAMMechanism = "SCRAM-SHA-512"

// AdminUser is a secured cluster's super user: topics, ACLs, the
// cluster's own checks.
const AdminUser = "admin"

// brokerUser is the nodes' own principal between brokers.
const brokerUser = "broker"

// nodeCN is the common name of the nodes' certificate, their principal on
// the controller listener (ssl.principal.mapping.rules).
const nodeCN = "kafka-node"

// security is a secured cluster's state: its users' passwords (recorded
// in cluster.json, so Open can authenticate) and whether ACLs are on.
type security struct {
	Users map[string]string `json:"users"`
	ACLs  bool              `json:"acls"`
}

// newSecurity returns the state of a secured cluster: prev's when the
// cluster was formatted before (its users are in its storage), new
// passwords otherwise.
func newSecurity(want *Security, prev *security) (*security, error) {
	users := append([]string{AdminUser, brokerUser}, want.Users...)
	if prev != nil {
		for _, u := range users {
			if _, ok := prev.Users[u]; !ok {
				return nil, fmt.Errorf("user %s is not in the cluster's storage: users are created when it is formatted; remove the directory to make another", u)
			}
		}
		return &security{Users: prev.Users, ACLs: want.ACLs}, nil
	}
	s := &security{Users: map[string]string{}, ACLs: want.ACLs}
	for _, u := range users {
		if u == "" || strings.ContainsAny(u, ",=[]\" ") {
			return nil, fmt.Errorf("user name %q: want no spaces, commas, quotes, brackets or '='", u)
		}
		b := make([]byte, 18)
		rand.Read(b)
		s.Users[u] = base64.RawURLEncoding.EncodeToString(b)
	}
	return s, nil
}

// Secured reports whether the cluster runs with Security.
func (c *Cluster) Secured() bool { return c.sec != nil }

// CAFile is the PEM file of the CA that signed a secured cluster's
// certificate: what clients trust (KAFKA_TLS_CA_FILE).
func (c *Cluster) CAFile() string { return filepath.Join(c.cfg.Dir, "tls", "ca.pem") }

// nodeKeyStore holds the nodes' private key and certificate chain (PEM).
func (c *Cluster) nodeKeyStore() string { return filepath.Join(c.cfg.Dir, "tls", "node.pem") }

// Password returns a user's SCRAM password on a secured cluster, "" for
// a user it does not have.
func (c *Cluster) Password(user string) string {
	if c.sec == nil {
		return ""
	}
	return c.sec.Users[user]
}

// Users returns a secured cluster's users, sorted.
func (c *Cluster) Users() []string {
	if c.sec == nil {
		return nil
	}
	var out []string
	for u := range c.sec.Users {
		out = append(out, u)
	}
	slices.Sort(out)
	return out
}

// ClientOpts returns the franz-go options that authenticate as user on a
// secured cluster (SCRAM-SHA-512 over TLS trusting CAFile), none on a
// plain one. Seed brokers are not among them.
func (c *Cluster) ClientOpts(user string) []kgo.Opt {
	if c.sec == nil {
		return nil
	}
	pool := x509.NewCertPool()
	if pem, err := os.ReadFile(c.CAFile()); err == nil {
		pool.AppendCertsFromPEM(pem)
	}
	return []kgo.Opt{
		kgo.SASL(scram.Auth{User: user, Pass: c.sec.Users[user]}.AsSha512Mechanism()),
		kgo.DialTLSConfig(&tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}),
	}
}

// ToolConfig is the properties file Apache Kafka's tools read with
// --command-config to reach a secured cluster as admin; "" on a plain one.
func (c *Cluster) ToolConfig() string {
	if c.sec == nil {
		return ""
	}
	return filepath.Join(c.cfg.Dir, "admin.properties")
}

// jaas is a SCRAM login of user for Apache Kafka's JVM clients.
func (c *Cluster) jaas(user string) string {
	return fmt.Sprintf(`org.apache.kafka.common.security.scram.ScramLoginModule required username="%s" password="%s";`, user, c.sec.Users[user])
}

// securityProps are the settings of a secured node that replace the plain
// listeners (nil for a plain cluster): SASL_SSL for clients and between
// brokers, SSL with client certificates for the controllers, the PEM key
// and trust stores, and the authorizer.
func (c *Cluster) securityProps(n *Node) map[string]string {
	if c.sec == nil {
		return nil
	}
	props := map[string]string{
		"listeners":                      "SASL_SSL://" + n.Addr + ",CONTROLLER://" + n.ControllerAddr,
		"advertised.listeners":           "SASL_SSL://" + n.Addr,
		"listener.security.protocol.map": "SASL_SSL:SASL_SSL,CONTROLLER:SSL",
		"inter.broker.listener.name":     "SASL_SSL",
		"sasl.enabled.mechanisms":        SCRAMMechanism,
		// The nodes authenticate to each other as broker.
		"sasl.mechanism.inter.broker.protocol":                                            SCRAMMechanism,
		"listener.name.sasl_ssl." + strings.ToLower(SCRAMMechanism) + ".sasl.jaas.config": c.jaas(brokerUser),
		// Only a node may speak on the controller listener: mutual TLS,
		// its certificate's common name its principal.
		"listener.name.controller.ssl.client.auth": "required",
		"ssl.principal.mapping.rules":              "RULE:^CN=([^,]+)$/$1/,DEFAULT",
		"ssl.keystore.type":                        "PEM",
		"ssl.keystore.location":                    c.nodeKeyStore(),
		"ssl.truststore.type":                      "PEM",
		"ssl.truststore.location":                  c.CAFile(),
	}
	if c.sec.ACLs {
		props["authorizer.class.name"] = "org.apache.kafka.metadata.authorizer.StandardAuthorizer"
		props["super.users"] = "User:" + AdminUser + ";User:" + brokerUser + ";User:" + nodeCN
	}
	return props
}

// scramArgs are kafka-storage format's arguments that create the users.
func (c *Cluster) scramArgs() []string {
	if c.sec == nil {
		return nil
	}
	var args []string
	for _, u := range c.Users() {
		args = append(args, "--add-scram", fmt.Sprintf("%s=[name=%s,password=%s]", SCRAMMechanism, u, c.sec.Users[u]))
	}
	return args
}

// writeSecurity makes what a secured cluster's nodes and tools read: the
// CA and the nodes' key and certificate (once: a cluster started again
// keeps them, and its clients' CAFile), and the tools' admin.properties.
func (c *Cluster) writeSecurity() error {
	if c.sec == nil {
		return nil
	}
	if _, err := os.Stat(c.nodeKeyStore()); errors.Is(err, os.ErrNotExist) {
		if err := writeCertificates(filepath.Dir(c.nodeKeyStore())); err != nil {
			return fmt.Errorf("make the cluster's certificates: %w", err)
		}
	} else if err != nil {
		return err
	}
	props := strings.Join([]string{
		"security.protocol=SASL_SSL",
		"sasl.mechanism=" + SCRAMMechanism,
		"sasl.jaas.config=" + c.jaas(AdminUser),
		"ssl.truststore.type=PEM",
		"ssl.truststore.location=" + c.CAFile(),
	}, "\n") + "\n"
	return os.WriteFile(c.ToolConfig(), []byte(props), 0o600)
}

// writeCertificates writes into dir a CA (ca.pem) and a key and
// certificate it signed for every node (node.pem: the key, then the
// chain), valid for 127.0.0.1 and localhost, for servers and clients.
func writeCertificates(dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	now := time.Now()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	caTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "onceflow test CA"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.AddDate(10, 0, 0),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return err
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		return err
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: nodeCN},
		NotBefore: now.Add(-time.Hour), NotAfter: now.AddDate(10, 0, 0),
		KeyUsage:    x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}, DNSNames: []string{"localhost"},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		return err
	}
	pkcs8, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return err
	}
	caPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER})
	keyStore := append(pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: pkcs8}),
		append(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), caPEM...)...)
	if err := os.WriteFile(filepath.Join(dir, "node.pem"), keyStore, 0o600); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, "ca.pem"), caPEM, 0o644)
}

// tools are Apache Kafka's command-line tools by the names of its
// distribution's bin/ scripts.
var tools = map[string]string{
	"kafka-acls.sh":            "org.apache.kafka.tools.AclCommand",
	"kafka-configs.sh":         "kafka.admin.ConfigCommand",
	"kafka-topics.sh":          "org.apache.kafka.tools.TopicCommand",
	"kafka-consumer-groups.sh": "org.apache.kafka.tools.consumer.group.ConsumerGroupCommand",
	"kafka-transactions.sh":    "org.apache.kafka.tools.TransactionsCommand",
}

// WriteTools writes into dir Apache Kafka's tools by their distribution's
// names (kafka-acls.sh, kafka-configs.sh, kafka-topics.sh,
// kafka-consumer-groups.sh, kafka-transactions.sh), each a script running
// the tool on the cluster's jars with the arguments it is given: what a
// script written for Apache Kafka's distribution runs with dir on PATH.
func (c *Cluster) WriteTools(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	for name, class := range tools {
		// A short-lived JVM: the first compiler tier starts it faster.
		script := fmt.Sprintf("#!/bin/sh\n# Apache Kafka %s's %s (test/kafkacluster).\nexec '%s' -XX:TieredStopAtLevel=1 -Dlog4j2.level=warn -cp '%s' %s \"$@\"\n",
			Version, name, c.java, filepath.Join(c.lib, "*"), class)
		if err := os.WriteFile(filepath.Join(dir, name), []byte(script), 0o755); err != nil { // #nosec G306 -- an executable script
			return err
		}
	}
	return nil
}
