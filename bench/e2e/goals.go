package main

import (
	"cmp"
	"fmt"
	"math"
	"slices"
	"strings"
)

// The goals a run is held to (docs/benchmarks.md#the-goals-a-run-is-held-to):
// each one's figure in this run, whether it held and, where it did not,
// the line of the bill that stands in the way and what it would take.

const (
	goalClosedRate   = 4000.0 // commands/s in the best closed loop
	goalCeilingShare = 0.4    // of the HTTP-only ceiling's closed loop
	goalPeerRatio    = 3.0    // × the Watermill peer's closed loop, at no worse p99
	goalBillCPU      = 400.0  // µs of CPU per command, every process
	goalBillPostgres = 150.0  // µs of Postgres statements per command
)

// latencyGoals are the outcome latencies (p50, p99 ms) an open-loop rate
// must hold.
var latencyGoals = []struct{ rate, p50, p99 float64 }{{200, 8, 25}, {1000, 15, 60}}

// fullMachine is the share of the machine's cores above which a step is
// said to have had the machine full: its CPU, not its waits, set its pace.
const fullMachine = 0.9

// goalRow is one goal checked against a run.
type goalRow struct {
	Goal, Here string
	Missing    bool // the run had no step the goal is about (-rates)
	Held       bool
	Way        string // what stands in the way, when it did not hold
}

// goals checks t, an onceflow system, against every goal.
func (r *report) goals(t targetReport) []goalRow {
	rows := r.closedGoals(t)
	rows = append(rows, r.latencyGoalRows(t)...)
	return append(rows, r.billGoals(t)...)
}

// closedGoals checks t's best closed loop: its rate, against the HTTP-only
// server's and against the peer's.
func (r *report) closedGoals(t targetReport) []goalRow {
	best := t.bestClosed()
	closed := goalRow{
		Goal: fmt.Sprintf("closed loop ≥ %.0f/s", goalClosedRate),
		Here: fmt.Sprintf("%.0f/s (%d clients)", best.Achieved, best.Clients),
		Held: best.Achieved >= goalClosedRate,
	}
	closed.Way = closedWay(best, r.CPUs, goalClosedRate)
	rows := []goalRow{closed}

	// The ceiling measured just before the system, as the ratios take it;
	// what HTTP alone costs from the no-op server's own run, whose CPU the
	// bill measured.
	noop, hasNoop := r.target("noop")
	ceiling := t.Ceiling
	if ceiling.N == 0 && hasNoop {
		ceiling = noop.bestClosed()
	}
	if ceiling.N > 0 {
		share := best.Achieved / ceiling.Achieved
		row := goalRow{
			Goal: fmt.Sprintf("closed loop ≥ %.1f× the HTTP-only ceiling", goalCeilingShare),
			Here: fmt.Sprintf("%.2f× (%.0f/s of %.0f/s)", share, best.Achieved, ceiling.Achieved),
			Held: share >= goalCeilingShare,
			Way:  closedWay(best, r.CPUs, goalCeilingShare*ceiling.Achieved),
		}
		if hasNoop {
			nb := noop.bestClosed()
			row.Way = fmt.Sprintf("HTTP alone cost %.0f µs of CPU a request, load generator included; ", perOp(nb.CPU.total(), nb)) + row.Way
		}
		rows = append(rows, row)
	}
	if peer, ok := r.target("watermill"); ok {
		pb := peer.bestClosed()
		ratio := best.Achieved / pb.Achieved
		row := goalRow{
			Goal: fmt.Sprintf("closed loop ≥ %.0f× the Watermill peer's, p99 no worse", goalPeerRatio),
			Here: fmt.Sprintf("%.2f× (%.0f/s against %.0f/s), p99 %s ms against %s", ratio, best.Achieved, pb.Achieved, f1(best.Visible.P99), f1(pb.Visible.P99)),
			Held: ratio >= goalPeerRatio && best.Visible.P99 <= pb.Visible.P99,
		}
		switch {
		case ratio < goalPeerRatio:
			row.Way = closedWay(best, r.CPUs, goalPeerRatio*pb.Achieved)
		case !row.Held:
			row.Way = fmt.Sprintf("the p99 is %s ms over the peer's; ", f1(best.Visible.P99-pb.Visible.P99)) + latencyWay(best, r.CPUs, "p99")
		}
		rows = append(rows, row)
	}
	return rows
}

