package main

import (
	"cmp"
	"context"
	"fmt"
	"sort"
	"strings"

	"github.com/jackc/pgx/v5"
)

// The bill: what one operation (a command: its POST and its outcome read)
// costs each process, and each Postgres statement, over a step
// (docs/benchmarks.md#the-bill-cpu-per-command).

// statement is one normalized statement's figures in pg_stat_statements:
// calls, and milliseconds executing and planning it.
type statement struct {
	Query      string
	Calls      int64
	Exec, Plan float64 // ms
	Rows       int64
	key        string // userid/queryid
}

// statements is a snapshot of the target database's statements, by key;
// nil when pg_stat_statements cannot be read (Err says why).
type statements struct {
	byKey map[string]statement
	Err   string
}

// setupStatements creates pg_stat_statements in the target's database, so
// its view can be read there. On a server that does not load it
// (shared_preload_libraries) the view cannot be read and the bill leaves
// the statements out, saying why.
func setupStatements(ctx context.Context, dbURL string) error {
	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	_, err = conn.Exec(ctx, `CREATE EXTENSION IF NOT EXISTS pg_stat_statements`)
	return err
}

// noDatabase is the statements of a target that uses no database (the
// no-op server).
const noDatabase = "no database"

// statementsSnapshot reads every top-level statement pg_stat_statements
// holds for the database at dbURL, leaving out its own reads of the view.
func statementsSnapshot(ctx context.Context, dbURL string) statements {
	if dbURL == "" {
		return statements{Err: noDatabase}
	}
	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		return statements{Err: err.Error()}
	}
	defer conn.Close(ctx)
	rows, err := conn.Query(ctx, `SELECT userid::text || '/' || queryid::text, query, calls, total_exec_time, total_plan_time, rows
		FROM pg_stat_statements
		WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database()) AND toplevel
		  AND query NOT LIKE '%pg_stat_statements%' AND query NOT LIKE '%pg_stat_activity%'`)
	if err != nil {
		return statements{Err: err.Error()}
	}
	s := statements{byKey: map[string]statement{}}
	for rows.Next() {
		var st statement
		if err := rows.Scan(&st.key, &st.Query, &st.Calls, &st.Exec, &st.Plan, &st.Rows); err != nil {
			return statements{Err: err.Error()}
		}
		s.byKey[st.key] = st
	}
	if err := rows.Err(); err != nil {
		return statements{Err: err.Error()}
	}
	return s
}

// statementsBetween is what each statement did between two snapshots,
// the most time first. A statement evicted in between is left out.
func statementsBetween(a, b statements) ([]statement, string) {
	if b.Err != "" {
		return nil, b.Err
	}
	if a.Err != "" {
		return nil, a.Err
	}
	var out []statement
	for k, v := range b.byKey {
		w := a.byKey[k]
		d := statement{Query: v.Query, key: k, Calls: v.Calls - w.Calls, Exec: v.Exec - w.Exec, Plan: v.Plan - w.Plan, Rows: v.Rows - w.Rows}
		if d.Calls > 0 {
			out = append(out, d)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Exec+out[i].Plan > out[j].Exec+out[j].Plan })
	return out, ""
}

// billStep is a step's bill per operation.
type billStep struct {
	res  result
	kind string
}

// perOp is µs per operation of cores used over a step.
func perOp(cores float64, s result) float64 {
	if s.N == 0 {
		return 0
	}
	return cores * s.Seconds * 1e6 / float64(s.N)
}

// total is every measured process's CPU: the load generator, the system,
// its Postgres backends and the cluster's background processes.
func (u cpuUse) total() float64 { return u.Load + u.System + u.Postgres + u.PostgresBackground }

// postgresCell is the Postgres backends' µs per operation, followed, when
// the target's connections carry more than one name (the 5 processes),
// by each name's share: "1590 (ingest 700, relay 400, ...)".
func postgresCell(u cpuUse, s result) string {
	cell := fmt.Sprintf("%.0f", perOp(u.Postgres, s))
	if len(u.PostgresBy) < 2 {
		return cell
	}
	var parts []string
	for _, p := range u.PostgresBy {
		parts = append(parts, fmt.Sprintf("%s %.0f", cmp.Or(p.Name, "unnamed"), perOp(p.Cores, s)))
	}
	return cell + " (" + strings.Join(parts, ", ") + ")"
}

// stmtTime is the statements' time in a step, ms, and their calls.
func stmtTime(sts []statement) (ms, plan float64, calls int64) {
	for _, st := range sts {
		ms += st.Exec + st.Plan
		plan += st.Plan
		calls += st.Calls
	}
	return ms, plan, calls
}

// billSteps are the steps the bill shows: each closed-loop run and each
// open-loop rate asked for (not the search's).
func (t targetReport) billSteps(rates []float64) []billStep {
	var out []billStep
	for _, s := range t.Closed {
		out = append(out, billStep{s, fmt.Sprintf("closed, %d clients", s.Clients)})
	}
	for _, r := range rates {
		if s, ok := t.at(r); ok {
			out = append(out, billStep{s, fmt.Sprintf("%.0f/s", r)})
		}
	}
	return out
}

