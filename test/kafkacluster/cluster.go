package kafkacluster

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// Config describes a local cluster.
type Config struct {
	// Dir holds the cluster: cluster.json (its id, nodes, ports and
	// process ids), log4j2.properties and a directory per node
	// (node-1, ...). Required. A directory that already holds a cluster
	// of the same size is started again on its storage.
	Dir string
	// Nodes is how many KRaft nodes, each a broker and a controller in
	// one JVM. Default 1. With three or more, topics and the internal
	// topics (consumer offsets, transaction state) are created with
	// replication factor 3 and min.insync.replicas 2; with fewer, with
	// every node and min.insync.replicas 1.
	Nodes int
	// BasePort numbers the listeners on 127.0.0.1: node i's broker at
	// BasePort+2(i-1), its controller one above. 0 picks free ports.
	BasePort int
	// HeapMB is each node's JVM heap. Default 512: enough for the tests'
	// topics, and three nodes leave the machine's cores and memory to
	// Postgres and the pipeline.
	HeapMB int
	// Props are broker settings added to (or replacing) every node's
	// server.properties (tests: transaction.max.timeout.ms, ...).
	Props map[string]string
	// LibDir holds Apache Kafka's jars; empty fetches them (Fetch) into
	// CacheDir.
	LibDir   string
	CacheDir string
	// Security, if set, secures the listeners: SASL_SSL with SCRAM users
	// and, optionally, ACLs (secure.go). Nil: plain listeners, no
	// authentication.
	Security *Security
	// Detach starts the nodes in a session of their own that outlives
	// this process (`make kafka-up`); otherwise they are killed when the
	// process that started them dies.
	Detach bool
	// Log receives progress lines ("formatting", "started"); nil is
	// silent.
	Log io.Writer
	// Cgroups, if set, is a directory of the cgroup v2 hierarchy: node i
	// starts (and starts again) in its cgroup Cgroups/node-i, made if
	// missing, so that every socket it opens can be told apart from other
	// processes' on loopback (iptables -m cgroup --path; test/chaos's
	// network faults, docs/chaos.md#network-faults).
	Cgroups string
}

// Cluster is a running (or stopped) local cluster.
type Cluster struct {
	cfg   Config
	java  string
	lib   string
	id    string // the KRaft cluster id
	nodes []*Node
	sec   *security  // nil for a plain cluster
	mu    sync.Mutex // serializes save
}

// state is cluster.json.
type state struct {
	Version   string      `json:"version"`
	ClusterID string      `json:"cluster_id"`
	Lib       string      `json:"lib"`
	HeapMB    int         `json:"heap_mb"`
	Nodes     []nodeState `json:"nodes"`
	Security  *security   `json:"security,omitempty"`
}

type nodeState struct {
	ID             int32  `json:"id"`
	Addr           string `json:"addr"`
	ControllerAddr string `json:"controller_addr"`
	Pid            int    `json:"pid"`
}

