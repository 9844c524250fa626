package kafkacluster

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// Node is one KRaft node of a cluster: a broker and a controller in one
// JVM process, with its storage in Dir.
type Node struct {
	ID int32
	// Addr is the broker's listener, 127.0.0.1:port (what clients dial).
	Addr string
	// ControllerAddr is the controller's listener (the quorum's votes).
	ControllerAddr string
	// Dir holds server.properties, the storage (data/), the log
	// (kafka.log, what log4j writes) and stdout.log (the JVM's own
	// output: a crash report, an out-of-memory error).
	Dir string

	c *Cluster

	mu   sync.Mutex
	pid  int
	done chan struct{} // closed when the process this value started exits; nil for a process found in the cluster file
}

// Cgroup is the directory of the node's cgroup (Config.Cgroups/node-ID),
// "" without Config.Cgroups.
func (n *Node) Cgroup() string {
	if n.c.cfg.Cgroups == "" {
		return ""
	}
	return filepath.Join(n.c.cfg.Cgroups, fmt.Sprintf("node-%d", n.ID))
}

// openCgroup makes the cgroup directory dir if missing and opens it for
// a child to start in (SysProcAttr.CgroupFD).
func openCgroup(dir string) (int, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return -1, fmt.Errorf("cgroup: %w", err)
	}
	fd, err := syscall.Open(dir, syscall.O_RDONLY|syscall.O_DIRECTORY|syscall.O_CLOEXEC, 0)
	if err != nil {
		return -1, fmt.Errorf("cgroup %s: %w", dir, err)
	}
	return fd, nil
}

// Props is the path of the node's server.properties.
func (n *Node) Props() string { return filepath.Join(n.Dir, "server.properties") }

// LogPath is the node's log (log4j's, rolled at 20 MB).
func (n *Node) LogPath() string { return filepath.Join(n.Dir, "kafka.log") }

// Pid is the node's process id, 0 when it never ran.
func (n *Node) Pid() int {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.pid
}

// Running reports whether the node's process is alive (paused counts as
// alive). A pid from the cluster file counts only while it still runs this
// node's server.properties: the system may have given it to another
// process since.
func (n *Node) Running() bool {
	n.mu.Lock()
	pid, done := n.pid, n.done
	n.mu.Unlock()
	if pid == 0 {
		return false
	}
	if done != nil {
		select {
		case <-done:
			return false
		default:
			return true
		}
	}
	cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	return err == nil && bytes.Contains(cmdline, []byte(n.Props()))
}

