package main

import (
	"strings"
	"testing"
)

// TestGoals checks each goal against a run whose figures are known: which
// hold, and what the table says stands in the way of those that do not.
func TestGoals(t *testing.T) {
	ages := func(accepted, shipped, decided, projected float64) []stage {
		return []stage{{Name: "accepted", Count: 1, P50: accepted}, {Name: "shipped", Count: 1, P50: shipped},
			{Name: "decided", Count: 1, P50: decided}, {Name: "projected", Count: 1, P50: projected}}
	}
	// 20,000 commands over 10 s on a full machine (1.95 of 2 cores):
	// 975 µs of CPU a command, of which onceflow dev 450, Postgres 400.
	closed := result{Clients: 256, Achieved: 2000, N: 20000, Seconds: 10,
		CPU:     cpuUse{Load: 0.2, System: 0.9, Postgres: 0.8, Machine: 1.95, Procs: []procUse{{"onceflow dev", 0.9}}},
		Visible: latencies{P50: 20, P99: 50}, Stages: ages(1, 3, 6, 10),
		Statements: []statement{{Query: "SELECT onceflow_accept($1)", Calls: 4000, Exec: 2000}, {Query: "SELECT 1", Calls: 20000, Exec: 200}}}
	low := result{Rate: 200, Achieved: 200, N: 2000, Seconds: 10,
		CPU:     cpuUse{Load: 0.1, System: 0.5, Postgres: 0.5, Machine: 1.2, Procs: []procUse{{"onceflow dev", 0.5}}},
		Visible: latencies{P50: 5, P99: 20}, Stages: ages(1, 2, 3, 4.5),
		Statements: []statement{{Query: "SELECT onceflow_accept($1)", Calls: 2000, Exec: 3000}}}
	// At 1,000/s the processor takes 25 of the 40 ms, in batches of 4
	// commands (2,500 batches for 10,000 commands).
	high := result{Rate: 1000, Achieved: 1000, N: 10000, Seconds: 10,
		CPU:     cpuUse{Load: 0.2, System: 0.8, Postgres: 0.6, Machine: 1.7, Procs: []procUse{{"onceflow dev", 0.8}}},
		Visible: latencies{P50: 40, P99: 90}, Stages: ages(2, 5, 30, 35),
		Work:       []stage{{Name: "processor batch", Count: 2500, Mean: 3}},
		Statements: []statement{{Query: "SELECT onceflow_accept($1)", Calls: 5000, Exec: 4000}}}
	// At 2,000/s a queue: outcomes 5 s late, batches of hundreds. Its bill
	// is no price, and the bill's goals leave it out.
	queue := result{Rate: 2000, Achieved: 1500, N: 15000, Seconds: 10, CPU: cpuUse{Load: 0.01, System: 0.01},
		Visible: latencies{P50: 3000, P99: 5000, Max: 5200}, Stages: ages(2, 5, 30, 35)}
	dev := targetReport{Name: "dev", Label: "onceflow dev", Closed: []result{closed}, Steps: []result{low, high, queue}}
	noop := targetReport{Name: "noop", Label: "HTTP only", Closed: []result{{Clients: 64, Achieved: 10000, N: 100000, Seconds: 10, CPU: cpuUse{Load: 0.9, System: 0.8, Machine: 1.9}}}}
	peer := targetReport{Name: "watermill", Label: "Watermill peer", Closed: []result{{Clients: 64, Achieved: 500, N: 5000, Seconds: 10, Visible: latencies{P99: 100}}}}
	r := &report{CPUs: 2, Config: config{rates: []float64{200, 1000, 2000}}, Targets: []targetReport{dev, peer, noop}}

	rows := r.goals(dev)
	want := []struct {
		goal string
		held bool
		way  []string
	}{
		{"closed loop ≥ 4000/s", false, []string{"the machine spent 975 µs of CPU a command", "leaves 500 (49 % less)", "onceflow dev 450 µs, Postgres backends 400 µs, load generator 100 µs"}},
		{"closed loop ≥ 0.4× the HTTP-only ceiling", false, []string{"HTTP alone cost 170 µs of CPU a request", "4000/s on 2 cores leaves 500"}},
		{"closed loop ≥ 3× the Watermill peer's, p99 no worse", true, nil},
		{"at 200/s: p50 ≤ 8 ms, p99 ≤ 25 ms", true, nil},
		{"at 1000/s: p50 ≤ 15 ms, p99 ≤ 60 ms", false, []string{"the p50 is 25.0 ms over; decided: 25.0 of 40.0 ms at p50", "processor batches of 4.0 commands each, 3.0 ms mean"}},
		{"the bill: CPU ≤ 400 µs a command", false, []string{"at its cheapest (closed, 256 clients)", "commands per batch processor 4.0"}},
		{"the bill: Postgres statements ≤ 150 µs a command", false, []string{"at its cheapest (closed, 256 clients)", "`SELECT onceflow_accept($1)` 100 µs (0.20 calls)"}},
	}
	if len(rows) != len(want) {
		t.Fatalf("got %d goals, want %d: %+v", len(rows), len(want), rows)
	}
	if cpu := rows[5].Here; cpu != "closed, 256 clients 950; 200/s 5500; 1000/s 1600 (left out, overloaded: an outcome past 1 s or an error: 2000/s)" {
		t.Errorf("the bill's CPU per command at each step: %s", cpu)
	}
	for i, w := range want {
		g := rows[i]
		if g.Goal != w.goal || g.Held != w.held {
			t.Errorf("goal %d: got %q held %v, want %q held %v (%+v)", i, g.Goal, g.Held, w.goal, w.held, g)
		}
		for _, s := range w.way {
			if !strings.Contains(g.Way, s) {
				t.Errorf("%s: what stands in the way lacks %q: %s", g.Goal, s, g.Way)
			}
		}
	}

	// A p50 held and a p99 not: the way is told at the p99.
	dev.Steps[0].Visible.P99 = 30
	for i, p99 := range []float64{2, 4, 6, 25} {
		dev.Steps[0].Stages[i].P99 = p99
	}
	if g := r.goals(dev)[3]; g.Held || !strings.HasPrefix(g.Way, "the p99 is 5.0 ms over; projected: 19.0 of 30.0 ms at p99") {
		t.Errorf("200/s with its p99 over the goal: held %v, %s", g.Held, g.Way)
	}

	// A run without the 1,000/s step says so, and holds it neither way.
	noHigh := dev
	noHigh.Steps = []result{dev.Steps[0], queue}
	if g := r.goals(noHigh)[4]; !g.Missing || g.Here != "not measured (-rates)" {
		t.Errorf("1,000/s not run: %+v", g)
	}
	var b strings.Builder
	r.goalsTable(&b, noHigh)
	if !strings.Contains(b.String(), "| at 1000/s: p50 ≤ 15 ms, p99 ≤ 60 ms | not measured (-rates) | – |  |") {
		t.Errorf("the table's row for a rate not run:\n%s", b.String())
	}

	// A closed loop that left the machine half idle was held back by its
	// waits, not by the CPU, and the table says which step of the way:
	// here the outcome read, 10 of its 20 ms after the projector (at 10).
	dev.Closed[0].CPU.Machine = 1.0
	if way := r.goals(dev)[0].Way; !strings.HasPrefix(way, "not the CPU (the machine used 1.00 of its 2 cores): the outcome read: 10.0 of 20.0 ms") {
		t.Errorf("closed loop on a half-idle machine: %s", way)
	}
}
