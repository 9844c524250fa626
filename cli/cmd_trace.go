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
	"unicode"

	"github.com/onceflow/onceflow"
	"github.com/onceflow/onceflow/pipeline"
	"github.com/onceflow/onceflow/pipeline/trace"
)

func init() {
	register(&command{name: "trace", summary: "print one command's whole path from an Idempotency-Key, provider/event-id, command id or event id: key, outbox, where it was shipped, status, events, inbox rows, corrections", args: "IDEMPOTENCY-KEY | PROVIDER/EVENT-ID | COMMAND-ID | EVENT-ID",
		settings: use(kafkaSettings, []*setting{databaseURL, databaseMigrationURL, topicPrefix}), run: runTrace})
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
	if c.DatabaseURL == "" {
		return fmt.Errorf("DATABASE_URL is required")
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
		if err := locate(ctx, cfg, t, a.Topics.Commands(), a.Domain.EventsTopic()); err != nil {
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

// locate finds where the command and its events are on Kafka: the
// outbox row is gone once shipped, so the topics are read from the
// command's time on.
func locate(ctx context.Context, cfg onceflow.Config, t *trace.Trace, commands, events string) error {
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
	ids := make([]string, len(t.Events))
	for i, e := range t.Events {
		ids[i] = e.EventID
	}
	found, err := trace.Locate(ctx, cl, events, t.Command.CreatedAt, pipeline.HeaderEventID, ids)
	if err != nil {
		return err
	}
	for i := range t.Events {
		if p, ok := found[t.Events[i].EventID]; ok {
			t.Events[i].Position = &p
		}
	}
	return nil
}

// plain is s for a terminal: control characters (a provider's event id
// may hold any) become '?'.
func plain(s string) string {
	return strings.Map(func(r rune) rune {
		if unicode.IsControl(r) {
			return '?'
		}
		return r
	}, s)
}
