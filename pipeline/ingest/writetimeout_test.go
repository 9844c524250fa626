package ingest_test

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/onceflow/onceflow/pipeline/ingest"
)

// A client that stops reading its answer holds its connection for the
// write timeout, not for ever: the connection's buffers are kept small
// (as a slow reader's fill), the client asks for the OpenAPI document
// again and again without reading, and the server closes the connection
// once the timeout has passed, the answer cut.
func TestSlowReaderIsCutAtTheWriteTimeout(t *testing.T) {
	t.Parallel()
	pool, _ := ledgerPool(t)
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ln := &smallBuffers{Listener: inner, closed: make(chan closing, 16)}
	const timeout = time.Second
	s := startServerOn(t, ln, pool, ingest.Config{RequestTimeout: 200 * time.Millisecond, WriteTimeout: timeout})
	doc := s.do(t, req{method: http.MethodGet, path: "/openapi.json"})
	conn, err := net.Dial("tcp", strings.TrimPrefix(s.URL, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if err := conn.(*net.TCPConn).SetReadBuffer(1024); err != nil {
		t.Fatal(err)
	}
	const asks = 20
	start := time.Now()
	if _, err := io.WriteString(conn, strings.Repeat("GET /openapi.json HTTP/1.1\r\nHost: ingest\r\n\r\n", asks)); err != nil {
		t.Fatal(err)
	}
	giveUp := time.After(10 * timeout)
	for closed := false; !closed; {
		select {
		case c := <-ln.closed:
			if c.peer != conn.LocalAddr().String() {
				continue
			}
			if took := c.at.Sub(start); took < timeout {
				t.Errorf("the server closed the slow reader's connection after %s, before the write timeout (%s)", took, timeout)
			}
			closed = true
		case <-giveUp:
			t.Fatalf("the server still holds a connection whose client reads nothing after %s (write timeout %s)", 10*timeout, timeout)
		}
	}
	if err := conn.SetReadDeadline(time.Now().Add(5 * time.Second)); err != nil {
		t.Fatal(err)
	}
	got, _ := io.ReadAll(conn) // what the server had sent before it closed
	if want := asks * len(doc.Body); len(got) >= want {
		t.Errorf("the slow reader got %d bytes, all %d asks (%d bytes): nothing was cut", len(got), asks, want)
	}
}

// A ?wait= longer than the write timeout is not cut: the wait is added to
// it.
func TestWaitOutlastsTheWriteTimeout(t *testing.T) {
	t.Parallel()
	pool, _ := ledgerPool(t)
	s := startServer(t, pool, ingest.Config{RequestTimeout: 200 * time.Millisecond, WriteTimeout: 500 * time.Millisecond})
	key := tenant(t, pool, "acme")
	id := acceptedID(t, s.do(t, req{path: "/v1/accounts", apiKey: key, idemKey: "o", body: `{"account_id":"a","currency":"EUR"}`}))
	start := time.Now()
	r, c := s.command(t, key, id, "?wait=2s")
	if r.Status != http.StatusOK || c.Status != "pending" {
		t.Fatalf("?wait=2s with a write timeout of 500ms: %s, want 200 pending", r)
	}
	if took := time.Since(start); took < 2*time.Second {
		t.Errorf("?wait=2s answered after %s: it did not wait", took)
	}
}

// smallBuffers gives every connection it accepts a send buffer of a few
// KiB, as a client that reads slowly leaves it full, and reports when the
// server closes one.
type smallBuffers struct {
	net.Listener
	closed chan closing
}

// closing is a connection the server closed: its peer's address, when.
type closing struct {
	peer string
	at   time.Time
}

func (l *smallBuffers) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	if err := c.(*net.TCPConn).SetWriteBuffer(4096); err != nil {
		c.Close()
		return nil, fmt.Errorf("small send buffer: %w", err)
	}
	return &watched{Conn: c, closed: l.closed}, nil
}

type watched struct {
	net.Conn
	closed chan closing
}

func (c *watched) Close() error {
	select {
	case c.closed <- closing{c.RemoteAddr().String(), time.Now()}:
	default:
	}
	return c.Conn.Close()
}