// start starts the node's process and returns without waiting for it to
// answer.
func (n *Node) start() error {
	if n.Running() {
		return fmt.Errorf("node %d is running (pid %d)", n.ID, n.Pid())
	}
	out, err := os.OpenFile(filepath.Join(n.Dir, "stdout.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	args := append(n.c.jvmArgs(n.Dir), "kafka.Kafka", n.Props())
	cmd := exec.Command(n.c.java, args...)
	cmd.Dir = n.Dir
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = n.c.sysProcAttr()
	if n.c.cfg.Cgroups != "" {
		fd, err := openCgroup(n.Cgroup())
		if err != nil {
			out.Close()
			return fmt.Errorf("start node %d: %w", n.ID, err)
		}
		defer syscall.Close(fd)
		cmd.SysProcAttr.UseCgroupFD, cmd.SysProcAttr.CgroupFD = true, fd
	}
	fmt.Fprintf(out, "=== %s start node %d\n", time.Now().Format(time.RFC3339), n.ID)
	if err := cmd.Start(); err != nil {
		out.Close()
		return fmt.Errorf("start node %d: %w", n.ID, err)
	}
	done := make(chan struct{})
	go func() {
		err := cmd.Wait()
		fmt.Fprintf(out, "=== %s exit node %d: %v\n", time.Now().Format(time.RFC3339), n.ID, err)
		out.Close()
		close(done)
	}()
	n.mu.Lock()
	n.pid, n.done = cmd.Process.Pid, done
	n.mu.Unlock()
	return nil
}

// Start starts a stopped or killed node again on its storage and waits
// until it serves as a broker: it answers on its own listener and the
// cluster's metadata lists it (a broker is listed once it has caught up
// with the metadata log and the controller unfenced it).
func (n *Node) Start(ctx context.Context) error {
	if err := n.start(); err != nil {
		return err
	}
	if err := n.c.save(); err != nil {
		return err
	}
	return n.WaitServing(ctx)
}

// WaitServing waits until the node answers a metadata request on its own
// listener with itself among the brokers.
func (n *Node) WaitServing(ctx context.Context) error {
	cl, err := kgo.NewClient(append(n.c.ClientOpts(AdminUser), kgo.SeedBrokers(n.Addr), kgo.RequestRetries(0))...)
	if err != nil {
		return err
	}
	defer cl.Close()
	var last error
	for {
		if !n.Running() {
			return fmt.Errorf("node %d exited:\n%s", n.ID, n.Tail(30))
		}
		rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		resp, err := kmsg.NewPtrMetadataRequest().RequestWith(rctx, cl)
		cancel()
		if err == nil {
			err = fmt.Errorf("node %d is not among the brokers its metadata lists", n.ID)
			for _, b := range resp.Brokers {
				if b.NodeID == n.ID {
					return nil
				}
			}
		}
		last = err
		select {
		case <-ctx.Done():
			return fmt.Errorf("node %d does not serve: %w (last: %v)\n%s", n.ID, ctx.Err(), last, n.Tail(30))
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// Stop stops the node gracefully: SIGTERM (a broker's controlled
// shutdown: its partitions' leadership moves to the others first), then
// SIGKILL if it has not exited within timeout. A paused node is resumed
// first, or it could not act on the signal.
func (n *Node) Stop(timeout time.Duration) error {
	if !n.Running() {
		return nil
	}
	n.signal(syscall.SIGCONT)
	n.signal(syscall.SIGTERM)
	if n.wait(timeout) {
		return nil
	}
	n.Kill()
	return fmt.Errorf("node %d did not stop within %s of SIGTERM; killed", n.ID, timeout)
}

// Kill ends the node with SIGKILL, as a crash or the kernel's OOM killer
// would: no controlled shutdown, nothing flushed that the OS has not seen.
// It returns once the process has gone.
func (n *Node) Kill() {
	if !n.Running() {
		return
	}
	n.signal(syscall.SIGKILL)
	n.wait(time.Minute)
}

// Pause stops the node's process with SIGSTOP: alive, its sockets open,
// and silent — its broker session with the controller and its clients'
// requests time out, as a long GC pause or a frozen VM would make them.
func (n *Node) Pause() { n.signal(syscall.SIGSTOP) }

// Resume continues a paused node (SIGCONT).
func (n *Node) Resume() { n.signal(syscall.SIGCONT) }

func (n *Node) signal(sig syscall.Signal) {
	if pid := n.Pid(); pid > 0 && n.Running() {
		syscall.Kill(pid, sig)
	}
}

// wait waits up to timeout for the process to end.
func (n *Node) wait(timeout time.Duration) bool {
	n.mu.Lock()
	done := n.done
	n.mu.Unlock()
	if done != nil {
		select {
		case <-done:
			return true
		case <-time.After(timeout):
			return false
		}
	}
	deadline := time.Now().Add(timeout)
	for n.Running() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(50 * time.Millisecond)
	}
	return true
}

// Tail returns the last lines of the node's log and of its JVM output.
func (n *Node) Tail(lines int) string {
	var b strings.Builder
	for _, name := range []string{"kafka.log", "stdout.log"} {
		f, err := os.Open(filepath.Join(n.Dir, name))
		if err != nil {
			continue
		}
		var tail []string
		sc := bufio.NewScanner(f)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			tail = append(tail, sc.Text())
			if len(tail) > lines {
				tail = tail[1:]
			}
		}
		f.Close()
		fmt.Fprintf(&b, "----- node %d %s -----\n%s\n", n.ID, name, strings.Join(tail, "\n"))
	}
	return b.String()
}

// errNotRunning is what Open returns for a cluster none of whose nodes
// runs.
var errNotRunning = errors.New("no node of the cluster is running")
