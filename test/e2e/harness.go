// Package e2e runs onceflow as its users do, as separate processes: the
// embedded broker (`onceflow dev --broker-only`) and the ingest, relay,
// processor and projector binaries against a real Postgres. Its tests are
// black-box: they talk HTTP to ingest, read Kafka and Postgres, and stop,
// kill and pause the processes. The helpers here are also what the chaos
// harness builds on.
package e2e

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/onceflow/onceflow/pipeline/kafka"
)

// Build compiles the binaries of cmd/ into dir.
func Build(ctx context.Context, dir string) error {
	root, err := repoRoot()
	if err != nil {
		return err
	}
	cmd := exec.CommandContext(ctx, "go", "build", "-o", dir+string(os.PathSeparator), "./cmd/...")
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go build: %w\n%s", err, out)
	}
	return nil
}

func repoRoot() (string, error) {
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		return "", fmt.Errorf("cannot locate the repository")
	}
	return filepath.Abs(filepath.Join(filepath.Dir(file), "..", ".."))
}

// FreePort returns a TCP port on 127.0.0.1 that was free a moment ago.
func FreePort() int {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// Proc is one running process.
type Proc struct {
	Name    string
	Admin   string // admin base URL, "" if none
	cmd     *exec.Cmd
	logPath string
	done    chan struct{}
	err     error
}

// Start starts bin with args and env (added to a clean environment),
// writing its output to logPath.
func Start(bin string, name string, args []string, env map[string]string, logPath, admin string) (*Proc, error) {
	return StartIn("", bin, name, args, env, logPath, admin)
}

// StartIn is Start with the process started in the cgroup v2 directory
// cgroup (made if missing; "" is Start's own), so that its sockets can be
// told apart on loopback (iptables -m cgroup --path).
func StartIn(cgroup, bin string, name string, args []string, env map[string]string, logPath, admin string) (*Proc, error) {
	logFile, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, args...)
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + os.Getenv("HOME")}
	for k, v := range env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	cmd.Stdout, cmd.Stderr = logFile, logFile
	// Its own process group, so a test's signals reach only it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if cgroup != "" {
		if err := os.MkdirAll(cgroup, 0o755); err != nil {
			logFile.Close()
			return nil, fmt.Errorf("cgroup: %w", err)
		}
		fd, err := syscall.Open(cgroup, syscall.O_RDONLY|syscall.O_DIRECTORY|syscall.O_CLOEXEC, 0)
		if err != nil {
			logFile.Close()
			return nil, fmt.Errorf("cgroup %s: %w", cgroup, err)
		}
		defer syscall.Close(fd)
		cmd.SysProcAttr.UseCgroupFD, cmd.SysProcAttr.CgroupFD = true, fd
	}
	fmt.Fprintf(logFile, "=== start %s %s\n", name, strings.Join(args, " "))
	if err := cmd.Start(); err != nil {
		logFile.Close()
		return nil, err
	}
	p := &Proc{Name: name, Admin: admin, cmd: cmd, logPath: logPath, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		fmt.Fprintf(logFile, "=== exit %s: %v\n", name, p.err)
		logFile.Close()
		close(p.done)
	}()
	return p, nil
}

// Pid returns the process id.
func (p *Proc) Pid() int { return p.cmd.Process.Pid }

// Exited reports whether the process has ended.
func (p *Proc) Exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// Wait waits until the process ends and returns how it ended (nil for
// exit status 0); if ctx ends first, it returns ctx's error.
func (p *Proc) Wait(ctx context.Context) error {
	select {
	case <-p.done:
		return p.err
	case <-ctx.Done():
		return fmt.Errorf("%s still runs: %w", p.Name, ctx.Err())
	}
}

// Stop sends SIGTERM and waits up to timeout for a graceful exit, then
// kills. It returns the exit error of a graceful exit.
func (p *Proc) Stop(timeout time.Duration) error {
	if p.Exited() {
		return p.err
	}
	p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
		return p.err
	case <-time.After(timeout):
		p.Kill()
		return fmt.Errorf("%s did not stop within %s after SIGTERM", p.Name, timeout)
	}
}

// Kill sends SIGKILL (no cleanup, no flush: a crash) and waits.
func (p *Proc) Kill() {
	if p.Exited() {
		return
	}
	p.cmd.Process.Signal(syscall.SIGCONT) // a paused process dies too
	p.cmd.Process.Kill()
	<-p.done
}

