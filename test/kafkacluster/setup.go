package kafkacluster

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
)

// replication returns the replication factor and min.insync.replicas of
// a cluster of n nodes.
func replication(n int) (rf, minISR int) {
	if n >= 3 {
		return 3, 2
	}
	return n, 1
}

// writeConfigs writes log4j2.properties and each node's server.properties.
func (c *Cluster) writeConfigs() error {
	log4j := `# Written by test/kafkacluster: each node logs to kafka.log in its directory.
status = warn
appender.file.type = RollingFile
appender.file.name = FILE
appender.file.fileName = ${sys:kafka.logs.dir}/kafka.log
appender.file.filePattern = ${sys:kafka.logs.dir}/kafka.log.%i
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = [%d] %p %m (%c)%n
appender.file.policies.type = Policies
appender.file.policies.size.type = SizeBasedTriggeringPolicy
appender.file.policies.size.size = 20MB
appender.file.strategy.type = DefaultRolloverStrategy
appender.file.strategy.max = 3
rootLogger.level = INFO
rootLogger.appenderRef.file.ref = FILE
logger.request.name = kafka.request.logger
logger.request.level = WARN
`
	if err := os.MkdirAll(c.cfg.Dir, 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(c.cfg.Dir, "log4j2.properties"), []byte(log4j), 0o644); err != nil {
		return err
	}
	rf, minISR := replication(len(c.nodes))
	var voters []string
	for _, n := range c.nodes {
		voters = append(voters, fmt.Sprintf("%d@%s", n.ID, n.ControllerAddr))
	}
	for _, n := range c.nodes {
		props := map[string]string{
			"process.roles":                                    "broker,controller",
			"node.id":                                          strconv.Itoa(int(n.ID)),
			"controller.quorum.voters":                         strings.Join(voters, ","),
			"listeners":                                        "PLAINTEXT://" + n.Addr + ",CONTROLLER://" + n.ControllerAddr,
			"advertised.listeners":                             "PLAINTEXT://" + n.Addr,
			"controller.listener.names":                        "CONTROLLER",
			"inter.broker.listener.name":                       "PLAINTEXT",
			"listener.security.protocol.map":                   "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
			"log.dirs":                                         filepath.Join(n.Dir, "data"),
			"auto.create.topics.enable":                        "false",
			"default.replication.factor":                       strconv.Itoa(rf),
			"min.insync.replicas":                              strconv.Itoa(minISR),
			"offsets.topic.replication.factor":                 strconv.Itoa(rf),
			"offsets.topic.num.partitions":                     "16",
			"transaction.state.log.replication.factor":         strconv.Itoa(rf),
			"transaction.state.log.min.isr":                    strconv.Itoa(minISR),
			"transaction.state.log.num.partitions":             "16",
			"share.coordinator.state.topic.replication.factor": strconv.Itoa(rf),
			"share.coordinator.state.topic.min.isr":            strconv.Itoa(minISR),
			// A new group's first join is not held back 3 s for more
			// members; tests start and restart consumers all the time.
			"group.initial.rebalance.delay.ms": "0",
			// Session timeouts down to 100 ms, as the embedded broker of
			// the tests allows (tests of rebalances and zombies lower them).
			"group.min.session.timeout.ms": "100",
			// Threads for a machine of two cores shared with Postgres and
			// the pipeline (defaults 3, 8, 10).
			"num.network.threads":               "2",
			"num.io.threads":                    "4",
			"background.threads":                "4",
			"num.recovery.threads.per.data.dir": "1",
			// A transaction that writes to a partition while the same
			// producer's last one is still being completed (its
			// markers written) waits for the broker to try again, 20
			// ms later by default: onceflow's producers begin the next
			// transaction as soon as the last committed
			// (docs/decisions/0057-broker-settings-before-production.md).
			"add.partitions.to.txn.retry.backoff.ms": "2",
		}
		for k, v := range c.securityProps(n) {
			props[k] = v
		}
		for k, v := range c.cfg.Props {
			props[k] = v
		}
		keys := make([]string, 0, len(props))
		for k := range props {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		var b strings.Builder
		fmt.Fprintf(&b, "# Written by test/kafkacluster for node %d of %d; rewritten at every start.\n", n.ID, len(c.nodes))
		for _, k := range keys {
			fmt.Fprintf(&b, "%s=%s\n", k, props[k])
		}
		if err := os.MkdirAll(n.Dir, 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(n.Props(), []byte(b.String()), 0o600); err != nil {
			return err
		}
	}
	return nil
}

// format formats the storage of the nodes that have none yet (KRaft's
// `kafka-storage format`), all at once.
func (c *Cluster) format(ctx context.Context) error {
	errs := make([]error, len(c.nodes))
	var wg sync.WaitGroup
	for i, n := range c.nodes {
		if _, err := os.Stat(filepath.Join(n.Dir, "data", "meta.properties")); err == nil {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			// A short-lived JVM: the first compiler tier starts it faster.
			// The main class and its arguments, the users' passwords among
			// them, go in an argument file the java launcher reads, not on
			// the command line, which ps shows to every user of the machine
			// (compose/kafka/start.sh does the same).
			tool := append([]string{"kafka.tools.StorageTool", "format", "-t", c.id, "-c", n.Props()}, c.scramArgs()...)
			argfile := filepath.Join(n.Dir, "format.args")
			if err := WriteArgFile(argfile, tool); err != nil {
				errs[i] = err
				return
			}
			defer os.Remove(argfile)
			cmd := exec.CommandContext(ctx, c.java, append(c.jvmArgs(n.Dir), "-XX:TieredStopAtLevel=1", "@"+argfile)...)
			if out, err := cmd.CombinedOutput(); err != nil {
				errs[i] = fmt.Errorf("format node %d: %w\n%s", n.ID, err, out)
			}
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// jvmArgs are a node's JVM settings, up to the main class.
func (c *Cluster) jvmArgs(nodeDir string) []string {
	return []string{
		fmt.Sprintf("-Xmx%dm", c.cfg.HeapMB), fmt.Sprintf("-Xms%dm", c.cfg.HeapMB/2),
		// Kafka's own (kafka-run-class.sh).
		"-XX:+UseG1GC", "-XX:MaxGCPauseMillis=20", "-XX:InitiatingHeapOccupancyPercent=35",
		"-XX:+ExitOnOutOfMemoryError", "-Djava.awt.headless=true",
		"-Dlog4j2.configurationFile=" + filepath.Join(c.cfg.Dir, "log4j2.properties"),
		"-Dkafka.logs.dir=" + nodeDir,
		"-cp", filepath.Join(c.lib, "*"),
	}
}

func (c *Cluster) sysProcAttr() *syscall.SysProcAttr {
	if c.cfg.Detach {
		return &syscall.SysProcAttr{Setsid: true}
	}
	// Its own process group (a test's signals reach only it), and killed
	// with the test process rather than left behind.
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}

// save writes cluster.json.
func (c *Cluster) save() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	st := state{Version: Version, ClusterID: c.id, Lib: c.lib, HeapMB: c.cfg.HeapMB, Security: c.sec}
	for _, n := range c.nodes {
		st.Nodes = append(st.Nodes, nodeState{ID: n.ID, Addr: n.Addr, ControllerAddr: n.ControllerAddr, Pid: n.Pid()})
	}
	b, err := json.MarshalIndent(st, "", "  ")
	if err != nil {
		return err
	}
	tmp := filepath.Join(c.cfg.Dir, "cluster.json.tmp")
	if err := os.WriteFile(tmp, append(b, '\n'), 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, filepath.Join(c.cfg.Dir, "cluster.json"))
}

func readState(dir string) (*state, error) {
	b, err := os.ReadFile(filepath.Join(dir, "cluster.json"))
	if err != nil {
		return nil, err
	}
	var st state
	if err := json.Unmarshal(b, &st); err != nil {
		return nil, fmt.Errorf("%s: %w", filepath.Join(dir, "cluster.json"), err)
	}
	return &st, nil
}

// newClusterID returns a KRaft cluster id: 16 random bytes, base64url
// without padding (what `kafka-storage random-uuid` prints), never one
// that begins with '-', which kafka-storage's arguments would take for an
// option ("argument --cluster-id/-t: expected one argument": one start in
// 64 failed so); Kafka's own Uuid.randomUuid draws again in that case too.
func newClusterID() string {
	b := make([]byte, 16)
	for {
		rand.Read(b)
		if id := base64.RawURLEncoding.EncodeToString(b); id[0] != '-' {
			return id
		}
	}
}

// ports returns n ports on 127.0.0.1: base, base+1, ... when base is set
// (each checked free), else free ones.
func ports(base, n int) ([]int, error) {
	out := make([]int, 0, n)
	var held []net.Listener
	defer func() {
		for _, l := range held {
			l.Close()
		}
	}()
	for i := range n {
		addr := "127.0.0.1:0"
		if base > 0 {
			addr = fmt.Sprintf("127.0.0.1:%d", base+i)
		}
		l, err := net.Listen("tcp", addr)
		if err != nil {
			return nil, fmt.Errorf("port %s is taken (set another base port, KAFKA_PORT): %w", addr, err)
		}
		held = append(held, l)
		out = append(out, l.Addr().(*net.TCPAddr).Port)
	}
	return out, nil
}

// WriteArgFile writes args to path as a java launcher's argument file
// (java @path), one quoted argument a line, readable by its owner only:
// what a command line would show to every user of the machine stays in
// the file.
func WriteArgFile(path string, args []string) error {
	var b strings.Builder
	for _, a := range args {
		b.WriteString(`"` + strings.NewReplacer(`\`, `\\`, `"`, `\"`).Replace(a) + "\"\n")
	}
	return os.WriteFile(path, []byte(b.String()), 0o600)
}
