package command

// Operations (docs/operations.md): reconcile what is stuck, trace one
// command's path, and the outbox's state.

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"
	"unicode"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/onceflow/onceflow"
	"github.com/onceflow/onceflow/pipeline"
	"github.com/onceflow/onceflow/pipeline/reconcile"
	"github.com/onceflow/onceflow/pipeline/relay"
	"github.com/onceflow/onceflow/pipeline/trace"
)

func runReconcile(ctx context.Context, domains []*onceflow.Domain, args []string, getenv func(string) string, stdout io.Writer) error {
	var olderThan time.Duration
	var dryRun, asJSON bool
	var resend string
	c, _, err := parse("reconcile", domains, args, getenv, stdout, func(fs *flag.FlagSet) {
		fs.DurationVar(&olderThan, "older-than", 15*time.Minute, "how long a command may be pending before it is a finding")
		fs.BoolVar(&dryRun, "dry-run", false, "ask the authorities and report their verdicts; correct nothing")
		fs.BoolVar(&asJSON, "json", false, "print the report as JSON")
		fs.StringVar(&resend, "resend", "", "kinds to send again as they were without asking an authority (the operator decides): outbox-dead, dlq, job (River retries it, same Idempotency-Key), comma separated")
	})
	if err != nil {
		return err
	}
	if err := c.requireDatabase(ctx); err != nil {
		return err
	}
	if olderThan <= 0 {
		return fmt.Errorf("-older-than %s: want a positive duration", olderThan)
	}
	extra := map[string]reconcile.Authority{}
	for _, k := range strings.Split(resend, ",") {
		switch k = strings.TrimSpace(k); k {
		case "":
		case reconcile.KindOutboxDead, reconcile.KindDLQ, reconcile.KindJob:
			extra[k] = reconcile.AuthorityFunc(func(context.Context, reconcile.Finding) (reconcile.Verdict, error) {
				return reconcile.Verdict{Action: reconcile.Resend, Reason: "operator: onceflow reconcile -resend " + k}, nil
			})
		default:
			return fmt.Errorf("-resend %q: only outbox-dead and dlq keep their commands to send again, and a job can run again", k)
		}
	}
	cfg := c.Config
	pool, err := cfg.OpenDatabase(ctx, 4)
	if err != nil {
		return err
	}
	defer pool.Close()
	cl, err := cfg.Kafka.NewClient()
	if err != nil {
		return err
	}
	defer cl.Close()
	r, err := cfg.NewReconciler(ctx, reconcile.Config{MaxPendingAge: olderThan, DryRun: dryRun, Authorities: extra}, pool, cl)
	if err != nil {
		return err
	}
	rctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	rep, err := r.Reconcile(rctx)
	if err != nil {
		return err
	}
	if asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(rep); err != nil {
			return err
		}
	} else {
		printReconcile(stdout, rep)
	}
	if rep.Failed > 0 {
		return fmt.Errorf("%d of %d findings could not be settled (see their errors)", rep.Failed, len(rep.Findings))
	}
	return nil
}

func printReconcile(w io.Writer, rep reconcile.Report) {
	tw := table(w, "KIND\tSUBJECT\tAGGREGATE\tCOMMAND\tKEY\tAGE\tACTION\tCORRECTION\tDETAIL")
	for _, f := range rep.Findings {
		action := string(f.Action)
		detail := f.Detail
		if f.Reason != "" {
			detail += "; " + f.Reason
		}
		if f.Error != "" {
			action, detail = "error", detail+"; "+f.Error
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", f.Kind, cellText(f.Subject), cellText(f.AggregateID),
			orDash(f.CommandType+" "+f.CommandID), orDash(cellText(f.Key)), age(time.Since(f.Since)), action, orDash(f.CorrectionID), plain(oneLine(detail)))
	}
	tw.Flush()
	fmt.Fprintf(w, "%d found: %d corrected, %d reported, %d failed\n", len(rep.Findings), rep.Corrected, rep.Reported, rep.Failed)
}

func orDash(s string) string {
	if strings.TrimSpace(s) == "" {
		return "-"
	}
	return strings.TrimSpace(s)
}

