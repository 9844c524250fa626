// Command e2e is `make bench-e2e`: onceflow measured whole, from outside
// its processes, next to the same work built with Watermill and next to an
// HTTP server that does no work (docs/benchmarks.md#end-to-end-make-bench-e2e).
//
// It starts each system under test as processes of its own (`onceflow
// dev`; with -split the broker, ingest, relay, processor, projector and worker
// binaries; the Watermill peer of bench/watermill; the no-op server), one
// after the other, and drives each over HTTP with the same load generator:
// a deposit (POST /v1/accounts/{id}/deposits), then its outcome read back
// with GET /v1/commands/{id}?wait=. For each it prints
//
//   - open-loop latency at fixed rates: operations sent on a fixed
//     timetable and each measured from the time it was due, so a stall
//     counts in every operation it delays (no coordinated omission);
//   - the highest rate whose p99 holds the goal (-goal), by bisection;
//   - the closed-loop maximum: clients that send again as soon as their
//     outcome is visible, with the read models no more than 1 s behind;
//   - for onceflow, each stage's share (the age histograms of /metrics,
//     the difference over each step);
//
// then the ratios to the peer and to the no-op ceiling, as markdown, and a
// PNG plot of latency against rate.
//
// With KAFKA_BROKERS set (Apache Kafka: make kafka-up), every system runs
// on that cluster instead of an embedded broker of its own, each on topics
// of its own; the CPU of the cluster's nodes on this machine (the JVMs
// listening on KAFKA_BROKERS's ports) is counted among the system's, as the
// embedded broker's is.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/onceflow/onceflow"
	"github.com/onceflow/onceflow/cli"
	"github.com/onceflow/onceflow/examples/ledger/ledgerapp"
	"github.com/onceflow/onceflow/test/e2e"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	var err error
	switch {
	case os.Getenv(envNoop) != "":
		err = serveNoop(ctx, os.Getenv(envNoop))
	case os.Getenv(envProfiledDev) != "":
		err = profiledDev(ctx, os.Getenv(envProfiledDev), os.Args[1:])
	default:
		err = run(ctx, os.Args[1:], os.Getenv, os.Stdout)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench-e2e:", err)
		os.Exit(1)
	}
}

// profiledDev runs `onceflow dev` (what cmd/onceflow runs: cli.Run
// over the ledger) with a CPU profile of the whole run written to path.
func profiledDev(ctx context.Context, path string, args []string) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := pprof.StartCPUProfile(f); err != nil {
		return err
	}
	defer pprof.StopCPUProfile()
	return cli.Run(ctx, []*onceflow.Domain{ledgerapp.Domain()}, args, os.Getenv, os.Stdout)
}

// config is a run's settings, from flags.
type config struct {
	targets    []string
	rates      []float64
	step       time.Duration
	warmup     time.Duration
	closed     time.Duration
	idle       time.Duration
	clients    []int
	goal       time.Duration
	search     int
	tenants    int
	accounts   int // in all, spread over the tenants
	md, png    string
	cpuprofile string
	bin        string
	dir        string
	settings   map[string]string // -set: added to every onceflow process's environment
}