// Start starts a cluster as cfg describes and waits until it is ready
// (WaitReady). Its storage is formatted the first time; a directory that
// holds a stopped cluster of the same size starts it again with its
// topics. On failure it stops the nodes it started.
func Start(ctx context.Context, cfg Config) (*Cluster, error) {
	if cfg.Dir == "" {
		return nil, errors.New("kafkacluster: Config.Dir is required")
	}
	if cfg.Nodes == 0 {
		cfg.Nodes = 1
	}
	if cfg.Nodes < 1 {
		return nil, fmt.Errorf("kafkacluster: %d nodes", cfg.Nodes)
	}
	if cfg.HeapMB == 0 {
		cfg.HeapMB = 512
	}
	dir, err := filepath.Abs(cfg.Dir)
	if err != nil {
		return nil, err
	}
	cfg.Dir = dir
	java, err := exec.LookPath("java")
	if err != nil {
		return nil, fmt.Errorf("no java on PATH: Apache Kafka %s needs Java 17 or later: %w", Version, err)
	}
	lib := cfg.LibDir
	if lib == "" {
		if lib, err = Fetch(ctx, cfg.CacheDir); err != nil {
			return nil, err
		}
	}
	c := &Cluster{cfg: cfg, java: java, lib: lib}
	prev, err := readState(dir)
	switch {
	case errors.Is(err, os.ErrNotExist):
		c.id = newClusterID()
	case err != nil:
		return nil, err
	case len(prev.Nodes) != cfg.Nodes:
		return nil, fmt.Errorf("%s holds a cluster of %d nodes, not %d: stop it and remove the directory to make another", dir, len(prev.Nodes), cfg.Nodes)
	default:
		c.id = prev.ClusterID
	}
	if cfg.Security != nil {
		var had *security
		if prev != nil {
			had = prev.Security
		}
		if c.sec, err = newSecurity(cfg.Security, had); err != nil {
			return nil, err
		}
	} else if prev != nil && prev.Security != nil {
		return nil, fmt.Errorf("%s holds a secured cluster: start it with Config.Security, or remove the directory to make a plain one", dir)
	}
	ports, err := ports(cfg.BasePort, 2*cfg.Nodes)
	if err != nil {
		return nil, err
	}
	for i := range cfg.Nodes {
		n := &Node{
			ID: int32(i + 1), c: c,
			Addr:           fmt.Sprintf("127.0.0.1:%d", ports[2*i]),
			ControllerAddr: fmt.Sprintf("127.0.0.1:%d", ports[2*i+1]),
			Dir:            filepath.Join(dir, fmt.Sprintf("node-%d", i+1)),
		}
		if prev != nil && n.running(prev.Nodes[i].Pid) {
			return nil, fmt.Errorf("node %d of %s is running (pid %d): stop the cluster first", n.ID, dir, prev.Nodes[i].Pid)
		}
		c.nodes = append(c.nodes, n)
	}
	if err := c.writeConfigs(); err != nil {
		return nil, err
	}
	if err := c.writeSecurity(); err != nil {
		return nil, err
	}
	if err := c.format(ctx); err != nil {
		return nil, err
	}
	for _, n := range c.nodes {
		if err := n.start(); err != nil {
			c.Stop(10 * time.Second)
			return nil, err
		}
	}
	if err := c.save(); err != nil {
		c.Stop(10 * time.Second)
		return nil, err
	}
	c.logf("started %d node(s) of Apache Kafka %s in %s", cfg.Nodes, Version, dir)
	if err := c.WaitReady(ctx); err != nil {
		var tails strings.Builder
		for _, n := range c.nodes {
			tails.WriteString(n.Tail(20))
		}
		c.Stop(10 * time.Second)
		return nil, fmt.Errorf("%w\n%s", err, tails.String())
	}
	return c, nil
}

// Open returns the cluster whose nodes run from dir (started by another
// process, as `make kafka-up` does): Stop, Kill, Pause and the lookups
// work on it, Start of a node too. It fails when no node of it runs.
func Open(dir string) (*Cluster, error) {
	dir, err := filepath.Abs(dir)
	if err != nil {
		return nil, err
	}
	st, err := readState(dir)
	if err != nil {
		return nil, err
	}
	java, err := exec.LookPath("java")
	if err != nil {
		return nil, err
	}
	c := &Cluster{cfg: Config{Dir: dir, Nodes: len(st.Nodes), HeapMB: st.HeapMB, Detach: true}, java: java, lib: st.Lib, id: st.ClusterID, sec: st.Security}
	running := false
	for _, ns := range st.Nodes {
		n := &Node{ID: ns.ID, Addr: ns.Addr, ControllerAddr: ns.ControllerAddr, c: c,
			Dir: filepath.Join(dir, fmt.Sprintf("node-%d", ns.ID)), pid: ns.Pid}
		c.nodes = append(c.nodes, n)
		running = running || n.Running()
	}
	if !running {
		return c, errNotRunning
	}
	return c, nil
}

// IsNotRunning reports whether Open's error says the cluster exists but
// none of its nodes runs.
func IsNotRunning(err error) bool { return errors.Is(err, errNotRunning) }

func (n *Node) running(pid int) bool {
	probe := &Node{Dir: n.Dir, pid: pid}
	return probe.Running()
}

// Dir is the cluster's directory.
func (c *Cluster) Dir() string { return c.cfg.Dir }

// Tool returns the command line that runs one of Apache Kafka's tools on
// the cluster's jars: class is org.apache.kafka.tools.TopicCommand
// (kafka-topics), ...ConsumerGroupCommand's package
// org.apache.kafka.tools.consumer.group, TransactionsCommand,
// MetadataQuorumCommand.
// On a secured cluster they authenticate as admin (--command-config
// ToolConfig).
func (c *Cluster) Tool(class string) []string {
	args := []string{c.java, "-cp", filepath.Join(c.lib, "*"), class, "--bootstrap-server", c.Bootstrap()}
	if c.sec != nil {
		args = append(args, "--command-config", c.ToolConfig())
	}
	return args
}

// Nodes returns the nodes, by id.
func (c *Cluster) Nodes() []*Node { return c.nodes }