func runTrace(ctx context.Context, domains []*onceflow.Domain, args []string, getenv func(string) string, stdout io.Writer) error {
	var tenant string
	var asJSON, noKafka bool
	c, fs, err := parse("trace", domains, args, getenv, stdout, func(fs *flag.FlagSet) {
		fs.StringVar(&tenant, "tenant", "", "the tenant, when several used the Idempotency-Key")
		fs.BoolVar(&asJSON, "json", false, "print the trace as JSON")
		fs.BoolVar(&noKafka, "no-kafka", false, "read only the database: do not look for the records on Kafka")
	})
	if err != nil {
		return err
	}
	if fs.NArg() != 1 {
		return fmt.Errorf("usage: onceflow trace [flags] IDEMPOTENCY-KEY | PROVIDER/EVENT-ID | COMMAND-ID | EVENT-ID")
	}
	if err := c.requireDatabase(ctx); err != nil {
		return err
	}
	cfg := c.Config
	dep, err := cfg.Deployment()
	if err != nil {
		return err
	}
	pool, err := cfg.OpenDatabase(ctx, 2)
	if err != nil {
		return err
	}
	defer pool.Close()
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	t, err := trace.Find(ctx, pool, fs.Arg(0), tenant)
	if err != nil {
		return fmt.Errorf("trace %q: %w", fs.Arg(0), err)
	}
	if a := dep.Handler(t.Command.CommandType); a != nil && !noKafka {
		if err := locate(ctx, cfg, dep, pool, t, a.Topics.Commands(), a.Domain.EventsTopic()); err != nil {
			t.Notes = append(t.Notes, "Kafka: "+err.Error())
		}
	}
	if asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(struct {
			*trace.Trace
			Timeline []trace.Step `json:"timeline"`
		}{t, t.Timeline()})
	}
	fmt.Fprintf(stdout, "%s %q: command %s of %s\n", t.QueryKind, t.Query, t.Command.CommandID, t.Command.AggregateID)
	tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', 0)
	for _, s := range t.Timeline() {
		fmt.Fprintf(tw, "%s\t%s\t%s\n", s.At.UTC().Format("2006-01-02T15:04:05.000000Z"), s.Stage, plain(s.What))
	}
	tw.Flush()
	for _, n := range t.Notes {
		fmt.Fprintf(stdout, "note: %s\n", plain(n))
	}
	return nil
}

// locate finds where the command, its events and those of the commands
// it led to are on Kafka: the
// outbox row is gone once shipped, so the topics are read from the
// command's time on. Then which consumers of the events topic have read
// past each event: the consumers `onceflow lag` shows (every group of the
// cluster, a projector by its offsets in Postgres).
func locate(ctx context.Context, cfg onceflow.Config, dep *onceflow.Deployment, pool *pgxpool.Pool, t *trace.Trace, commands, events string) error {
	cl, err := cfg.Kafka.NewClient()
	if err != nil {
		return err
	}
	defer cl.Close()
	if t.Outbox == nil && t.Dead == nil {
		found, err := trace.Locate(ctx, cl, commands, t.Command.CreatedAt, pipeline.HeaderCommandID, []string{t.Command.CommandID})
		if err != nil {
			return err
		}
		if p, ok := found[t.Command.CommandID]; ok {
			t.Shipped = &p
		} else if t.Command.Ingested {
			t.Notes = append(t.Notes, "the command is not on "+commands+" from its time on (retention, or not shipped)")
		}
	}
	// The events of the commands it led to are on the same events topic
	// (a domain has one), dated with their cause's time or later.
	all := []*[]trace.Event{&t.Events}
	for i := range t.Derived {
		all = append(all, &t.Derived[i].Events)
	}
	var ids []string
	for _, evs := range all {
		for _, e := range *evs {
			ids = append(ids, e.EventID)
		}
	}
	found, err := trace.Locate(ctx, cl, events, t.Command.CreatedAt, pipeline.HeaderEventID, ids)
	if err != nil {
		return err
	}
	for _, evs := range all {
		for i := range *evs {
			if p, ok := found[(*evs)[i].EventID]; ok {
				(*evs)[i].Position = &p
			}
		}
	}
	if len(found) == 0 {
		return nil
	}
	sources, err := dep.LagSources(ctx, cl, pool)
	if err != nil {
		return fmt.Errorf("the consumers of %s: %w", events, err)
	}
	return trace.Consumers(ctx, cl, events, sources, t)
}

// plain is s for a terminal: control and format characters (a provider's
// event id may hold any; a webhook receiver's answer, in rows written
// before the worker made them printable) become '?'.
func plain(s string) string {
	return strings.Map(func(r rune) rune {
		if unicode.IsControl(r) || unicode.Is(unicode.Cf, r) {
			return '?'
		}
		return r
	}, s)
}