// latencyGoalRows checks the outcome latency at each rate of latencyGoals.
func (r *report) latencyGoalRows(t targetReport) []goalRow {
	var rows []goalRow
	for _, g := range latencyGoals {
		row := goalRow{Goal: fmt.Sprintf("at %.0f/s: p50 ≤ %.0f ms, p99 ≤ %.0f ms", g.rate, g.p50, g.p99)}
		s, ok := t.at(g.rate)
		if !ok {
			row.Here, row.Missing = "not measured (-rates)", true
			rows = append(rows, row)
			continue
		}
		row.Here = fmt.Sprintf("%s / %s ms", f1(s.Visible.P50), f1(s.Visible.P99))
		if s.Errs > 0 {
			row.Here += fmt.Sprintf(", %d errors", s.Errs)
		}
		row.Held = s.Errs == 0 && s.Visible.P50 <= g.p50 && s.Visible.P99 <= g.p99
		switch {
		case s.Visible.P50 > g.p50:
			row.Way = fmt.Sprintf("the p50 is %s ms over; ", f1(s.Visible.P50-g.p50)) + latencyWay(s, r.CPUs, "p50")
		case s.Visible.P99 > g.p99:
			row.Way = fmt.Sprintf("the p99 is %s ms over; ", f1(s.Visible.P99-g.p99)) + latencyWay(s, r.CPUs, "p99")
		default:
			row.Way = "errors: " + s.FirstErr
		}
		rows = append(rows, row)
	}
	return rows
}

// billGoals checks the bill at every step that kept up.
func (r *report) billGoals(t targetReport) []goalRow {
	// An overloaded step's batches are a queue's, not a price.
	var steps []billStep
	var overloaded []string
	for _, s := range t.billSteps(r.Config.rates) {
		if s.res.Errs > 0 || s.res.Visible.Max > 1000 {
			overloaded = append(overloaded, s.kind)
			continue
		}
		steps = append(steps, s)
	}
	if len(steps) == 0 {
		return nil
	}
	left := ""
	if len(overloaded) > 0 {
		left = fmt.Sprintf(" (left out, overloaded: an outcome past 1 s or an error: %s)", strings.Join(overloaded, ", "))
	}
	cpu := goalRow{Goal: fmt.Sprintf("the bill: CPU ≤ %.0f µs a command", goalBillCPU), Held: true}
	var figures []string
	cheapest := steps[0]
	for _, s := range steps {
		v := perOp(s.res.CPU.total(), s.res)
		figures = append(figures, fmt.Sprintf("%s %.0f", s.kind, v))
		cpu.Held = cpu.Held && v <= goalBillCPU
		if v < perOp(cheapest.res.CPU.total(), cheapest.res) {
			cheapest = s
		}
	}
	cpu.Here = strings.Join(figures, "; ") + left
	cpu.Way = fmt.Sprintf("at its cheapest (%s): %s. %s", cheapest.kind, largestLines(cheapest.res, 3), batchesWay(steps))
	rows := []goalRow{cpu}

	pg := goalRow{Goal: fmt.Sprintf("the bill: Postgres statements ≤ %.0f µs a command", goalBillPostgres), Held: true}
	figures = nil
	cheapest = billStep{}
	cheapestV := math.Inf(1)
	for _, s := range steps {
		if s.res.StatementsErr != "" {
			pg.Held = false
			figures = append(figures, s.kind+" unknown ("+firstLine(s.res.StatementsErr)+")")
			continue
		}
		ms, _, _ := stmtTime(s.res.Statements)
		v := ms * 1000 / float64(max(s.res.N, 1))
		figures = append(figures, fmt.Sprintf("%s %.0f", s.kind, v))
		pg.Held = pg.Held && v <= goalBillPostgres
		if v < cheapestV {
			cheapest, cheapestV = s, v
		}
	}
	pg.Here = strings.Join(figures, "; ") + left
	if cheapest.res.N > 0 {
		pg.Way = fmt.Sprintf("at its cheapest (%s), the statements that took the most: %s", cheapest.kind, dearestStatements(cheapest.res, 3))
	}
	return append(rows, pg)
}

// closedWay says what keeps a closed loop, best, below rate on cpus
// cores: the machine's CPU per command when the machine was full, the
// stages' waits when it was not.
func closedWay(best result, cpus int, rate float64) string {
	if best.CPU.Machine < fullMachine*float64(cpus) {
		return fmt.Sprintf("not the CPU (the machine used %.2f of its %d cores): %s", best.CPU.Machine, cpus, latencyWay(best, cpus, "p50"))
	}
	spent := perOp(best.CPU.Machine, best)
	budget := float64(cpus) * 1e6 / rate
	return fmt.Sprintf("the bill: the machine spent %.0f µs of CPU a command, and %.0f/s on %d cores leaves %.0f (%.0f %% less); its largest lines: %s",
		spent, rate, cpus, budget, 100*(1-budget/spent), largestLines(best, 3))
}

// largestLines are a step's n largest lines of CPU per command: the load
// generator, each of the system's processes, its Postgres backends.
func largestLines(s result, n int) string {
	type line struct {
		name string
		us   float64
	}
	lines := []line{{"load generator", perOp(s.CPU.Load, s)}, {"Postgres backends", perOp(s.CPU.Postgres, s)}}
	for _, p := range s.CPU.Procs {
		lines = append(lines, line{p.Name, perOp(p.Cores, s)})
	}
	slices.SortStableFunc(lines, func(a, b line) int { return cmp.Compare(b.us, a.us) })
	var out []string
	for _, l := range lines[:min(n, len(lines))] {
		out = append(out, fmt.Sprintf("%s %.0f µs", l.name, l.us))
	}
	return strings.Join(out, ", ")
}