func parseFlags(args []string, out io.Writer) (config, error) {
	fs := flag.NewFlagSet("bench-e2e", flag.ContinueOnError)
	fs.SetOutput(out)
	targets := fs.String("targets", "dev,watermill,noop", "systems to measure, in order: dev (onceflow dev), split (the five binaries), watermill (the peer), noop (HTTP only)")
	split := fs.Bool("split", false, "also measure the five binaries as separate processes (adds split after dev)")
	rates := fs.String("rates", "200,1000,2000", "open-loop rates, operations per second")
	step := fs.Duration("step", 10*time.Second, "length of each open-loop step")
	warmup := fs.Duration("warmup", 3*time.Second, "open loop at the lowest rate before measuring, not reported")
	closed := fs.Duration("closed", 10*time.Second, "length of each closed-loop run")
	clients := fs.String("clients", "64,256", "closed-loop client counts to try")
	idle := fs.Duration("idle", 5*time.Second, "length of the step with no load at all, whose CPU the bill shows per second (0: none)")
	goal := fs.Duration("goal", 100*time.Millisecond, "p99 an open-loop rate must hold; the search finds the highest that does")
	search := fs.Int("search", 3, "bisection steps of the search for the highest rate holding -goal (0: none)")
	tenants := fs.Int("tenants", 16, "tenants the load is spread over (ingest holds at most 32 waits per tenant)")
	accounts := fs.Int("accounts", 1000, "accounts in all, spread over the tenants")
	md := fs.String("md", "", "also write the report (markdown) to this file")
	png := fs.String("png", "", "write the plot of latency against rate to this PNG file")
	cpuprofile := fs.String("cpuprofile", "", "write a CPU profile of `onceflow dev` over its whole run to this file")
	settings := map[string]string{}
	fs.Func("set", "`NAME=value` added to every onceflow process's environment, e.g. ONCEFLOW_OUTBOX_SHARDS=4 (repeat for more)", func(v string) error {
		name, value, ok := strings.Cut(v, "=")
		if !ok || name == "" {
			return fmt.Errorf("want NAME=value, got %q", v)
		}
		settings[name] = value
		return nil
	})
	bin := fs.String("bin", "", "directory with onceflow's binaries and the peer already built (default: build them into a temporary directory)")
	if err := fs.Parse(args); err != nil {
		return config{}, err
	}
	c := config{step: *step, warmup: *warmup, closed: *closed, idle: *idle, goal: *goal, search: *search,
		tenants: *tenants, accounts: *accounts, md: *md, png: *png, cpuprofile: *cpuprofile, bin: *bin, settings: settings}
	if c.cpuprofile != "" {
		// Absolute, so the profile lands where it was asked for whatever
		// directory the profiled process runs in.
		abs, err := filepath.Abs(c.cpuprofile)
		if err != nil {
			return config{}, err
		}
		c.cpuprofile = abs
	}
	for _, t := range strings.Split(*targets, ",") {
		switch t = strings.TrimSpace(t); t {
		case "dev", "split", "watermill", "noop":
			c.targets = append(c.targets, t)
			if t == "dev" && *split {
				c.targets = append(c.targets, "split")
			}
		case "":
		default:
			return config{}, fmt.Errorf("-targets: unknown target %q", t)
		}
	}
	for _, r := range strings.Split(*rates, ",") {
		v, err := strconv.ParseFloat(strings.TrimSpace(r), 64)
		if err != nil || v <= 0 {
			return config{}, fmt.Errorf("-rates: %q is not a positive rate", r)
		}
		c.rates = append(c.rates, v)
	}
	sort.Float64s(c.rates)
	for _, s := range strings.Split(*clients, ",") {
		v, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || v <= 0 {
			return config{}, fmt.Errorf("-clients: %q is not a positive count", s)
		}
		c.clients = append(c.clients, v)
	}
	if len(c.targets) == 0 || c.step <= 0 || c.closed <= 0 || c.tenants < 1 || c.accounts < c.tenants {
		return config{}, errors.New("want at least one target, positive -step and -closed, -tenants >= 1 and -accounts >= -tenants")
	}
	return c, nil
}

// report is a whole run.
type report struct {
	Started time.Time
	Load    string // /proc/loadavg at the start
	CPUs    int
	Go      string
	Command string
	Config  config
	Targets []targetReport
}

// targetReport is one system's figures.
type targetReport struct {
	Name, Label string
	Steps       []result // open loop, by rate
	Searched    map[float64]bool
	Closed      []result // one per client count
	Refused     int64    // ?wait= answered at once beyond ingest's bounds
	Load        string   // load average when it started
	Pressure    string   // CPU pressure (some, avg60) when it started
	Ceiling     result   // the no-op server's closed loop just before it
	Idle        result   // no load at all, for -idle
	Err         string   // it could not be measured
}

func run(ctx context.Context, args []string, getenv func(string) string, stdout io.Writer) error {
	rep, err := runReport(ctx, args, getenv, stdout)
	if err != nil {
		return err
	}
	for _, t := range rep.Targets {
		if t.Err != "" {
			return fmt.Errorf("%s: %s", t.Name, t.Err)
		}
	}
	return nil
}

