// Package onceflowtest runs the embedded default (onceflow dev) in a test.
// It is for the application's tests and the test harnesses (test/...);
// the library's tests (pipeline/...) do not need the application to
// compile, and production code imports no test helper.
package onceflowtest

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"github.com/onceflow/onceflow"
)

// Dev runs onceflow dev with dc until the test ends and returns its
// addresses once every component has started. What dc leaves empty of the
// HTTP, admin, broker and registry addresses is a loopback port the
// system picks, and the data directory is the test's. A dev that stops
// before it is ready fails the test with its error (and what it wrote, if
// dc.Out is a *pipelinetest.Buffer or another fmt.Stringer). stop stops it
// (the test's cleanup does too) and fails the test if it ended with an
// error; a second call does nothing.
func Dev(t testing.TB, dc onceflow.DevConfig) (addrs onceflow.Addrs, stop func()) {
	t.Helper()
	for _, addr := range []*string{&dc.HTTPAddr, &dc.AdminAddr, &dc.BrokerAddr, &dc.RegistryAddr} {
		if *addr == "" {
			*addr = "127.0.0.1:0"
		}
	}
	if dc.DataDir == "" {
		dc.DataDir = t.TempDir()
	}
	started := make(chan onceflow.Addrs, 1)
	then := dc.Started
	dc.Started = func(a onceflow.Addrs) {
		if then != nil {
			then(a)
		}
		started <- a
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- onceflow.RunDev(ctx, dc) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("onceflow dev: %v", err)
			}
		})
	}
	t.Cleanup(stop)
	select {
	case a := <-started:
		return a, stop
	case err := <-done:
		done <- nil // reported here: stop has nothing to add
		out := ""
		if s, ok := dc.Out.(fmt.Stringer); ok {
			out = "\n" + s.String()
		}
		t.Fatalf("onceflow dev stopped before it was ready: %v%s", err, out)
		return onceflow.Addrs{}, stop
	}
}