// CrashBroker crashes an embedded broker (`onceflow dev`) between two of
// its requests: SIGUSR1, see devbroker.Broker.CrashAtNextRequest. It waits for
// the exit, and kills the process if it has not exited within 10s.
func (p *Proc) CrashBroker() {
	if p.Exited() {
		return
	}
	p.cmd.Process.Signal(syscall.SIGUSR1)
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
		p.Kill()
	}
}

// Pause stops the process with SIGSTOP (a zombie: alive but silent).
func (p *Proc) Pause() { p.cmd.Process.Signal(syscall.SIGSTOP) }

// Resume continues a paused process.
func (p *Proc) Resume() { p.cmd.Process.Signal(syscall.SIGCONT) }

// WaitReady waits until the process's /readyz answers 200.
func (p *Proc) WaitReady(ctx context.Context) error {
	for {
		if p.Exited() {
			return fmt.Errorf("%s exited before it was ready: %v\n%s", p.Name, p.err, p.Tail(40))
		}
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, p.Admin+"/readyz", nil)
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s not ready: %w\n%s", p.Name, ctx.Err(), p.Tail(40))
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// Tail returns the last n lines of the process's log.
func (p *Proc) Tail(n int) string {
	f, err := os.Open(p.logPath)
	if err != nil {
		return ""
	}
	defer f.Close()
	var lines []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		lines = append(lines, sc.Text())
		if len(lines) > n {
			lines = lines[1:]
		}
	}
	return strings.Join(lines, "\n")
}

// Log returns the process's whole log.
func (p *Proc) Log() string {
	b, _ := os.ReadFile(p.logPath)
	return string(b)
}

// Metric reads one sample of a metric (name with its labels as printed,
// e.g. `onceflow_command_dedup_total`, or with some of its labels) from the
// process's /metrics.
func (p *Proc) Metric(ctx context.Context, series string) (float64, error) {
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, p.Admin+"/metrics", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if v, ok := strings.CutPrefix(line, series+" "); ok {
			return strconv.ParseFloat(strings.TrimSpace(v), 64)
		}
		if v, ok := seriesValue(line, series); ok {
			return strconv.ParseFloat(v, 64)
		}
	}
	return 0, fmt.Errorf("metric %s not found", series)
}

// MetricSum adds up the series of a metric (name, without labels) whose
// labels include each of labels (`consumer="onceflow-projector"`), from the
// process's /metrics.
func (p *Proc) MetricSum(ctx context.Context, name string, labels ...string) (float64, error) {
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, p.Admin+"/metrics", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	var sum float64
	found := false
lines:
	for sc.Scan() {
		series, value, ok := strings.Cut(sc.Text(), " ")
		if !ok || (series != name && !strings.HasPrefix(series, name+"{")) {
			continue
		}
		for _, l := range labels {
			if !strings.Contains(series, l) {
				continue lines
			}
		}
		v, err := strconv.ParseFloat(strings.TrimSpace(value), 64)
		if err != nil {
			return 0, err
		}
		sum, found = sum+v, true
	}
	if !found {
		return 0, fmt.Errorf("metric %s %v not found", name, labels)
	}
	return sum, nil
}

var labelPair = regexp.MustCompile(`([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"`)

// seriesValue returns the value of an exposition line whose metric is
// series's and whose labels include all of series's (a series named by
// some of its labels: kafka_consumergroup_group_lag has member labels a
// test cannot know).
func seriesValue(line, series string) (string, bool) {
	name, labels, ok := strings.Cut(series, "{")
	if !ok || !strings.HasPrefix(line, name+"{") {
		return "", false
	}
	end := strings.LastIndexByte(line, '}')
	if end < 0 {
		return "", false
	}
	have := map[string]string{}
	for _, m := range labelPair.FindAllStringSubmatch(line[len(name)+1:end], -1) {
		have[m[1]] = m[2]
	}
	for _, m := range labelPair.FindAllStringSubmatch(labels, -1) {
		if v, ok := have[m[1]]; !ok || v != m[2] {
			return "", false
		}
	}
	return strings.TrimSpace(line[end+1:]), true
}

