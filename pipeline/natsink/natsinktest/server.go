// Package natsinktest starts a real nats-server with JetStream for a test,
// as pipelinetest gives a test a real Postgres database: Debian's
// nats-server package (.ci/run installs it); a test is skipped, saying
// so, where the binary is missing.
package natsinktest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Server is one nats-server process with JetStream, listening on a free
// loopback port, its store under the test's temporary directory. It is
// killed when the test ends.
type Server struct {
	// URL is nats://127.0.0.1:PORT.
	URL string

	t    testing.TB
	bin  string
	dir  string
	port int
	cmd  *exec.Cmd
	done chan struct{}
}

// Binary returns the nats-server binary's path, or "" when it is not
// installed.
func Binary() string {
	if p, err := exec.LookPath("nats-server"); err == nil {
		return p
	}
	if _, err := os.Stat("/usr/sbin/nats-server"); err == nil {
		return "/usr/sbin/nats-server" // Debian's, off a user's PATH
	}
	return ""
}

// Start starts a server for the test, or skips the test when nats-server
// is not installed.
func Start(t testing.TB) *Server {
	t.Helper()
	bin := Binary()
	if bin == "" {
		t.Skip("nats-server is not installed (Debian: apt-get install nats-server); the NATS sink's tests need a real one")
	}
	s := &Server{t: t, bin: bin, dir: t.TempDir()}
	t.Cleanup(s.Kill)
	var err error
	for attempt := 0; attempt < 5; attempt++ {
		s.port = freePort(t)
		if err = s.start(); err == nil {
			s.URL = "nats://127.0.0.1:" + strconv.Itoa(s.port)
			return s
		}
	}
	t.Fatalf("start nats-server: %v", err)
	return nil
}

// Kill stops the server with SIGKILL (a crash: JetStream recovers its
// store at the next start) and waits for it to exit.
func (s *Server) Kill() {
	if s.cmd == nil {
		return
	}
	s.cmd.Process.Kill()
	<-s.done
	s.cmd = nil
}

// CPU returns the CPU time (user and system) the running server has used,
// from /proc: what a benchmark charges to JetStream.
func (s *Server) CPU() (time.Duration, error) {
	if s.cmd == nil {
		return 0, errors.New("nats-server is not running")
	}
	b, err := os.ReadFile("/proc/" + strconv.Itoa(s.cmd.Process.Pid) + "/stat") // #nosec G304 -- the server's own entry in /proc
	if err != nil {
		return 0, err
	}
	// The command name (field 2) may hold spaces; the fields after it are
	// counted from its closing parenthesis: utime and stime are the 14th
	// and 15th of the line, in clock ticks (100 a second on Linux).
	rest := string(b[bytes.LastIndexByte(b, ')')+2:])
	fields := strings.Fields(rest)
	if len(fields) < 13 {
		return 0, fmt.Errorf("/proc stat: %q", rest)
	}
	var ticks int64
	for _, f := range fields[11:13] {
		n, err := strconv.ParseInt(f, 10, 64)
		if err != nil {
			return 0, err
		}
		ticks += n
	}
	return time.Duration(ticks) * 10 * time.Millisecond, nil
}

// Restart starts the server again, on the same port with the same store,
// and waits until JetStream answers.
func (s *Server) Restart() {
	s.t.Helper()
	s.Kill()
	var err error
	for attempt := 0; attempt < 50; attempt++ {
		if err = s.start(); err == nil {
			return
		}
		time.Sleep(100 * time.Millisecond) // the port may not be free yet
	}
	s.t.Fatalf("restart nats-server: %v", err)
}

// start runs the server and waits until it serves JetStream.
func (s *Server) start() error {
	logPath := filepath.Join(s.dir, "nats-server.log")
	cmd := exec.Command(s.bin, "-a", "127.0.0.1", "-p", strconv.Itoa(s.port), "-js", "-sd", filepath.Join(s.dir, "store"), "-l", logPath) // #nosec G204 -- the test's own binary and arguments
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return err
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	s.cmd, s.done = cmd, done
	deadline := time.Now().Add(30 * time.Second)
	for {
		select {
		case <-done:
			s.cmd = nil
			b, _ := os.ReadFile(logPath) // #nosec G304 -- the server's log in the test's directory
			return fmt.Errorf("nats-server exited: %s", tail(b, 2000))
		default:
		}
		err := s.ping()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			s.Kill()
			return fmt.Errorf("nats-server not serving JetStream within 30s: %w", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// ping connects and asks JetStream for the account's information.
func (s *Server) ping() error {
	nc, err := nats.Connect("nats://127.0.0.1:"+strconv.Itoa(s.port), nats.Timeout(time.Second), nats.NoReconnect())
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_, err = js.AccountInfo(ctx)
	return err
}

// Connect returns a connection to the server and its JetStream context
// for the test, closed when it ends.
func (s *Server) Connect(t testing.TB) (*nats.Conn, jetstream.JetStream) {
	t.Helper()
	nc, err := nats.Connect(s.URL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return nc, js
}

// Messages reads every message of stream from its start, in order.
func Messages(ctx context.Context, js jetstream.JetStream, stream string) ([]jetstream.Msg, error) {
	s, err := js.Stream(ctx, stream)
	if err != nil {
		return nil, err
	}
	info, err := s.Info(ctx)
	if err != nil {
		return nil, err
	}
	if info.State.Msgs == 0 {
		return nil, nil
	}
	c, err := s.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{})
	if err != nil {
		return nil, err
	}
	var out []jetstream.Msg
	for uint64(len(out)) < info.State.Msgs {
		batch, err := c.Fetch(int(min(info.State.Msgs-uint64(len(out)), 1000)), jetstream.FetchMaxWait(5*time.Second))
		if err != nil {
			return nil, err
		}
		n := len(out)
		for m := range batch.Messages() {
			out = append(out, m)
		}
		if err := batch.Error(); err != nil && !errors.Is(err, nats.ErrTimeout) {
			return nil, err
		}
		if len(out) == n {
			return out, fmt.Errorf("stream %s: read %d of %d messages", stream, len(out), info.State.Msgs)
		}
	}
	return out, nil
}

func freePort(t testing.TB) int {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

func tail(b []byte, n int) string {
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return string(b)
}