// runReport runs the benchmark args ask for, prints its report to stdout
// and returns it.
func runReport(ctx context.Context, args []string, getenv func(string) string, stdout io.Writer) (*report, error) {
	c, err := parseFlags(args, stdout)
	if err != nil {
		return nil, err
	}
	dbURL := getenv("DATABASE_URL")
	if dbURL == "" {
		return nil, errors.New("DATABASE_URL: want the URL of a Postgres server on which the benchmark may create databases (source the environment, or make pg-up)")
	}
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "bench-e2e")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	c.dir = dir
	if c.bin == "" {
		c.bin = filepath.Join(dir, "bin")
		fmt.Fprintln(os.Stderr, "building onceflow's binaries and the Watermill peer")
		if err := e2e.Build(ctx, c.bin); err != nil {
			return nil, err
		}
		if err := buildPeer(ctx, c.bin); err != nil {
			return nil, err
		}
	}
	rep := &report{Started: time.Now().UTC(), Load: loadavg(), CPUs: runtime.NumCPU(), Go: runtime.Version(),
		Command: "bench-e2e " + strings.Join(args, " "), Config: c}
	e := env{bin: c.bin, dir: dir, databaseURL: dbURL, tenants: c.tenants, cpuprofile: c.cpuprofile, self: self, settings: c.settings}
	// The no-op server runs throughout when it is measured: just before
	// each system, the same clients measure its ceiling again, so a burst
	// of someone else's load on a shared machine shows next to the figures
	// it spoils.
	var ceiling *api
	for _, name := range c.targets {
		if name != "noop" {
			continue
		}
		sctx, cancel := context.WithTimeout(ctx, time.Minute)
		noop, err := startNoop(sctx, e)
		cancel()
		if err != nil {
			return nil, fmt.Errorf("no-op server: %w", err)
		}
		defer noop.Close()
		ceiling = newAPI(noop.Base, noop.Keys, 1)
	}
	for _, name := range c.targets {
		tr := measure(ctx, c, e, name, ceiling)
		rep.Targets = append(rep.Targets, tr)
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
	}
	md := rep.markdown()
	fmt.Fprint(stdout, md)
	if c.md != "" {
		if err := os.WriteFile(c.md, []byte(md), 0o644); err != nil {
			return nil, err
		}
	}
	if c.png != "" {
		if err := rep.plot(c.png); err != nil {
			return nil, fmt.Errorf("plot: %w", err)
		}
	}
	return rep, nil
}

// cpuPressure is the share of the last minute in which some runnable task
// waited for a CPU (/proc/pressure/cpu), "" if unknown.
func cpuPressure() string {
	b, err := os.ReadFile("/proc/pressure/cpu")
	if err != nil {
		return ""
	}
	for _, f := range strings.Fields(string(b)) {
		if v, ok := strings.CutPrefix(f, "avg60="); ok {
			return v + " %"
		}
	}
	return ""
}

func loadavg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "unknown"
	}
	return strings.Join(f[:3], " ")
}

