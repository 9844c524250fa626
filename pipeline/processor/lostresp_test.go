package processor_test

import (
	"encoding/binary"
	"net"
	"sync"
	"sync/atomic"

	"github.com/twmb/franz-go/pkg/kmsg"
)

// lossyListener wraps the broker's listener so a test can make it lose the
// response to a request it has handled: the request is applied, the client
// never hears back. kfake's faults answer before acting (an error the
// client can trust); this is the other half of an indeterminate commit.
type lossyListener struct {
	net.Listener
	key  int16        // the request key whose responses are lost
	lose atomic.Int32 // responses still to lose
	lost atomic.Int32 // responses lost so far
}

func (l *lossyListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &lossyConn{Conn: c, l: l, pending: map[int32]bool{}}, nil
}

// lossyConn watches the requests the broker reads for l.key and closes the
// connection instead of writing their responses.
type lossyConn struct {
	net.Conn
	l *lossyListener

	in   []byte // the start of the request frame being read
	skip int    // bytes of the current frame still to pass over

	mu      sync.Mutex
	pending map[int32]bool // correlation ids whose response is lost
}

func (c *lossyConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	c.scan(p[:n])
	return n, err
}

// scan follows the request frames: 4 bytes of size, then api key (2),
// version (2) and correlation id (4).
func (c *lossyConn) scan(b []byte) {
	for len(b) > 0 {
		if c.skip > 0 {
			k := min(c.skip, len(b))
			c.skip -= k
			b = b[k:]
			continue
		}
		need := 12 - len(c.in)
		k := min(need, len(b))
		c.in = append(c.in, b[:k]...)
		b = b[k:]
		if len(c.in) < 12 {
			return
		}
		size := int(binary.BigEndian.Uint32(c.in[0:4]))
		key := int16(binary.BigEndian.Uint16(c.in[4:6]))
		corr := int32(binary.BigEndian.Uint32(c.in[8:12]))
		if key == c.l.key && c.l.lose.Add(-1) >= 0 {
			c.mu.Lock()
			c.pending[corr] = true
			c.mu.Unlock()
		}
		c.in, c.skip = c.in[:0], size-8
	}
}

func (c *lossyConn) Write(p []byte) (int, error) {
	if len(p) >= 8 {
		corr := int32(binary.BigEndian.Uint32(p[4:8]))
		c.mu.Lock()
		lose := c.pending[corr]
		delete(c.pending, corr)
		c.mu.Unlock()
		if lose {
			c.l.lost.Add(1)
			c.Conn.Close()
			return 0, net.ErrClosed
		}
	}
	return c.Conn.Write(p)
}

// listen is a kfake.ListenFn that installs l.
func (l *lossyListener) listen(network, address string) (net.Listener, error) {
	ln, err := net.Listen(network, address)
	if err != nil {
		return nil, err
	}
	l.Listener = ln
	return l, nil
}

func newLossyListener(key kmsg.Key) *lossyListener { return &lossyListener{key: int16(key)} }
