// Package ingesttest runs ingest in the library's tests: a server on a
// loopback port until the test ends. It imports no domain (the library
// imports none, its test helpers included: TestImportRules); the routes a
// test serves are its own.
package ingesttest

import (
	"context"
	"net"
	"sync"
	"testing"

	"github.com/onceflow/onceflow/pipeline/ingest"
)

// Serve runs srv on a loopback port until the test ends, or stop; it
// returns the server's base URL.
func Serve(t testing.TB, srv *ingest.Server) (url string, stop func()) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx, ln) }()
	stop = sync.OnceFunc(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("ingest: %v", err)
		}
	})
	t.Cleanup(stop)
	return "http://" + ln.Addr().String(), stop
}