// bill writes t's bill: CPU µs per operation of each process and of
// Postgres, the statements' time per operation, and the statements that
// took the most.
func (t targetReport) bill(b *strings.Builder, rates []float64) {
	steps := t.billSteps(rates)
	if len(steps) == 0 {
		return
	}
	var names []string
	for _, p := range steps[0].res.CPU.Procs {
		names = append(names, p.Name)
	}
	fmt.Fprintf(b, "\n%s, the bill: CPU µs per operation (a command: its POST and its outcome read) over each step, from /proc; "+
		"Postgres's statements from pg_stat_statements (executing and planning, µs per operation; idle: µs per second with no load, what no batching spreads):\n\n| step | operations | load gen |", t.Label)
	for _, n := range names {
		fmt.Fprintf(b, " %s |", n)
	}
	b.WriteString(" Postgres backends | Postgres background | **total** | machine | statements µs (planning) | statement calls |\n|---|---|---|")
	b.WriteString(strings.Repeat("---|", len(names)) + "---|---|---|---|---|---|\n")
	if idle := t.Idle; idle.Seconds > 0 {
		// µs of CPU per second: cores × 10⁶.
		u := idle.CPU
		fmt.Fprintf(b, "| idle, µs per second | – | %.0f |", u.Load*1e6)
		for i := range names {
			v := 0.0
			if i < len(u.Procs) {
				v = u.Procs[i].Cores
			}
			fmt.Fprintf(b, " %.0f |", v*1e6)
		}
		fmt.Fprintf(b, " %.0f | %.0f | **%.0f** | %.0f |", u.Postgres*1e6, u.PostgresBackground*1e6, u.total()*1e6, u.Machine*1e6)
		if idle.StatementsErr != "" {
			b.WriteString(" – | – |\n")
		} else {
			ms, plan, calls := stmtTime(idle.Statements)
			fmt.Fprintf(b, " %.0f (%.0f) | %.1f |\n", ms*1000/idle.Seconds, plan*1000/idle.Seconds, float64(calls)/idle.Seconds)
		}
	}
	for _, s := range steps {
		u := s.res.CPU
		fmt.Fprintf(b, "| %s | %d | %.0f |", s.kind, s.res.N, perOp(u.Load, s.res))
		for i := range names {
			v := 0.0
			if i < len(u.Procs) {
				v = u.Procs[i].Cores
			}
			fmt.Fprintf(b, " %.0f |", perOp(v, s.res))
		}
		fmt.Fprintf(b, " %s | %.0f | **%.0f** | %.0f |", postgresCell(u, s.res), perOp(u.PostgresBackground, s.res), perOp(u.total(), s.res), perOp(u.Machine, s.res))
		switch {
		case s.res.StatementsErr != "":
			b.WriteString(" – | – |\n")
		default:
			ms, plan, calls := stmtTime(s.res.Statements)
			n := float64(max(s.res.N, 1))
			fmt.Fprintf(b, " %.0f (%.0f) | %.1f |\n", ms*1000/n, plan*1000/n, float64(calls)/n)
		}
	}
	for _, s := range steps {
		if s.res.StatementsErr == noDatabase {
			return
		}
		if s.res.StatementsErr != "" {
			fmt.Fprintf(b, "\nNo statements: %s (the project's own cluster loads pg_stat_statements: make pg-up).\n", firstLine(s.res.StatementsErr))
			return
		}
	}
	// The statements that took the most over every step shown, each
	// step's calls and µs per operation.
	total := map[string]float64{}
	query := map[string]string{}
	for _, s := range steps {
		for _, st := range s.res.Statements {
			total[st.key] += (st.Exec + st.Plan) / float64(max(s.res.N, 1))
			query[st.key] = st.Query
		}
	}
	keys := make([]string, 0, len(total))
	for k := range total {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool { return total[keys[i]] > total[keys[j]] })
	if len(keys) > topStatements {
		keys = keys[:topStatements]
	}
	fmt.Fprintf(b, "\n%s, the %d statements that took the most, calls / µs per operation in each step (µs per call):\n\n| statement |", t.Label, len(keys))
	for _, s := range steps {
		fmt.Fprintf(b, " %s |", s.kind)
	}
	b.WriteString("\n|---|" + strings.Repeat("---|", len(steps)) + "\n")
	for _, k := range keys {
		fmt.Fprintf(b, "| `%s` |", shortQuery(query[k], 110))
		for _, s := range steps {
			cell := " – |"
			n := float64(max(s.res.N, 1))
			for _, st := range s.res.Statements {
				if st.key == k {
					ms := st.Exec + st.Plan
					cell = fmt.Sprintf(" %.2f / %.0f (%.0f) |", float64(st.Calls)/n, ms*1000/n, ms*1000/float64(st.Calls))
				}
			}
			b.WriteString(cell)
		}
		b.WriteString("\n")
	}
}

// topStatements is how many statements the bill lists.
const topStatements = 15

// shortQuery is a statement on one line, at most n characters, fit for a
// markdown table cell.
func shortQuery(q string, n int) string {
	q = strings.Join(strings.Fields(q), " ")
	q = strings.ReplaceAll(q, "|", "¦")
	q = strings.ReplaceAll(q, "`", "'")
	if r := []rune(q); len(r) > n {
		q = string(r[:n-3]) + "..."
	}
	return q
}

func firstLine(s string) string {
	l, _, _ := strings.Cut(s, "\n")
	return l
}
