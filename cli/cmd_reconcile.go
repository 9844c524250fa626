package cli

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/onceflow/onceflow"
	"github.com/onceflow/onceflow/pipeline/reconcile"
)

func init() {
	register(&command{name: "reconcile", summary: "find stuck or ambiguous work (commands pending too long, outbox_dead, DLQ, unapplied inbound events, jobs out of attempts), ask their authority, correct through commands, audit, report",
		settings: use(kafkaSettings, registrySettings, []*setting{databaseURL, databaseMigrationURL, topicPrefix, outboxShards}), run: runReconcile})
}

func runReconcile(ctx context.Context, domains []*onceflow.Domain, args []string, getenv func(string) string, stdout io.Writer) error {
	var olderThan time.Duration
	var dryRun, asJSON bool
	var resend string
	c, fs, err := parse("reconcile", domains, args, getenv, stdout, func(fs *flag.FlagSet) {
		fs.DurationVar(&olderThan, "older-than", 15*time.Minute, "how long a command may be pending before it is a finding")
		fs.BoolVar(&dryRun, "dry-run", false, "ask the authorities and report their verdicts; correct nothing")
		fs.BoolVar(&asJSON, "json", false, "print the report as JSON")
		fs.StringVar(&resend, "resend", "", "kinds to send again as they were without asking an authority (the operator decides): outbox-dead, dlq, job (River retries it, same Idempotency-Key), comma separated")
	})
	if err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments: %v", fs.Args())
	}
	if c.DatabaseURL == "" {
		return fmt.Errorf("DATABASE_URL is required")
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
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "KIND\tSUBJECT\tAGGREGATE\tCOMMAND\tKEY\tAGE\tACTION\tCORRECTION\tDETAIL")
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
