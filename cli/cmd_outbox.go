package cli

import (
	"context"
	"flag"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/onceflow/onceflow"
	"github.com/onceflow/onceflow/pipeline/postgres"
	"github.com/onceflow/onceflow/pipeline/relay"
)

func init() {
	register(&command{name: "outbox status", summary: "print the outbox per shard (backlog, oldest age, lease owner), the relays and the dead rows",
		settings: use([]*setting{databaseURL}), run: runOutboxStatus})
}

func runOutboxStatus(ctx context.Context, domains []*onceflow.Domain, args []string, getenv func(string) string, stdout io.Writer) error {
	var dead int
	c, fs, err := parse("outbox status", domains, args, getenv, stdout, func(fs *flag.FlagSet) {
		fs.IntVar(&dead, "dead", 10, "how many of the newest dead rows to list (0: only count them)")
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
	if dead < 0 {
		return fmt.Errorf("-dead must not be negative")
	}
	pool, err := postgres.Connect(ctx, c.DatabaseURL, 2)
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
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "SHARD\tBACKLOG\tOLDEST\tOWNER\tTOKEN\tLEASE")
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
		tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "RELAY\tOWNER\tSHARDS\tHEARTBEAT\tSTARTED")
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
		tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "ID\tSHARD\tTOPIC\tKEY\tCOMMAND\tBYTES\tREASON\tDEAD AT\tDETAIL")
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
