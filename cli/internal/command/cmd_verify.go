package command

// onceflow verify (docs/operations.md#verify): the window's records of
// every stage joined by pipeline/verify, printed, recorded for the status
// page, and the exit status says whether anything was lost or doubled.

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"time"

	"github.com/onceflow/onceflow"
	"github.com/onceflow/onceflow/pipeline/verify"
)

func runVerify(ctx context.Context, domains []*onceflow.Domain, args []string, getenv func(string) string, stdout io.Writer) error {
	var since, bound time.Duration
	var from, to, tenant string
	var asJSON, record bool
	c, fs, err := parse("verify", domains, args, getenv, stdout, func(fs *flag.FlagSet) {
		fs.DurationVar(&since, "since", 0, "the window: from this long ago until now (or -from)")
		fs.StringVar(&from, "from", "", "the window's start, RFC 3339 (2026-12-08T09:00:00Z)")
		fs.StringVar(&to, "to", "", "the window's end, RFC 3339 (default now)")
		fs.StringVar(&tenant, "tenant", "", "check only this tenant's commands and events")
		fs.DurationVar(&bound, "pending-bound", 5*time.Minute, "how long a command or event may wait at a stage before it is reported pending")
		fs.BoolVar(&asJSON, "json", false, "print the report as JSON")
		fs.BoolVar(&record, "record", true, "record the result in verify_runs, which every status page exports")
	})
	if err != nil {
		return err
	}
	if fs.NArg() != 0 {
		return fmt.Errorf("usage: onceflow verify -since DURATION | -from TIME [-to TIME] [-tenant T] [-json]")
	}
	vc := verify.Config{Tenant: tenant, PendingBound: bound}
	switch {
	case (since == 0) == (from == ""):
		return fmt.Errorf("give the window with one of -since DURATION (1h) and -from TIME (RFC 3339)")
	case since < 0:
		return fmt.Errorf("-since %s: want a positive duration", since)
	case since > 0:
		vc.From = time.Now().Add(-since)
	default:
		if vc.From, err = time.Parse(time.RFC3339, from); err != nil {
			return fmt.Errorf("-from %q: want RFC 3339 (2026-12-08T09:00:00Z): %w", from, err)
		}
	}
	if to != "" {
		if vc.To, err = time.Parse(time.RFC3339, to); err != nil {
			return fmt.Errorf("-to %q: want RFC 3339 (2026-12-08T10:00:00Z): %w", to, err)
		}
	}
	if bound <= 0 {
		return fmt.Errorf("-pending-bound %s: want a positive duration", bound)
	}
	if err := c.requireDatabase(ctx); err != nil {
		return err
	}
	cfg := c.Config
	dep, err := cfg.Deployment()
	if err != nil {
		return err
	}
	for _, a := range dep.Aggregates() {
		vc.Commands = append(vc.Commands, verify.CommandsTopic{Topic: a.Topics.Commands(), DLQ: a.Topics.DLQ(), Group: a.ProcessorGroup()})
	}
	for _, d := range dep.Domains {
		vc.Events = append(vc.Events, verify.EventsTopic{Topic: d.EventsTopic(), Projectors: []string{d.ProjectorConsumer()}})
		if c.NATSink.URL != "" {
			vc.Unchecked = append(vc.Unchecked, fmt.Sprintf("the NATS sink's stream of %s: verify does not read JetStream "+
				"(onceflow lag shows the sink's group %s on %s)", d.EventsTopic(), d.NATSinkGroup(), d.EventsTopic()))
		}
	}
	pool, err := cfg.OpenDatabase(ctx, 2)
	if err != nil {
		return err
	}
	defer pool.Close()
	cl, err := cfg.Kafka.NewClient()
	if err != nil {
		return err
	}
	defer cl.Close()
	rep, err := verify.Run(ctx, vc, pool, cl)
	if err != nil {
		return err
	}
	if record {
		if err := verify.Record(ctx, pool, rep); err != nil {
			return err
		}
	}
	if asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(struct {
			*verify.Report
			OK bool `json:"ok"`
		}{rep, rep.OK()}); err != nil {
			return err
		}
	} else {
		printVerify(stdout, rep)
	}
	if !rep.OK() {
		return fmt.Errorf("verify: %d lost, %d doubled", rep.Count(verify.Lost), rep.Count(verify.Doubled))
	}
	return nil
}

func printVerify(w io.Writer, rep *verify.Report) {
	window := rep.From.UTC().Format(time.RFC3339) + " to " + rep.To.UTC().Format(time.RFC3339)
	if rep.Tenant != "" {
		window += ", tenant " + rep.Tenant
	}
	fmt.Fprintf(w, "verified %s in %s\n", window, roundDur(rep.Took))
	fmt.Fprintln(w, "checked:")
	for _, c := range rep.Checked {
		fmt.Fprintf(w, "  %d %s\n", c.Count, c.What)
	}
	if len(rep.NotChecked) > 0 {
		fmt.Fprintln(w, "not checked:")
		for _, n := range rep.NotChecked {
			fmt.Fprintf(w, "  %s\n", plain(n))
		}
	}
	if len(rep.Findings) > 0 {
		tw := table(w, "STAGE\tKIND\tCOMMAND\tEVENT\tAGGREGATE\tAT\tSINCE\tLAST SEEN")
		for _, f := range rep.Findings {
			at := orDash(f.Consumer)
			if f.Key != "" {
				at += " key " + f.Key
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", f.Stage, f.Kind, orDash(f.CommandID), orDash(f.EventID),
				orDash(cellText(f.AggregateID)), plain(at), f.Since.UTC().Format(time.RFC3339), plain(f.LastSeen))
		}
		tw.Flush()
	}
	fmt.Fprintf(w, "%d lost, %d doubled, %d pending past %s, %d duplicate records\n", rep.Count(verify.Lost), rep.Count(verify.Doubled),
		rep.Count(verify.Pending), rep.PendingBound, rep.Count(verify.DuplicateRecord))
}
