// Package onceflowtest runs the embedded default (onceflow dev), or the
// components of a RunConfig, in a test.
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
	"github.com/onceflow/onceflow/dev"
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
	return run(t, "onceflow dev", &dc.Started, dc.Out, func(ctx context.Context) error { return dev.Run(ctx, dc) })
}

// Components runs rc's components (onceflow.RunComponents) until the test
// ends, as Dev runs onceflow dev: its addresses once every component has
// started (the HTTP and admin addresses a loopback port the system picks
// when rc leaves them empty), a test failed by a deployment that stops
// before it is ready or ends with an error, and stop.
func Components(t testing.TB, rc onceflow.RunConfig) (addrs onceflow.Addrs, stop func()) {
	t.Helper()
	for _, addr := range []*string{&rc.HTTPAddr, &rc.AdminAddr} {
		if *addr == "" {
			*addr = "127.0.0.1:0"
		}
	}
	return run(t, "deployment", &rc.Started, nil, func(ctx context.Context) error { return onceflow.RunComponents(ctx, rc) })
}

// run runs start until the test ends or stop is called, and returns the
// addresses *started is called with; out, if a fmt.Stringer, is shown
// when it stops before it is ready.
func run(t testing.TB, name string, started *func(onceflow.Addrs), out any, start func(context.Context) error) (onceflow.Addrs, func()) {
	t.Helper()
	ready := make(chan onceflow.Addrs, 1)
	then := *started
	*started = func(a onceflow.Addrs) {
		if then != nil {
			then(a)
		}
		ready <- a
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- start(ctx) }()
	var once sync.Once
	stop := func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("%s: %v", name, err)
			}
		})
	}
	t.Cleanup(stop)
	select {
	case a := <-ready:
		return a, stop
	case err := <-done:
		done <- nil // reported here: stop has nothing to add
		shown := ""
		if s, ok := out.(fmt.Stringer); ok {
			shown = "\n" + s.String()
		}
		t.Fatalf("%s stopped before it was ready: %v%s", name, err, shown)
		return onceflow.Addrs{}, stop
	}
}