// Node returns the node of id, nil if none.
func (c *Cluster) Node(id int32) *Node {
	for _, n := range c.nodes {
		if n.ID == id {
			return n
		}
	}
	return nil
}

// Brokers returns every node's broker address.
func (c *Cluster) Brokers() []string {
	addrs := make([]string, len(c.nodes))
	for i, n := range c.nodes {
		addrs[i] = n.Addr
	}
	return addrs
}

// Bootstrap is the brokers' addresses, comma separated: KAFKA_BROKERS.
func (c *Cluster) Bootstrap() string { return strings.Join(c.Brokers(), ",") }

// Stop stops every node at once (SIGTERM, then SIGKILL for any still
// running after timeout) and returns the first error.
func (c *Cluster) Stop(timeout time.Duration) error {
	errs := make([]error, len(c.nodes))
	var wg sync.WaitGroup
	for i, n := range c.nodes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = n.Stop(timeout)
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// Kill kills every node with SIGKILL.
func (c *Cluster) Kill() {
	for _, n := range c.nodes {
		n.Kill()
	}
}

// client returns a client seeded with every node (as admin on a secured
// cluster).
func (c *Cluster) client(opts ...kgo.Opt) (*kgo.Client, error) {
	return kgo.NewClient(append(append([]kgo.Opt{kgo.SeedBrokers(c.Brokers()...)}, c.ClientOpts(AdminUser)...), opts...)...)
}

// WaitReady waits until the cluster really answers: the metadata lists
// every node as a broker, the KRaft quorum has a leader, and a group and
// a transaction coordinator can be found (which creates the consumer
// offsets and transaction state topics, so the first transactional
// producer does not wait for them).
func (c *Cluster) WaitReady(ctx context.Context) error {
	cl, err := c.client()
	if err != nil {
		return err
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	var last error
	for {
		if last = c.ready(ctx, cl, adm); last == nil {
			return nil
		}
		for _, n := range c.nodes {
			if !n.Running() {
				return fmt.Errorf("node %d exited before the cluster was ready", n.ID)
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("the cluster is not ready: %w (last: %v)", ctx.Err(), last)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func (c *Cluster) ready(ctx context.Context, cl *kgo.Client, adm *kadm.Client) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	md, err := kmsg.NewPtrMetadataRequest().RequestWith(ctx, cl)
	if err != nil {
		return err
	}
	if len(md.Brokers) != len(c.nodes) {
		return fmt.Errorf("the metadata lists %d of %d brokers", len(md.Brokers), len(c.nodes))
	}
	if _, err := c.quorumLeader(ctx, cl); err != nil {
		return err
	}
	for _, rs := range []kadm.FindCoordinatorResponses{
		adm.FindGroupCoordinators(ctx, "kafkacluster-ready"),
		adm.FindTxnCoordinators(ctx, "kafkacluster-ready"),
	} {
		for _, r := range rs {
			if r.Err != nil {
				return fmt.Errorf("find coordinator: %w", r.Err)
			}
		}
	}
	return nil
}

// quorumLeader asks for the KRaft quorum's leader, the active controller
// (a broker forwards DescribeQuorum to the controllers).
func (c *Cluster) quorumLeader(ctx context.Context, cl *kgo.Client) (int32, error) {
	req := kmsg.NewPtrDescribeQuorumRequest()
	t := kmsg.NewDescribeQuorumRequestTopic()
	t.Topic = "__cluster_metadata"
	p := kmsg.NewDescribeQuorumRequestTopicPartition()
	t.Partitions = append(t.Partitions, p)
	req.Topics = append(req.Topics, t)
	resp, err := req.RequestWith(ctx, cl)
	if err != nil {
		return -1, fmt.Errorf("describe quorum: %w", err)
	}
	if err := kerr.ErrorForCode(resp.ErrorCode); err != nil {
		return -1, fmt.Errorf("describe quorum: %w", err)
	}
	if len(resp.Topics) != 1 || len(resp.Topics[0].Partitions) != 1 {
		return -1, errors.New("describe quorum: no partition in the answer")
	}
	qp := resp.Topics[0].Partitions[0]
	if err := kerr.ErrorForCode(qp.ErrorCode); err != nil {
		return -1, fmt.Errorf("describe quorum: %w", err)
	}
	if qp.LeaderID < 0 {
		return -1, errors.New("the KRaft quorum has no leader")
	}
	return qp.LeaderID, nil
}

// Controller returns the node that is the active controller (the KRaft
// quorum's leader).
func (c *Cluster) Controller(ctx context.Context) (*Node, error) {
	cl, err := c.client()
	if err != nil {
		return nil, err
	}
	defer cl.Close()
	id, err := c.quorumLeader(ctx, cl)
	if err != nil {
		return nil, err
	}
	return c.nodeOf(id)
}

// Leader returns the node that leads partition of topic.
func (c *Cluster) Leader(ctx context.Context, topic string, partition int32) (*Node, error) {
	cl, err := c.client()
	if err != nil {
		return nil, err
	}
	defer cl.Close()
	md, err := kadm.NewClient(cl).Metadata(ctx, topic)
	if err != nil {
		return nil, err
	}
	t, ok := md.Topics[topic]
	if !ok || t.Err != nil {
		return nil, fmt.Errorf("topic %s: %v", topic, t.Err)
	}
	p, ok := t.Partitions[partition]
	if !ok || p.Err != nil {
		return nil, fmt.Errorf("topic %s partition %d: %v", topic, partition, p.Err)
	}
	return c.nodeOf(p.Leader)
}

// TxnCoordinator returns the node that coordinates the transactions of
// transactionalID (the leader of its __transaction_state partition).
func (c *Cluster) TxnCoordinator(ctx context.Context, transactionalID string) (*Node, error) {
	return c.coordinator(ctx, func(adm *kadm.Client) kadm.FindCoordinatorResponses {
		return adm.FindTxnCoordinators(ctx, transactionalID)
	})
}

// GroupCoordinator returns the node that coordinates group (the leader of
// its __consumer_offsets partition).
func (c *Cluster) GroupCoordinator(ctx context.Context, group string) (*Node, error) {
	return c.coordinator(ctx, func(adm *kadm.Client) kadm.FindCoordinatorResponses {
		return adm.FindGroupCoordinators(ctx, group)
	})
}

func (c *Cluster) coordinator(ctx context.Context, find func(*kadm.Client) kadm.FindCoordinatorResponses) (*Node, error) {
	cl, err := c.client()
	if err != nil {
		return nil, err
	}
	defer cl.Close()
	for _, r := range find(kadm.NewClient(cl)) {
		if r.Err != nil {
			return nil, fmt.Errorf("find coordinator of %s: %w", r.Name, r.Err)
		}
		return c.nodeOf(r.NodeID)
	}
	return nil, errors.New("find coordinator: no answer")
}

func (c *Cluster) nodeOf(id int32) (*Node, error) {
	if n := c.Node(id); n != nil {
		return n, nil
	}
	return nil, fmt.Errorf("node %d is not one of this cluster's", id)
}

// WaitInSync waits until every partition of every topic (the internal
// ones too) has a leader and all its replicas in sync: what a rolling
// restart waits for before it takes the next node down.
func (c *Cluster) WaitInSync(ctx context.Context) error {
	cl, err := c.client()
	if err != nil {
		return err
	}
	defer cl.Close()
	var last error
	for {
		if last = inSync(ctx, cl); last == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("partitions not in sync: %w (last: %v)", ctx.Err(), last)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func inSync(ctx context.Context, cl *kgo.Client) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req := kmsg.NewPtrMetadataRequest()
	req.Topics = nil // every topic
	resp, err := req.RequestWith(ctx, cl)
	if err != nil {
		return err
	}
	for _, t := range resp.Topics {
		for _, p := range t.Partitions {
			if p.Leader < 0 || len(p.ISR) < len(p.Replicas) {
				return fmt.Errorf("%s/%d: leader %d, in sync %v of %v", *t.Topic, p.Partition, p.Leader, p.ISR, p.Replicas)
			}
		}
	}
	return nil
}

// RollingRestart restarts the nodes one at a time, the active controller
// last, as an upgrade does: each is stopped gracefully (SIGTERM, SIGKILL
// after stopTimeout), started again, and every partition is back in sync
// before the next goes down.
func (c *Cluster) RollingRestart(ctx context.Context, stopTimeout time.Duration) error {
	order := append([]*Node(nil), c.nodes...)
	if ctrl, err := c.Controller(ctx); err == nil {
		sort.SliceStable(order, func(i, j int) bool { return order[j] == ctrl && order[i] != ctrl })
	}
	for _, n := range order {
		if err := n.Stop(stopTimeout); err != nil {
			return err
		}
		if err := n.Start(ctx); err != nil {
			return err
		}
		if err := c.WaitInSync(ctx); err != nil {
			return fmt.Errorf("after restarting node %d: %w", n.ID, err)
		}
		c.logf("node %d restarted", n.ID)
	}
	return nil
}

func (c *Cluster) logf(format string, args ...any) {
	if c.cfg.Log != nil {
		fmt.Fprintf(c.cfg.Log, format+"\n", args...)
	}
}