func runOutboxStatus(ctx context.Context, domains []*onceflow.Domain, args []string, getenv func(string) string, stdout io.Writer) error {
	var dead int
	c, _, err := parse("outbox status", domains, args, getenv, stdout, func(fs *flag.FlagSet) {
		fs.IntVar(&dead, "dead", 10, "how many of the newest dead rows to list (0: only count them)")
	})
	if err != nil {
		return err
	}
	if dead < 0 {
		return fmt.Errorf("-dead must not be negative")
	}
	pool, err := c.connect(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	st, err := relay.ReadStatus(ctx, pool, dead)
	if err != nil {
		return err
	}
	printOutboxStatus(stdout, st)
	return nil
}

func printOutboxStatus(w io.Writer, st relay.Status) {
	tw := table(w, "SHARD\tBACKLOG\tOLDEST\tOWNER\tTOKEN\tLEASE")
	var total int64
	var oldest time.Duration
	var problems []string
	for _, s := range st.Shards {
		total += s.Backlog
		oldest = max(oldest, s.OldestAge)
		owner, lease := s.Owner, ""
		switch {
		case !s.Leased:
			owner, lease = "-", "no lease row"
			problems = append(problems, fmt.Sprintf("shard %d has %d rows but no lease row: ingest and relay disagree on ONCEFLOW_OUTBOX_SHARDS, and nobody ships them", s.Shard, s.Backlog))
		case s.Owner == "":
			owner, lease = "-", "free"
		case s.ExpiresIn <= 0:
			lease = fmt.Sprintf("expired %s ago", roundDur(-s.ExpiresIn))
		default:
			lease = fmt.Sprintf("%s left", roundDur(s.ExpiresIn))
		}
		if s.Leased && s.Free() && s.Backlog > 0 {
			problems = append(problems, fmt.Sprintf("shard %d has %d rows and no live relay", s.Shard, s.Backlog))
		}
		fmt.Fprintf(tw, "%d\t%d\t%s\t%s\t%d\t%s\n", s.Shard, s.Backlog, age(s.OldestAge), owner, s.Token, lease)
	}
	fmt.Fprintf(tw, "total\t%d\t%s\t\t\t\n", total, age(oldest))
	tw.Flush()

	fmt.Fprintln(w)
	if len(st.Relays) == 0 {
		fmt.Fprintln(w, "relays: none in the last hour")
	} else {
		tw = table(w, "RELAY\tOWNER\tSHARDS\tHEARTBEAT\tSTARTED")
		for _, r := range st.Relays {
			beat := roundDur(r.SilentFor).String() + " ago"
			if !r.Live {
				beat += " (not live)"
			}
			fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\n", r.Instance, r.Owner, r.Shards, beat, r.StartedAt.UTC().Format(time.RFC3339))
		}
		tw.Flush()
	}

	fmt.Fprintln(w)
	fmt.Fprintf(w, "dead rows: %d", st.DeadRows)
	if st.DeadRows > 0 {
		fmt.Fprint(w, " (cannot be shipped; kept in outbox_dead)")
	}
	fmt.Fprintln(w)
	if len(st.Dead) > 0 {
		tw = table(w, "ID\tSHARD\tTOPIC\tKEY\tCOMMAND\tBYTES\tREASON\tDEAD AT\tDETAIL")
		for _, d := range st.Dead {
			fmt.Fprintf(tw, "%d\t%d\t%s\t%s\t%s\t%d\t%s\t%s\t%s\n", d.ID, d.Shard, d.Topic, d.Key, d.CommandID, d.Bytes,
				d.Reason, d.DeadAt.UTC().Format(time.RFC3339), oneLine(d.Detail))
		}
		tw.Flush()
	}
	for _, p := range problems {
		fmt.Fprintln(w, "WARNING:", p)
	}
}

func age(d time.Duration) string {
	if d <= 0 {
		return "-"
	}
	return roundDur(d).String()
}

func roundDur(d time.Duration) time.Duration {
	switch {
	case d > time.Minute:
		return d.Round(time.Second)
	case d > time.Second:
		return d.Round(100 * time.Millisecond)
	}
	return d.Round(time.Millisecond)
}

func oneLine(s string) string {
	s = strings.ReplaceAll(s, "\n", " ")
	if len(s) > 120 {
		s = s[:117] + "..."
	}
	return s
}