// Pipeline is a whole onceflow deployment of separate processes.
type Pipeline struct {
	Bin         string // directory of the built binaries
	Dir         string // logs and broker data
	DatabaseURL string
	BrokerAddr  string
	// External is set when BrokerAddr is an external cluster's
	// (ExternalKafka) rather than an embedded broker's.
	External    bool
	RegistryURL string
	Prefix      string
	// App, if set, is the binary (of cli.Main, in Bin) the deployment
	// runs: its broker is `App dev --broker-only` and each component
	// `App KIND`. Empty: the ledger's binaries, onceflow and one per
	// component.
	App string
	// BrokerEnv is added to the broker's environment (e.g.
	// ONCEFLOW_DEV_GROUP_MIN_SESSION_TIMEOUT for quick rebalances).
	BrokerEnv map[string]string
	// OperatorEnv is added to the operator commands' environment (Verify):
	// a secured cluster's operator credentials.
	OperatorEnv map[string]string
	// ClientOpts are added to the test's own clients of the cluster (a
	// secured cluster's credentials).
	ClientOpts []kgo.Opt
	// Cgroups, if set, is a directory of the cgroup v2 hierarchy: each
	// component starts in its cgroup Cgroups/INSTANCE (test/chaos's
	// network faults tell its sockets apart by it).
	Cgroups string
	// Env is added to every component's environment (e.g.
	// ONCEFLOW_TENANT_RATE_LIMIT=0 for a load test); StartComponent's
	// extra wins over it.
	Env map[string]string

	mu    sync.Mutex
	procs map[string]*Proc
}

// Brokers returns the deployment's seed brokers: BrokerAddr, which on
// a cluster of several nodes lists them comma separated.
func (pl *Pipeline) Brokers() []string { return kafka.ParseBrokers(pl.BrokerAddr) }

// ExternalKafka is KAFKA_BROKERS in the tests' environment: the Kafka
// cluster (Apache Kafka, `make kafka-up`) every deployment runs on instead
// of an embedded broker of its own, or "" for the embedded broker.
func ExternalKafka() string { return os.Getenv("KAFKA_BROKERS") }

// NewPipeline prepares a deployment; nothing runs yet. On an external
// cluster (ExternalKafka) its topics get a prefix of their own, since
// other deployments have used the cluster before it.
func NewPipeline(bin, dir, databaseURL string) *Pipeline {
	pl := &Pipeline{
		Bin: bin, Dir: dir, DatabaseURL: databaseURL,
		BrokerAddr:  fmt.Sprintf("127.0.0.1:%d", FreePort()),
		RegistryURL: fmt.Sprintf("http://127.0.0.1:%d", FreePort()),
		procs:       map[string]*Proc{},
	}
	if ext := ExternalKafka(); ext != "" {
		pl.BrokerAddr, pl.External = ext, true
	}
	pl.Prefix = pl.TopicPrefix("ledger")
	return pl
}

// TopicPrefix returns name on the embedded broker, and name with a
// suffix unique to this deployment on an external cluster.
func (pl *Pipeline) TopicPrefix(name string) string {
	if !pl.External {
		return name
	}
	return fmt.Sprintf("%s-%d-%d", name, os.Getpid(), prefixSeq.Add(1))
}

var prefixSeq atomic.Int64

