package chaos

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// netem makes the run's network faults real at the TCP level on loopback
// (docs/chaos.md#network-faults): every Kafka node and every component
// starts in a cgroup of its own under the run's cgroup directory, and a
// fault is a few iptables rules in the run's own chain, each matching the
// sockets of one cgroup (-m cgroup --path) or the listener ports of one
// node, never anything else on the machine; a slow link is a narrow queue
// on lo that only the packets those rules mark go through (slowLink). The chain, the
// marks' chain and the qdisc are removed when the run ends, and a run
// removes what a crashed run (its process gone) left behind before it
// starts.
type netem struct {
	root  string // the cgroup v2 hierarchy's mount point
	rel   string // the run's cgroup directory, relative to root
	chain string // the run's chain, in the filter and the mangle tables

	mu    sync.Mutex
	rules []rule // installed, to remove at heal
	qdisc bool   // the slow link's qdisc is on lo
}

// rule is one iptables rule of the run's chain in table.
type rule struct {
	table string
	spec  []string
}

const (
	chainPrefix = "ONCEFLOW-CHAOS-"
	cgroupDir   = "onceflow-chaos-"
	// slowHandle is the major handle of the HTB qdisc on lo whose class
	// slowHandle+"1" is slowLink.
	slowHandle = "a39:"
)

// newNetem sets up the run's chains and cgroup directory, after removing
// what a crashed run left. It needs root, iptables with the cgroup match
// and a cgroup v2 hierarchy.
func newNetem() (*netem, error) {
	root, err := cgroup2Root()
	if err != nil {
		return nil, err
	}
	pid := strconv.Itoa(os.Getpid())
	nm := &netem{root: root, rel: cgroupDir + pid, chain: chainPrefix + pid}
	nm.removeStale()
	for _, table := range []string{"filter", "mangle"} {
		if err := iptables(table, "-N", nm.chain); err != nil {
			return nil, fmt.Errorf("network faults need root and iptables: %w", err)
		}
		if err := iptables(table, "-I", "OUTPUT", "-j", nm.chain); err != nil {
			nm.close()
			return nil, err
		}
	}
	if err := os.MkdirAll(filepath.Join(root, nm.rel), 0o755); err != nil {
		nm.close()
		return nil, fmt.Errorf("network faults need a cgroup v2 hierarchy: %w", err)
	}
	return nm, nil
}

// cgroups is the absolute directory of the cgroups of the run's part
// ("kafka", "components").
func (nm *netem) cgroups(part string) string { return filepath.Join(nm.root, nm.rel, part) }

// path is the --path of the cgroup match of a cgroup made under
// cgroups(part): relative to the hierarchy's root.
func (nm *netem) path(part, name string) string { return filepath.Join(nm.rel, part, name) }

// cut installs rules until heal; each is logged by its caller.
func (nm *netem) cut(rules ...rule) error {
	nm.mu.Lock()
	defer nm.mu.Unlock()
	for _, r := range rules {
		if err := iptables(r.table, append([]string{"-A", nm.chain}, r.spec...)...); err != nil {
			return err
		}
		nm.rules = append(nm.rules, r)
	}
	return nil
}

// slowLink is what a slow link's packets go through: an HTB class of 8
// Mbit/s with a queue of 50 packets, so they wait in the queue (loopback's
// segments are up to 64 KiB: one takes 65 ms at that rate, a full queue
// seconds) and the ones that find it full are lost. This kernel has no
// netem (sch_netem), nor prio, so a fixed delay with jitter cannot be
// made; HTB and pfifo are there (docs/chaos.md#slow-link).
const slowLink = "an HTB class of 8 Mbit/s and a pfifo of 50 packets on lo"

// slow sends the packets the CLASSIFY rules of the mangle table classify
// through slowLink (HTB takes a packet whose priority names one of its
// classes into it; this kernel has no fw classifier); every other packet
// on lo passes HTB's direct queue untouched (no default class).
func (nm *netem) slow(rules ...rule) error {
	nm.mu.Lock()
	cmds := [][]string{
		{"qdisc", "add", "dev", "lo", "root", "handle", slowHandle, "htb"},
		{"class", "add", "dev", "lo", "parent", slowHandle, "classid", slowHandle + "1", "htb", "rate", "8mbit", "ceil", "8mbit"},
		{"qdisc", "add", "dev", "lo", "parent", slowHandle + "1", "handle", "a3a:", "pfifo", "limit", "50"},
	}
	for _, args := range cmds {
		nm.qdisc = true
		if out, err := exec.Command("tc", args...).CombinedOutput(); err != nil {
			nm.mu.Unlock()
			nm.heal()
			return fmt.Errorf("tc %s: %v: %s", strings.Join(args, " "), err, out)
		}
	}
	nm.mu.Unlock()
	return nm.cut(rules...)
}

// heal removes every rule and the qdisc.
func (nm *netem) heal() {
	nm.mu.Lock()
	defer nm.mu.Unlock()
	for _, table := range []string{"filter", "mangle"} {
		iptables(table, "-F", nm.chain)
	}
	nm.rules = nil
	if nm.qdisc {
		exec.Command("tc", "qdisc", "del", "dev", "lo", "root", "handle", slowHandle).Run()
		nm.qdisc = false
	}
}