// measure starts one target, runs every step against it and stops it.
func measure(ctx context.Context, c config, e env, name string, ceiling *api) targetReport {
	start := map[string]func(context.Context, env) (*target, error){
		"dev": startDev, "split": startSplit, "watermill": startWatermill, "noop": startNoop,
	}[name]
	tr := targetReport{Name: name, Searched: map[float64]bool{}, Load: loadavg(), Pressure: cpuPressure()}
	logf := func(f string, a ...any) {
		fmt.Fprintf(os.Stderr, "%s %s: %s\n", time.Now().Format("15:04:05"), name, fmt.Sprintf(f, a...))
	}
	logf("starting")
	sctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	t, err := start(sctx, e)
	cancel()
	if err != nil {
		tr.Err = err.Error()
		logf("%v", err)
		return tr
	}
	defer t.Close()
	tr.Label = t.Label
	a := newAPI(t.Base, t.Keys, max(1, c.accounts/c.tenants))
	if t.Ledger {
		logf("opening %d accounts", len(t.Keys)*a.accounts)
		if err := a.open(ctx); err != nil {
			tr.Err = "open accounts: " + err.Error()
			return tr
		}
	}
	if c.warmup > 0 {
		openLoop(ctx, c.rates[0], c.warmup, a.deposit)
	}
	if ceiling != nil && name != "noop" {
		tr.Ceiling = closedLoop(ctx, c.clients[0], c.closed/2, ceiling.deposit)
		logf("HTTP-only ceiling just before: %.0f/s", tr.Ceiling.Achieved)
	}
	step := func(r func() result) result {
		before, _ := scrape(ctx, t.Metrics)
		cpu0 := t.cpu(ctx)
		st0 := statementsSnapshot(ctx, t.dbURL)
		started := time.Now()
		res := r()
		res.Seconds = time.Since(started).Seconds()
		res.CPU = t.cpuBetween(cpu0, t.cpu(ctx), res.Seconds)
		res.Statements, res.StatementsErr = statementsBetween(st0, statementsSnapshot(ctx, t.dbURL))
		after, err := scrape(ctx, t.Metrics)
		if err == nil && before != nil {
			res.Stages = stagesBetween(stageMetrics, before, after)
			res.Work = stagesBetween(workMetrics, before, after)
		}
		res.Held = res.Errs == 0 && res.N > 0 && res.Visible.P99 <= ms(c.goal)
		time.Sleep(time.Second) // let the last step's stragglers settle
		return res
	}
	if c.idle > 0 {
		// What the system costs with nothing to do (pollers, heartbeats,
		// leases): the part of the bill no batching can spread.
		tr.Idle = step(func() result {
			select {
			case <-ctx.Done():
			case <-time.After(c.idle):
			}
			return result{}
		})
		logf("idle: %.3f cores (system), %.3f (its Postgres)", tr.Idle.CPU.System, tr.Idle.CPU.Postgres)
	}
	for _, n := range c.clients {
		res := step(func() result { return closedLoop(ctx, n, c.closed, a.deposit) })
		logf("closed loop, %d clients: %.0f/s, p99 %.1f ms, max %.1f ms, %d errors", n, res.Achieved, res.Visible.P99, res.Visible.Max, res.Errs)
		tr.Closed = append(tr.Closed, res)
	}
	for _, r := range c.rates {
		res := step(func() result { return openLoop(ctx, r, c.step, a.deposit) })
		logf("%.0f/s: p50 %.1f ms, p99 %.1f ms, p99.9 %.1f ms, %d errors", r, res.Visible.P50, res.Visible.P99, res.Visible.P999, res.Errs)
		tr.Steps = append(tr.Steps, res)
	}
	// The search: bisect between the highest rate that held and the
	// lowest that did not, or the closed-loop maximum (no rate above what
	// the system can do at all can hold).
	if t.Ledger && c.search > 0 {
		lo, hi := 0.0, 0.0
		for _, s := range tr.Steps {
			if s.Held {
				lo = s.Rate
			} else if hi == 0 && s.Rate > lo {
				hi = s.Rate
			}
		}
		if best := tr.bestClosed(); hi == 0 || (best.Achieved > 0 && best.Achieved*1.2 < hi) {
			hi = max(best.Achieved*1.2, lo*1.5)
		}
		for range c.search {
			mid := float64(int((lo+hi)/2/50+0.5) * 50)
			if mid <= lo || mid >= hi {
				break
			}
			res := step(func() result { return openLoop(ctx, mid, c.step, a.deposit) })
			logf("search %.0f/s: p99 %.1f ms (%v)", mid, res.Visible.P99, res.Held)
			tr.Steps = append(tr.Steps, res)
			tr.Searched[mid] = true
			if res.Held {
				lo = mid
			} else {
				hi = mid
			}
		}
		sort.Slice(tr.Steps, func(i, j int) bool { return tr.Steps[i].Rate < tr.Steps[j].Rate })
	}
	tr.Refused = a.refused.Load()
	return tr
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// benchRoot is the bench module's directory (this file's parent's).
func benchRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Dir(filepath.Dir(file))
}