// workOf maps each stage to the unit of work that finishes it.
var workOf = map[string]string{
	"accepted": "ingest accept batch", "shipped": "relay publish",
	"decided": "processor batch", "projected": "projector batch",
}

// latencyWay names the step of a command's way that took the most of its
// outcome latency in s at quantile q ("p50" or "p99": the differences of
// the stages' ages at q), with that stage's batches: how many commands
// each carried and how long it took.
func latencyWay(s result, cpus int, q string) string {
	at := func(l latencies) float64 { return l.P50 }
	ageAt := func(st stage) float64 { return st.P50 }
	if q == "p99" {
		at = func(l latencies) float64 { return l.P99 }
		ageAt = func(st stage) float64 { return st.P99 }
	}
	prefix := ""
	if s.CPU.Machine >= fullMachine*float64(cpus) {
		prefix = fmt.Sprintf("the machine was full (%.2f of %d cores, %.0f µs of CPU a command); ", s.CPU.Machine, cpus, perOp(s.CPU.Machine, s))
	}
	ages := map[string]float64{}
	for _, st := range s.Stages {
		if st.Count > 0 {
			ages[st.Name] = ageAt(st)
		}
	}
	if len(ages) < len(stageMetrics) {
		return prefix + "no stages' ages in this step"
	}
	prev, name, widest := 0.0, "", -1.0
	for _, m := range stageMetrics {
		if d := ages[m.name] - prev; d > widest {
			name, widest = m.name, d
		}
		prev = ages[m.name]
	}
	if d := at(s.Visible) - prev; d > widest {
		return prefix + fmt.Sprintf("the outcome read: %s of %s ms at %s after the projector's commit", f1(d), f1(at(s.Visible)), q)
	}
	out := prefix + fmt.Sprintf("%s: %s of %s ms at %s (%s)", name, f1(widest), f1(at(s.Visible)), q, stageSpan[name])
	for _, w := range s.Work {
		if w.Name == workOf[name] && w.Count > 0 {
			out += fmt.Sprintf(", in %s of %.1f commands each, %s ms mean", w.Name+"es", float64(s.N)/w.Count, f1(w.Mean))
		}
	}
	return out
}

// stageSpan says which part of a command's way each stage's age adds.
var stageSpan = map[string]string{
	"accepted":  "the request to ingest's commit",
	"shipped":   "ingest's commit to the relay's acknowledgement",
	"decided":   "the relay's acknowledgement to the processor's commit",
	"projected": "the processor's commit to the projector's",
}

// batchesWay says how many commands each stage's batch carried at the
// open-loop steps: at a low rate every command pays a batch's price alone.
func batchesWay(steps []billStep) string {
	var out []string
	for _, s := range steps {
		if s.res.Clients > 0 || s.res.N == 0 {
			continue
		}
		var per []string
		for _, m := range workMetrics {
			for _, w := range s.res.Work {
				if w.Name == m.name && w.Count > 0 && m.name != "processor commit" {
					per = append(per, fmt.Sprintf("%s %.1f", strings.TrimSuffix(m.name, " batch"), float64(s.res.N)/w.Count))
				}
			}
		}
		if len(per) > 0 {
			out = append(out, fmt.Sprintf("at %s, %.0f µs: commands per batch %s", s.kind, perOp(s.res.CPU.total(), s.res), strings.Join(per, ", ")))
		}
	}
	if len(out) == 0 {
		return ""
	}
	return strings.Join(out, "; ") + " (each batch's fixed price is shared by that many commands)"
}

// dearestStatements are the n statements of s that took the most time per
// command, with their calls per command.
func dearestStatements(s result, n int) string {
	var out []string
	per := float64(max(s.N, 1))
	for _, st := range s.Statements[:min(n, len(s.Statements))] { // the most time first
		out = append(out, fmt.Sprintf("`%s` %.0f µs (%.2f calls)", shortQuery(st.Query, 60), (st.Exec+st.Plan)*1000/per, float64(st.Calls)/per))
	}
	return strings.Join(out, ", ")
}

// goalsTable writes t's goals as a table.
func (r *report) goalsTable(b *strings.Builder, t targetReport) {
	fmt.Fprintf(b, "\n%s against the goals (docs/benchmarks.md, \"The goals a run is held to\"):\n\n| goal | this run | held | what stands in the way |\n|---|---|---|---|\n", t.Label)
	for _, g := range r.goals(t) {
		held, way := "no", g.Way
		switch {
		case g.Missing:
			held, way = "–", ""
		case g.Held:
			held, way = "yes", ""
		}
		fmt.Fprintf(b, "| %s | %s | %s | %s |\n", g.Goal, g.Here, held, strings.ReplaceAll(way, "|", "¦"))
	}
}
