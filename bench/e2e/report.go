package main

import (
	"fmt"
	"image/color"
	"math"
	"strconv"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
)

// bestClosed is the closed-loop run with the highest rate among those
// whose read models stayed within 1 s (every outcome visible within 1 s of
// its request), or the fastest run if none did.
func (t targetReport) bestClosed() result {
	var best, fastest result
	for _, r := range t.Closed {
		if r.Errs == 0 && r.Visible.Max <= 1000 && r.Achieved > best.Achieved {
			best = r
		}
		if r.Achieved > fastest.Achieved {
			fastest = r
		}
	}
	if best.N == 0 {
		return fastest
	}
	return best
}

// highestHeld is the highest open-loop rate that held the goal (0: none).
func (t targetReport) highestHeld() float64 {
	h := 0.0
	for _, s := range t.Steps {
		if s.Held && s.Rate > h {
			h = s.Rate
		}
	}
	return h
}

// at is the open-loop step at rate, if there is one.
func (t targetReport) at(rate float64) (result, bool) {
	for _, s := range t.Steps {
		if s.Rate == rate {
			return s, true
		}
	}
	return result{}, false
}

func (r *report) target(name string) (targetReport, bool) {
	for _, t := range r.Targets {
		if t.Name == name && t.Err == "" {
			return t, true
		}
	}
	return targetReport{}, false
}

func f1(v float64) string {
	switch {
	case math.IsNaN(v):
		return "–"
	case v >= 100:
		return fmt.Sprintf("%.0f", v)
	default:
		return fmt.Sprintf("%.1f", v)
	}
}

func (r *report) markdown() string {
	var b strings.Builder
	c := r.Config
	fmt.Fprintf(&b, "bench-e2e at %s UTC; %d CPUs, load average %s at the start; %s\n\n",
		r.Started.Format("2006-01-02 15:04"), r.CPUs, r.Load, r.Go)
	fmt.Fprintf(&b, "Operation: POST a deposit, then GET its outcome with ?wait=, both over HTTP from this process; "+
		"latency from the time the operation was due (open loop) to its outcome visible. %d tenants, %d accounts; "+
		"open-loop steps of %s, closed-loop runs of %s; goal p99 <= %s.\n\n",
		c.tenants, c.accounts, c.step, c.closed, c.goal)
	r.summary(&b)
	b.WriteString("\n")
	r.ratios(&b)
	for _, t := range r.Targets {
		if t.Err == "" && (t.Name == "dev" || t.Name == "split") {
			r.goalsTable(&b, t)
		}
	}
	for _, t := range r.Targets {
		if t.Err == "" {
			t.steps(&b)
			t.bill(&b, c.rates)
		}
	}
	return b.String()
}

// summary is the table of every system: its ceiling, the highest rate it
// held, its closed-loop maximum and its latencies at each rate.
func (r *report) summary(b *strings.Builder) {
	c := r.Config
	b.WriteString("| system | load avg, CPU pressure at its start | HTTP-only ceiling just before | highest rate with p99 <= goal | closed-loop max (clients, p99, max) |")
	for _, rate := range c.rates {
		fmt.Fprintf(b, " %.0f/s p50 / p99 / p99.9 ms |", rate)
	}
	b.WriteString("\n|---|---|---|---|---|")
	for range c.rates {
		b.WriteString("---|")
	}
	b.WriteString("\n")
	for _, t := range r.Targets {
		if t.Err != "" {
			fmt.Fprintf(b, "| %s | failed: %s |\n", t.Name, t.Err)
			continue
		}
		best := t.bestClosed()
		held := "none"
		if h := t.highestHeld(); h > 0 {
			held = fmt.Sprintf("%.0f/s", h)
		}
		if t.Name == "noop" {
			held = "(not searched)"
		}
		ceil := "–"
		if t.Ceiling.N > 0 {
			ceil = fmt.Sprintf("%.0f/s", t.Ceiling.Achieved)
		}
		fmt.Fprintf(b, "| %s | %s, %s | %s | %s | %.0f/s (%d, %s ms, %s ms) |", t.Label, t.Load, t.Pressure, ceil, held, best.Achieved, best.Clients, f1(best.Visible.P99), f1(best.Visible.Max))
		for _, rate := range c.rates {
			if s, ok := t.at(rate); ok {
				fmt.Fprintf(b, " %s / %s / %s |", f1(s.Visible.P50), f1(s.Visible.P99), f1(s.Visible.P999))
			} else {
				b.WriteString(" – |")
			}
		}
		b.WriteString("\n")
	}
}

