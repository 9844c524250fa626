package chaos

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"sync"
	"time"
)

// pgCut is a TCP proxy on loopback in front of Postgres for the
// components of one kind (the postgres-cut fault, docs/chaos.md#postgres-cut).
// It reads what the clients send, message by message, and when armed cuts
// a connection, both ways at once, right after it forwarded a COMMIT (pgx
// sends it as a simple Query message: the server commits, the client never
// learns it did) or the Sync that ends a batch writing outside a
// transaction (an implicit transaction, committed at the Sync: ingest's),
// or in the middle of a transaction, after a Sync of the extended protocol
// (a batch's statements sent, the transaction still open).
type pgCut struct {
	ln       net.Listener
	upstream string

	mu      sync.Mutex
	mode    string // cutCommit, cutMidTx or "" (disarmed)
	left    int    // cuts still to make while armed
	conns   map[net.Conn]struct{}
	stopped bool
}

const (
	cutCommit = "after COMMIT was sent"
	cutMidTx  = "in the middle of a transaction"
)

func newPGCut(upstream string) (*pgCut, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &pgCut{ln: ln, upstream: upstream, conns: map[net.Conn]struct{}{}}
	go p.accept()
	return p, nil
}

// Addr is the proxy's host:port.
func (p *pgCut) Addr() string { return p.ln.Addr().String() }

// arm makes the next n cuts of mode; disarm (mode "") stops them. It
// returns how many cuts were left unmade by the previous arming.
func (p *pgCut) arm(mode string, n int) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	left := p.left
	p.mode, p.left = mode, n
	if mode == "" {
		p.left = 0
	}
	return left
}

// take reports whether a connection at a point of mode is to be cut now.
func (p *pgCut) take(mode string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.mode != mode || p.left == 0 {
		return false
	}
	p.left--
	return true
}

func (p *pgCut) close() {
	p.mu.Lock()
	p.stopped = true
	conns := p.conns
	p.conns = map[net.Conn]struct{}{}
	p.mu.Unlock()
	p.ln.Close()
	for c := range conns {
		c.Close()
	}
}

func (p *pgCut) track(cs ...net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.stopped {
		return false
	}
	for _, c := range cs {
		p.conns[c] = struct{}{}
	}
	return true
}

func (p *pgCut) untrack(cs ...net.Conn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range cs {
		delete(p.conns, c)
		c.Close()
	}
}

func (p *pgCut) accept() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		go p.serve(c)
	}
}

func (p *pgCut) serve(client net.Conn) {
	server, err := net.DialTimeout("tcp", p.upstream, 5*time.Second)
	if err != nil {
		client.Close()
		return
	}
	if !p.track(client, server) {
		client.Close()
		server.Close()
		return
	}
	defer p.untrack(client, server)
	go func() {
		io.Copy(client, server)
		client.Close()
	}()
	p.forward(client, server)
}

// Startup-phase requests that come before the startup message itself.
const (
	sslRequest    = 80877103
	gssEncRequest = 80877104
)

// forward copies client's messages to server one at a time, cutting both
// when an armed point passes.
func (p *pgCut) forward(client, server net.Conn) {
	r := newMsgReader(client)
	// The startup phase: untyped messages, the requests for encryption
	// (answered with one byte the other way), then the startup message.
	for {
		msg, err := r.untyped()
		if err != nil || writeAll(server, msg) != nil {
			return
		}
		if code := binary.BigEndian.Uint32(msg[4:8]); code != sslRequest && code != gssEncRequest {
			break
		}
	}
	inTx := false
	writes := map[string]bool{} // prepared statements that write, by name
	wrote := false              // a statement that writes since the last Sync
	for {
		typ, msg, err := r.typed()
		if err != nil || writeAll(server, msg) != nil {
			return
		}
		cut := false
		switch typ {
		case 'Q':
			q := bytes.ToLower(bytes.TrimSpace(bytes.TrimRight(msg[5:], "\x00")))
			switch {
			case bytes.HasPrefix(q, []byte("begin")) || bytes.HasPrefix(q, []byte("start transaction")):
				inTx = true
			case bytes.Equal(q, []byte("commit")):
				inTx = false
				cut = p.take(cutCommit)
			case bytes.Equal(q, []byte("rollback")):
				inTx = false
			}
		case 'P': // Parse: name, query
			if f := bytes.SplitN(msg[5:], []byte{0}, 3); len(f) == 3 {
				writes[string(f[0])] = isWrite(f[1])
			}
		case 'B': // Bind: portal, statement
			if f := bytes.SplitN(msg[5:], []byte{0}, 3); len(f) == 3 && writes[string(f[1])] {
				wrote = true
			}
		case 'S':
			switch {
			case inTx:
				cut = p.take(cutMidTx)
			case wrote:
				// Outside a transaction the statements since the last Sync
				// are one implicit transaction, committed at this Sync
				// (ingest's batches): a cut now is a cut after its commit.
				cut = p.take(cutCommit)
			}
			wrote = false
		}
		if cut {
			// The client's side goes at once. The server's is only shut
			// for writing, and what the server still sends is read and
			// dropped until it closes: a close with its answers unread
			// would reset the connection, and the server could lose what
			// it had not read yet, the COMMIT or the Sync among it. So it
			// runs what was sent, commits, and finds no client to answer.
			client.Close()
			if tc, ok := server.(*net.TCPConn); ok {
				tc.CloseWrite()
			}
			server.SetReadDeadline(time.Now().Add(10 * time.Second))
			io.Copy(io.Discard, server)
			return
		}
	}
}

// isWrite reports whether query changes rows.
func isWrite(query []byte) bool {
	q := bytes.ToLower(bytes.TrimSpace(query))
	for _, w := range []string{"insert", "update", "delete", "with", "merge"} {
		if bytes.HasPrefix(q, []byte(w)) {
			return true
		}
	}
	return false
}

// msgReader reads the frontend's messages whole.
type msgReader struct{ r io.Reader }

func newMsgReader(r io.Reader) *msgReader { return &msgReader{r: r} }

// untyped reads a length-prefixed message of the startup phase.
func (m *msgReader) untyped() ([]byte, error) {
	var head [4]byte
	if _, err := io.ReadFull(m.r, head[:]); err != nil {
		return nil, err
	}
	n := int(binary.BigEndian.Uint32(head[:]))
	if n < 8 || n > 1<<20 {
		return nil, errors.New("pgcut: bad startup message length")
	}
	msg := make([]byte, n)
	copy(msg, head[:])
	_, err := io.ReadFull(m.r, msg[4:])
	return msg, err
}

// typed reads a message of type byte and length, and returns it whole.
func (m *msgReader) typed() (byte, []byte, error) {
	var head [5]byte
	if _, err := io.ReadFull(m.r, head[:]); err != nil {
		return 0, nil, err
	}
	n := int(binary.BigEndian.Uint32(head[1:]))
	if n < 4 || n > 1<<30 {
		return 0, nil, errors.New("pgcut: bad message length")
	}
	msg := make([]byte, 1+n)
	copy(msg, head[:])
	_, err := io.ReadFull(m.r, msg[5:])
	return head[0], msg, err
}

func writeAll(w io.Writer, b []byte) error {
	_, err := w.Write(b)
	return err
}