// close heals and removes the chains and the run's cgroups (each empty by
// then: the processes in them have ended).
func (nm *netem) close() {
	nm.heal()
	removeChain(nm.chain)
	removeCgroups(filepath.Join(nm.root, nm.rel))
}

// removeStale removes the chains, cgroups and qdisc of runs whose process
// is gone.
func (nm *netem) removeStale() {
	out, _ := exec.Command("iptables", "-w", "-S").Output()
	for _, line := range strings.Split(string(out), "\n") {
		if name, ok := strings.CutPrefix(line, "-N "+chainPrefix); ok && !alive(name) {
			removeChain(chainPrefix + name)
		}
	}
	dirs, _ := os.ReadDir(nm.root)
	for _, d := range dirs {
		if pid, ok := strings.CutPrefix(d.Name(), cgroupDir); ok && d.IsDir() && !alive(pid) {
			removeCgroups(filepath.Join(nm.root, d.Name()))
		}
	}
	// The qdisc is the only one on lo and carries no pid: a run removes it
	// at heal; one left is a crashed run's, unless another run is slowing
	// a link right now, which the chain of a live run says.
	live := false
	for _, line := range strings.Split(string(out), "\n") {
		if name, ok := strings.CutPrefix(line, "-N "+chainPrefix); ok && alive(name) && chainPrefix+name != nm.chain {
			live = true
		}
	}
	if !live {
		exec.Command("tc", "qdisc", "del", "dev", "lo", "root", "handle", slowHandle).Run()
	}
}

func alive(pid string) bool {
	n, err := strconv.Atoi(pid)
	if err != nil || n <= 0 {
		return false
	}
	err = syscall.Kill(n, 0)
	return err == nil || errors.Is(err, syscall.EPERM)
}

func removeChain(chain string) {
	for _, table := range []string{"filter", "mangle"} {
		for iptables(table, "-D", "OUTPUT", "-j", chain) == nil {
		}
		iptables(table, "-F", chain)
		iptables(table, "-X", chain)
	}
}

// removeCgroups removes dir and the cgroups under it, deepest first; a
// cgroup that still holds a process stays.
func removeCgroups(dir string) {
	var dirs []string
	filepath.WalkDir(dir, func(path string, d os.DirEntry, err error) error {
		if err == nil && d.IsDir() {
			dirs = append(dirs, path)
		}
		return nil
	})
	for i := len(dirs) - 1; i >= 0; i-- {
		for try := 0; try < 20 && os.Remove(dirs[i]) != nil; try++ {
			time.Sleep(100 * time.Millisecond) // its processes are still exiting
		}
	}
}

func iptables(table string, args ...string) error {
	out, err := exec.Command("iptables", append([]string{"-w", "-t", table}, args...)...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("iptables -t %s %s: %v: %s", table, strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// cgroup2Root returns where the cgroup v2 hierarchy is mounted
// (/sys/fs/cgroup, or /sys/fs/cgroup/unified beside the v1 controllers).
func cgroup2Root() (string, error) {
	f, err := os.Open("/proc/self/mounts")
	if err != nil {
		return "", err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if fields := strings.Fields(sc.Text()); len(fields) > 2 && fields[2] == "cgroup2" {
			return fields[1], nil
		}
	}
	return "", errors.New("network faults need a cgroup v2 hierarchy: none is mounted")
}

// drop is a rule dropping what the sockets of the cgroup at path send.
func dropFrom(path string) rule {
	return rule{"filter", []string{"-m", "cgroup", "--path", path, "-j", "DROP"}}
}

// dropFromTo drops what the sockets of the cgroup at path send to ports.
func dropFromTo(path string, ports ...int) rule {
	return rule{"filter", []string{"-m", "cgroup", "--path", path, "-p", "tcp", "-m", "multiport", "--dports", joinPorts(ports), "-j", "DROP"}}
}

// dropTo drops every packet sent to ports (connections to a node's
// listeners, whoever opened them).
func dropTo(ports ...int) rule {
	return rule{"filter", []string{"-p", "tcp", "-m", "multiport", "--dports", joinPorts(ports), "-j", "DROP"}}
}

// markFrom and markTo send packets through the slow link.
func markFrom(path string) rule {
	return rule{"mangle", []string{"-m", "cgroup", "--path", path, "-j", "CLASSIFY", "--set-class", slowHandle + "1"}}
}

func markTo(ports ...int) rule {
	return rule{"mangle", []string{"-p", "tcp", "-m", "multiport", "--dports", joinPorts(ports), "-j", "CLASSIFY", "--set-class", slowHandle + "1"}}
}

func joinPorts(ports []int) string {
	s := make([]string, len(ports))
	for i, p := range ports {
		s[i] = strconv.Itoa(p)
	}
	return strings.Join(s, ",")
}

// portOf returns the port of a host:port address.
func portOf(addr string) int {
	i := strings.LastIndexByte(addr, ':')
	p, _ := strconv.Atoi(addr[i+1:])
	return p
}

// waitCtx sleeps d or until ctx ends.
func waitCtx(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}