// steps is one system's every step, with its stages and units of work
// when it is onceflow, its refused reads and its first error.
func (t targetReport) steps(b *strings.Builder) {
	fmt.Fprintf(b, "\n%s, every step (latencies in ms; stages: a command's age when each stage finished with it, p50/p99, from /metrics over the step):\n\n", t.Label)
	b.WriteString("| step | rate /s | achieved /s | n | errors | cores: load gen / system / its Postgres / machine | 202 p50 / p99 | outcome p50 / p99 / p99.9 / max |")
	stages := t.Name == "dev" || t.Name == "split"
	if stages {
		for _, s := range stageMetrics {
			fmt.Fprintf(b, " %s |", s.name)
		}
	}
	b.WriteString("\n|---|---|---|---|---|---|---|---|")
	if stages {
		b.WriteString(strings.Repeat("---|", len(stageMetrics)))
	}
	b.WriteString("\n")
	for _, s := range t.Closed {
		stepRow(b, fmt.Sprintf("closed, %d clients", s.Clients), s, stages)
	}
	for _, s := range t.Steps {
		kind := "open"
		if t.Searched[s.Rate] {
			kind = "open (search)"
		}
		stepRow(b, kind, s, stages)
	}
	if stages {
		t.work(b)
	}
	if t.Refused > 0 {
		fmt.Fprintf(b, "\n%d outcome reads were answered at once beyond ingest's bound on waits and read again.\n", t.Refused)
	}
	for _, s := range append(append([]result{}, t.Closed...), t.Steps...) {
		if s.FirstErr != "" {
			fmt.Fprintf(b, "\nFirst error at %.0f/s: %s\n", s.Rate, s.FirstErr)
			break
		}
	}
}

// stepRow is one step's row, with its stages' ages when it has them.
func stepRow(b *strings.Builder, kind string, s result, stages bool) {
	fmt.Fprintf(b, "| %s | %.0f | %.0f | %d | %d | %.2f / %.2f / %.2f / %.2f | %s / %s | %s / %s / %s / %s |", kind, s.Rate, s.Achieved, s.N, s.Errs,
		s.CPU.Load, s.CPU.System, s.CPU.Postgres, s.CPU.Machine,
		f1(s.Accepted.P50), f1(s.Accepted.P99), f1(s.Visible.P50), f1(s.Visible.P99), f1(s.Visible.P999), f1(s.Visible.Max))
	if stages {
		for _, m := range stageMetrics {
			cell := " – |"
			for _, st := range s.Stages {
				if st.Name == m.name && st.Count > 0 {
					cell = fmt.Sprintf(" %s / %s |", f1(st.P50), f1(st.P99))
				}
			}
			b.WriteString(cell)
		}
	}
	b.WriteString("\n")
}

// work is onceflow's units of work per step, per stage.
func (t targetReport) work(b *strings.Builder) {
	fmt.Fprintf(b, "\n%s, each stage's units of work per step: per second, mean / p99 ms:\n\n| step | rate /s |", t.Label)
	for _, m := range workMetrics {
		fmt.Fprintf(b, " %s |", m.name)
	}
	b.WriteString("\n|---|---|" + strings.Repeat("---|", len(workMetrics)) + "\n")
	for _, s := range append(append([]result{}, t.Closed...), t.Steps...) {
		kind := "open"
		if s.Clients > 0 {
			kind = fmt.Sprintf("closed, %d clients", s.Clients)
		}
		fmt.Fprintf(b, "| %s | %.0f |", kind, s.Rate)
		for _, m := range workMetrics {
			cell := " – |"
			for _, w := range s.Work {
				if w.Name == m.name && w.Count > 0 && s.Seconds > 0 {
					cell = fmt.Sprintf(" %.0f/s · %s / %s |", w.Count/s.Seconds, f1(w.Mean), f1(w.P99))
				}
			}
			b.WriteString(cell)
		}
		b.WriteString("\n")
	}
}

// ratios compares onceflow with the peer and with the no-op ceiling.
func (r *report) ratios(b *strings.Builder) {
	noop, hasNoop := r.target("noop")
	peer, hasPeer := r.target("watermill")
	for _, name := range []string{"dev", "split"} {
		t, ok := r.target(name)
		if !ok {
			continue
		}
		best := t.bestClosed()
		if hasPeer {
			pb := peer.bestClosed()
			fmt.Fprintf(b, "- %s against the Watermill peer: closed-loop throughput %.2f×, highest rate holding the goal %s;", t.Label,
				best.Achieved/pb.Achieved, ratio(t.highestHeld(), peer.highestHeld()))
			for _, rate := range r.Config.rates {
				s, ok1 := t.at(rate)
				p, ok2 := peer.at(rate)
				if ok1 && ok2 {
					fmt.Fprintf(b, " p99 at %.0f/s %.2f× the peer's;", rate, s.Visible.P99/p.Visible.P99)
				}
			}
			b.WriteString("\n")
		}
		if hasNoop {
			nb := noop.bestClosed()
			fmt.Fprintf(b, "- %s's bill in its best closed loop (%.0f/s): %.0f µs of CPU per command (its processes %.0f, its Postgres %.0f, the load generator %.0f), against %.0f µs for HTTP alone (the no-op server's best closed loop, load generator included).\n",
				t.Label, best.Achieved, perOp(best.CPU.total(), best), perOp(best.CPU.System, best), perOp(best.CPU.Postgres+best.CPU.PostgresBackground, best), perOp(best.CPU.Load, best),
				perOp(nb.CPU.total(), nb))
			fmt.Fprintf(b, "- %s against the HTTP-only ceiling: %.2f× its closed-loop throughput (%.0f/s of %.0f/s in its own run)",
				t.Label, best.Achieved/noop.bestClosed().Achieved, best.Achieved, noop.bestClosed().Achieved)
			if t.Ceiling.N > 0 {
				fmt.Fprintf(b, ", %.2f× the ceiling measured just before it (%.0f/s, %d clients)", best.Achieved/t.Ceiling.Achieved, t.Ceiling.Achieved, t.Ceiling.Clients)
			}
			b.WriteString(".\n")
		}
	}
}