// StartBroker starts `onceflow dev --broker-only` with a data directory:
// the embedded broker and the schema registry, or on an external cluster
// the registry alone (the topics are created either way).
func (pl *Pipeline) StartBroker(ctx context.Context) (*Proc, error) {
	reg := strings.TrimPrefix(pl.RegistryURL, "http://")
	env := map[string]string{"ONCEFLOW_DEV_BROKER_ADDR": pl.BrokerAddr, "ONCEFLOW_TOPIC_PREFIX": pl.Prefix}
	if pl.External {
		env = map[string]string{"KAFKA_BROKERS": pl.BrokerAddr, "ONCEFLOW_TOPIC_PREFIX": pl.Prefix}
	}
	for k, v := range pl.BrokerEnv {
		env[k] = v
	}
	p, err := Start(filepath.Join(pl.Bin, orDefault(pl.App, "onceflow")), "broker",
		[]string{"dev", "--broker-only", "--data-dir", filepath.Join(pl.Dir, "data"), "--registry-addr", reg},
		env, filepath.Join(pl.Dir, "broker.log"), "")
	if err != nil {
		return nil, err
	}
	pl.set("broker", p)
	// The broker has no admin server: wait until the registry answers,
	// which happens after the topics exist.
	for {
		resp, err := http.Get(pl.RegistryURL + "/subjects")
		if err == nil {
			resp.Body.Close()
			return p, nil
		}
		if p.Exited() {
			return nil, fmt.Errorf("broker exited: %s", p.Tail(40))
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("broker not ready: %w\n%s", ctx.Err(), p.Tail(40))
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// Component is one running component with its addresses.
type Component struct {
	*Proc
	HTTP string // ingest base URL
}

// StartComponent starts one component binary (ingest, relay, processor,
// projector) named instance, with extra environment, and waits until it
// is ready.
func (pl *Pipeline) StartComponent(ctx context.Context, kind, instance string, extra map[string]string) (*Component, error) {
	c, err := pl.LaunchComponent(kind, instance, extra)
	if err != nil {
		return nil, err
	}
	if err := c.WaitReady(ctx); err != nil {
		return nil, err
	}
	return c, nil
}

// LaunchComponent is StartComponent without the wait: for a component
// that is not expected to become ready.
func (pl *Pipeline) LaunchComponent(kind, instance string, extra map[string]string) (*Component, error) {
	admin := fmt.Sprintf("127.0.0.1:%d", FreePort())
	env := map[string]string{
		"KAFKA_BROKERS":         pl.BrokerAddr,
		"DATABASE_URL":          pl.DatabaseURL,
		"SCHEMA_REGISTRY_URL":   pl.RegistryURL,
		"ONCEFLOW_TOPIC_PREFIX": pl.Prefix,
		"ADMIN_ADDR":            admin,
		"ONCEFLOW_INSTANCE_ID":  instance,
		"LOG_LEVEL":             "info",
	}
	c := &Component{}
	if kind == "ingest" {
		httpAddr := fmt.Sprintf("127.0.0.1:%d", FreePort())
		env["HTTP_ADDR"] = httpAddr
		c.HTTP = "http://" + httpAddr
	}
	for _, more := range []map[string]string{pl.Env, extra} {
		for k, v := range more {
			env[k] = v
		}
	}
	bin, args := kind, []string(nil)
	if pl.App != "" {
		bin, args = pl.App, []string{kind}
	}
	cgroup := ""
	if pl.Cgroups != "" {
		cgroup = filepath.Join(pl.Cgroups, instance)
	}
	p, err := StartIn(cgroup, filepath.Join(pl.Bin, bin), instance, args, env, filepath.Join(pl.Dir, instance+".log"), "http://"+admin)
	if err != nil {
		return nil, err
	}
	c.Proc = p
	pl.set(instance, p)
	return c, nil
}

func (pl *Pipeline) set(name string, p *Proc) {
	pl.mu.Lock()
	defer pl.mu.Unlock()
	pl.procs[name] = p
}

// StopAll stops every process still running, gracefully (SIGTERM), all
// at once: on a shared cluster, a component that leaves its consumer group
// does not hold up the next deployment's join for a session timeout.
func (pl *Pipeline) StopAll(timeout time.Duration) {
	pl.mu.Lock()
	defer pl.mu.Unlock()
	var wg sync.WaitGroup
	for _, p := range pl.procs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			p.Stop(timeout)
		}()
	}
	wg.Wait()
}

// DeleteTopics deletes the deployment's topics (those under its prefix)
// from an external cluster, so that the cluster does not fill up with the
// topics of finished tests.
func (pl *Pipeline) DeleteTopics(ctx context.Context) error {
	if !pl.External || pl.Prefix == "" {
		return nil
	}
	cl, err := kafka.Config{Brokers: kafka.ParseBrokers(pl.BrokerAddr)}.NewClient(pl.ClientOpts...)
	if err != nil {
		return err
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	topics, err := adm.ListTopics(ctx)
	if err != nil {
		return err
	}
	var mine []string
	for _, name := range topics.Names() {
		if strings.HasPrefix(name, pl.Prefix+".") {
			mine = append(mine, name)
		}
	}
	if len(mine) == 0 {
		return nil
	}
	_, err = adm.DeleteTopics(ctx, mine...)
	return err
}

// KillAll kills every process still running (test cleanup).
func (pl *Pipeline) KillAll() {
	pl.mu.Lock()
	defer pl.mu.Unlock()
	for _, p := range pl.procs {
		p.Kill()
	}
}

// Logs returns the tails of every process's log, for a failing test.
func (pl *Pipeline) Logs(n int) string {
	pl.mu.Lock()
	defer pl.mu.Unlock()
	var b strings.Builder
	for name, p := range pl.procs {
		fmt.Fprintf(&b, "----- %s -----\n%s\n", name, p.Tail(n))
	}
	return b.String()
}

func orDefault(s, def string) string {
	if s == "" {
		return def
	}
	return s
}
