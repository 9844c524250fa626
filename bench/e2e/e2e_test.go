package main

import (
	"bytes"
	"context"
	"io"
	"maps"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestMain lets the test binary be the no-op server and the profiled
// `onceflow dev` too, as the benchmark's own binary is: it starts them by
// running itself (os.Executable).
func TestMain(m *testing.M) {
	if os.Getenv(envNoop) != "" || os.Getenv(envProfiledDev) != "" {
		main()
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// TestSmoke runs the whole benchmark briefly at a tiny rate against every
// system (onceflow dev, the Watermill peer, the no-op server) and checks
// the report is whole and its figures sane: every operation answered, no
// error, latencies above zero and below the bounds any of them holds, each
// onceflow stage seen, the markdown and the PNG written. It checks no
// speed: the figures are for make bench-e2e on a quiet machine.
func TestSmoke(t *testing.T) {
	if testing.Short() {
		t.Skip("starts onceflow dev, the Watermill peer and two brokers as processes; skipped with -short")
	}
	dbURL := os.Getenv("DATABASE_URL")
	if dbURL == "" {
		t.Skip("needs DATABASE_URL (a Postgres server on which it may create databases; make test sets it)")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	dir := t.TempDir()
	md, png := filepath.Join(dir, "report.md"), filepath.Join(dir, "plot.png")
	var out bytes.Buffer
	rep, err := runReport(ctx, []string{
		"-targets", "dev,watermill,noop", "-rates", "20", "-step", "2s", "-warmup", "0s",
		"-closed", "1s", "-idle", "1s", "-clients", "4", "-search", "0", "-tenants", "2", "-accounts", "4",
		"-md", md, "-png", png,
	}, os.Getenv, &out)
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Targets) != 3 {
		t.Fatalf("got %d systems in the report, want 3", len(rep.Targets))
	}
	for _, tr := range rep.Targets {
		if tr.Err != "" {
			t.Fatalf("%s: %s", tr.Name, tr.Err)
		}
		if len(tr.Steps) != 1 || len(tr.Closed) != 1 {
			t.Fatalf("%s: got %d open-loop steps and %d closed-loop runs, want 1 and 1", tr.Name, len(tr.Steps), len(tr.Closed))
		}
		s := tr.Steps[0]
		if s.N != 40 || s.Errs != 0 {
			t.Errorf("%s at 20/s for 2s: got %d operations, %d errors (first: %s), want 40 and none", tr.Name, s.N, s.Errs, s.FirstErr)
		}
		if s.Visible.P50 <= 0 || s.Visible.P99 < s.Visible.P50 || s.Visible.Max > 10_000 || s.Accepted.P50 > s.Visible.P50 {
			t.Errorf("%s: latencies not sane: 202 %+v, outcome %+v", tr.Name, s.Accepted, s.Visible)
		}
		if tr.Name != "noop" && (tr.Ceiling.Achieved <= 0 || tr.Ceiling.Errs != 0) {
			t.Errorf("%s: the HTTP-only ceiling measured just before it: %.1f/s, %d errors", tr.Name, tr.Ceiling.Achieved, tr.Ceiling.Errs)
		}
		if c := tr.Closed[0]; c.Achieved <= 0 || c.Errs != 0 || c.Clients != 4 {
			t.Errorf("%s closed loop: %.1f/s with %d clients, %d errors (first: %s)", tr.Name, c.Achieved, c.Clients, c.Errs, c.FirstErr)
		}
		if tr.Idle.Seconds < 1 || tr.Idle.N != 0 {
			t.Errorf("%s: the idle step: %.1f s, %d operations; want 1 s and none", tr.Name, tr.Idle.Seconds, tr.Idle.N)
		}
		// The no-op server's 40 requests may take less than a clock tick.
		if len(s.CPU.Procs) == 0 || tr.Name != "noop" && (s.CPU.System <= 0 || s.CPU.Postgres <= 0) {
			t.Errorf("%s: the bill has no process's CPU: %+v", tr.Name, s.CPU)
		}
		if tr.Name != "dev" {
			continue
		}
		// dev's connections are named after its components, and the bill
		// splits Postgres by those names.
		named := false
		for _, p := range s.CPU.PostgresBy {
			named = named || p.Name == "ingest,relay,processor,projector,worker"
		}
		if !named {
			t.Errorf("dev: no Postgres backends named after its components: %+v", s.CPU.PostgresBy)
		}
		// The project's own cluster loads pg_stat_statements; a server
		// started otherwise (make test on another DATABASE_URL) has no
		// statements to bill, and says so.
		if s.StatementsErr == "" {
			// Every operation runs statements: its POST's accept, its
			// outcome read.
			if _, _, calls := stmtTime(s.Statements); calls < int64(2*s.N) {
				t.Errorf("dev: the bill has %d statements for %d operations, want at least 2 each: %+v", calls, s.N, s.Statements)
			}
		} else if !strings.Contains(s.StatementsErr, "pg_stat_statements") {
			t.Errorf("dev: statements unknown for another reason than pg_stat_statements: %s", s.StatementsErr)
		}
		for _, st := range stageMetrics {
			found := false
			for _, got := range s.Stages {
				if got.Name == st.name && got.Count >= 40 && got.P50 > 0 && got.P99 >= got.P50 {
					found = true
				}
			}
			if !found {
				t.Errorf("dev: stage %s (%s) missing or empty in %+v", st.name, st.metric, s.Stages)
			}
		}
	}
	text, err := os.ReadFile(md)
	if err != nil {
		t.Fatal(err)
	}
	// The statements, or why there are none.
	if dev, _ := rep.target("dev"); dev.Steps[0].StatementsErr == "" {
		if !strings.Contains(string(text), "statements that took the most") {
			t.Errorf("report lacks dev's statements:\n%s", text)
		}
	} else if !strings.Contains(string(text), "No statements: ") {
		t.Errorf("report lacks why dev's statements are missing:\n%s", text)
	}
	for _, want := range []string{"| onceflow dev |", "| Watermill peer |", "| HTTP only (no-op handler) |", "against the Watermill peer", "against the HTTP-only ceiling", "onceflow dev, the bill", "| idle, µs per second |", "onceflow dev's bill in its best closed loop", "onceflow dev against the goals"} {
		if !strings.Contains(string(text), want) {
			t.Errorf("report lacks %q:\n%s", want, text)
		}
	}
	if !bytes.Equal(out.Bytes(), text) {
		t.Errorf("the report printed and the one written differ")
	}
	img, err := os.ReadFile(png)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.HasPrefix(img, []byte("\x89PNG\r\n\x1a\n")) || len(img) < 10_000 {
		t.Errorf("plot: %d bytes, not a PNG of a plot", len(img))
	}
}

// TestSetFlag checks -set: each NAME=value reaches the environment of
// every onceflow process the harness starts, over the harness's own
// defaults, and a malformed one is refused before anything starts.
func TestSetFlag(t *testing.T) {
	c, err := parseFlags([]string{"-set", "ONCEFLOW_OUTBOX_SHARDS=4", "-set", "LOG_LEVEL=debug", "-set", "ONCEFLOW_X=a=b"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	got := env{settings: c.settings}.onceflowEnv()
	want := map[string]string{"ONCEFLOW_OUTBOX_SHARDS": "4", "LOG_LEVEL": "debug", "ONCEFLOW_X": "a=b", "ONCEFLOW_TENANT_RATE_LIMIT": "0"}
	if !maps.Equal(got, want) {
		t.Errorf("environment with -set: got %v, want %v", got, want)
	}
	for _, bad := range []string{"ONCEFLOW_OUTBOX_SHARDS", "=4"} {
		if _, err := parseFlags([]string{"-set", bad}, io.Discard); err == nil || !strings.Contains(err.Error(), "NAME=value") {
			t.Errorf("-set %q: got %v, want an error asking for NAME=value", bad, err)
		}
	}
}