func ratio(a, b float64) string {
	if b == 0 {
		if a == 0 {
			return "neither held it"
		}
		return "the peer held no rate"
	}
	return fmt.Sprintf("%.2f×", a/b)
}

// plot draws each system's outcome latency (p50 solid, p99 dashed)
// against the open-loop rate, on a log scale.
func (r *report) plot(path string) error {
	p := plot.New()
	p.Title.Text = fmt.Sprintf("POST -> outcome visible, open loop (%s, %d CPUs, load %s)", r.Started.Format("2006-01-02 15:04 UTC"), r.CPUs, r.Load)
	p.X.Label.Text = "rate (operations/s, log scale)"
	p.X.Scale = plot.LogScale{}
	p.X.Tick.Marker = decadeTicks{}
	p.Y.Label.Text = "latency (ms, log scale)"
	p.Y.Scale = plot.LogScale{}
	p.Y.Tick.Marker = decadeTicks{}
	p.Y.Min = 0.5
	p.Legend.Top = true
	p.Legend.Left = true
	p.Legend.XOffs = vg.Points(40)
	p.Add(plotter.NewGrid())
	colors := map[string]color.RGBA{
		"dev": {R: 0x1f, G: 0x77, B: 0xb4, A: 255}, "split": {R: 0x2c, G: 0xa0, B: 0x2c, A: 255},
		"watermill": {R: 0xd6, G: 0x27, B: 0x28, A: 255}, "noop": {R: 0x7f, G: 0x7f, B: 0x7f, A: 255},
	}
	for _, t := range r.Targets {
		if t.Err != "" || len(t.Steps) == 0 {
			continue
		}
		for qi, q := range []struct {
			name string
			get  func(latencies) float64
		}{{"p50", func(l latencies) float64 { return l.P50 }}, {"p99", func(l latencies) float64 { return l.P99 }}} {
			var pts plotter.XYs
			for _, s := range t.Steps {
				if s.N > s.Errs {
					pts = append(pts, plotter.XY{X: s.Rate, Y: math.Max(q.get(s.Visible), 0.5)})
				}
			}
			if len(pts) == 0 {
				continue
			}
			line, points, err := plotter.NewLinePoints(pts)
			if err != nil {
				return err
			}
			line.Color, points.Color = colors[t.Name], colors[t.Name]
			line.Width = vg.Points(1.5)
			points.Shape = draw.CircleGlyph{}
			if qi == 1 {
				line.Dashes = []vg.Length{vg.Points(5), vg.Points(3)}
				points.Shape = draw.TriangleGlyph{}
			}
			p.Add(line, points)
			p.Legend.Add(t.Label+" "+q.name, line, points)
		}
	}
	if g := r.Config.goal; g > 0 {
		goal := plotter.NewFunction(func(float64) float64 { return ms(g) })
		goal.Dashes = []vg.Length{vg.Points(2), vg.Points(2)}
		goal.Color = color.RGBA{A: 128}
		p.Add(goal)
		p.Legend.Add(fmt.Sprintf("goal p99 %s", g), goal)
	}
	return p.Save(9*vg.Inch, 5.5*vg.Inch, path)
}

// decadeTicks marks 1, 2 and 5 of each decade.
type decadeTicks struct{}

func (decadeTicks) Ticks(lo, hi float64) []plot.Tick {
	var ticks []plot.Tick
	for d := 0.1; d <= hi*10; d *= 10 {
		for _, m := range []float64{1, 2, 5} {
			v := d * m
			if v < lo || v > hi {
				continue
			}
			ticks = append(ticks, plot.Tick{Value: v, Label: strconv.FormatFloat(v, 'f', -1, 64)})
		}
	}
	return ticks
}
