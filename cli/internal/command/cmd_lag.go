package command

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/onceflow/onceflow"
	"github.com/onceflow/onceflow/pipeline/admin"
	"github.com/onceflow/onceflow/pipeline/kafka"
	"github.com/onceflow/onceflow/pipeline/natsink"
	"github.com/onceflow/onceflow/pipeline/postgres"
	"github.com/onceflow/onceflow/pipeline/projector"
)

// lagRow is one line of `onceflow lag` (and one object of -o json).
type lagRow struct {
	kafka.PartitionLag
	Parked   string `json:"parked,omitempty"`   // reason@offset of a parked (or, a group's, blocked) partition
	Retrying string `json:"retrying,omitempty"` // class of the transient error its batch is retried on
}

func runLag(ctx context.Context, domains []*onceflow.Domain, args []string, getenv func(string) string, stdout io.Writer) error {
	var groups, output, serve string
	var wide bool
	c, _, err := parse("lag", domains, args, getenv, stdout, func(fs *flag.FlagSet) {
		fs.BoolVar(&wide, "wide", false, "add each partition's consumer and client ids to the table")
		fs.StringVar(&groups, "group", "", "only these groups or consumers, comma separated (default: every group on the cluster and every consumer with offsets in Postgres)")
		fs.StringVar(&output, "o", "table", "table or json")
		fs.StringVar(&serve, "serve", "", "serve the lag of every consumer as Prometheus metrics on this address (/metrics, /healthz) until stopped, in place of Kafka Lag Exporter, instead of printing it")
	})
	if err != nil {
		return err
	}
	if output != "table" && output != "json" {
		return fmt.Errorf("-o %q: want table or json", output)
	}
	cfg := c.Config
	if serve != "" {
		if groups != "" {
			return fmt.Errorf("-serve exports every consumer; -group does not apply")
		}
		logger := c.Logger
		cfg.Logger = logger
		return serveLag(ctx, cfg, c.DatabaseURL, serve)
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	cl, err := cfg.Kafka.NewClient()
	if err != nil {
		return err
	}
	defer cl.Close()
	only := map[string]bool{}
	for _, g := range strings.Split(groups, ",") {
		if g = strings.TrimSpace(g); g != "" {
			only[g] = true
		}
	}

	var pool *pgxpool.Pool
	var parked []projector.ParkedPartition
	var retrying []projector.RetryingPartition
	// Without a database the projectors' offsets, parks and retries are
	// unknown, and the table says so rather than showing none.
	noDatabase := c.requireDatabase(ctx)
	if noDatabase == nil {
		if pool, err = postgres.Connect(ctx, c.DatabaseURL, 2); err != nil {
			return err
		}
		defer pool.Close()
		if parked, err = projector.Parked(ctx, pool); err != nil {
			return err
		}
		if retrying, err = projector.Retrying(ctx, pool); err != nil {
			return err
		}
	}
	dep, err := cfg.Deployment()
	if err != nil {
		return err
	}
	all, err := dep.LagSources(ctx, cl, pool)
	if err != nil {
		return err
	}
	var sources []kafka.LagSource
	for _, s := range all {
		if len(only) == 0 || only[s.Group] {
			sources = append(sources, s)
			delete(only, s.Group)
		}
	}
	for g := range only {
		return fmt.Errorf("no group or consumer named %q has offsets", g)
	}
	lags, err := kafka.Lag(ctx, cl, sources)
	if err != nil {
		return err
	}
	rows := make([]lagRow, len(lags))
	for i, l := range lags {
		rows[i] = lagRow{PartitionLag: l}
		for _, p := range parked {
			if p.Consumer == l.Group && p.Topic == l.Topic && p.Partition == l.Partition {
				rows[i].Parked = p.Reason + "@" + strconv.FormatInt(p.Offset, 10)
			}
		}
		for _, r := range retrying {
			if r.Consumer == l.Group && r.Topic == l.Topic && r.Partition == l.Partition {
				rows[i].Retrying = r.Class
			}
		}
		// A group's partition that lags may be stopped at a batch too
		// large to decompress: its consumer reads no further, with the
		// same bound as this client (KAFKA_MAX_DECOMPRESS_BATCH_BYTES).
		if l.OffsetsIn == kafka.OffsetsInKafka && l.Lag > 0 && l.Committed >= 0 {
			if b, err := kafka.BlockedBatch(ctx, cl, l.Topic, l.Partition, l.Committed); err == nil && b != nil {
				rows[i].Parked = "batch-too-large@" + strconv.FormatInt(b.Offset, 10)
			}
		}
	}
	streams := natsStreams(ctx, c, dep)
	if output == "json" {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		out := map[string]any{"partitions": rows, "parked": parked, "retrying": retrying}
		if noDatabase != nil {
			out["database"] = noDatabase.Error()
		}
		if streams != nil {
			out["nats_streams"] = streams
		}
		return enc.Encode(out)
	}
	printLag(stdout, rows, parked, retrying, wide)
	if noDatabase != nil {
		fmt.Fprintf(stdout, "\nthe projectors' offsets, parked and retrying partitions are not shown: %v\n", noDatabase)
	}
	printStreams(stdout, streams)
	return nil
}

// serveLag serves the lag of every consumer of the cluster as Kafka Lag
// Exporter's metrics until ctx ends: one such process per cluster.
func serveLag(ctx context.Context, cfg onceflow.Config, databaseURL, addr string) error {
	dep, err := cfg.Deployment()
	if err != nil {
		return err
	}
	reg := admin.NewRegistry()
	lag, cl, err := onceflow.NewLagCollector(cfg, reg)
	if err != nil {
		return err
	}
	defer cl.Close()
	var pool *pgxpool.Pool
	if databaseURL != "" {
		if pool, err = postgres.Connect(ctx, databaseURL, 2); err != nil {
			return err
		}
		defer pool.Close()
	}
	lag.AddFinder(func(ctx context.Context) ([]kafka.LagSource, error) {
		return dep.LagSources(ctx, cl, pool)
	})
	err = admin.New(addr, reg, cfg.Logger.With("component", "lag")).Run(ctx)
	if errors.Is(err, context.Canceled) {
		return nil
	}
	return err
}

func printLag(w io.Writer, rows []lagRow, parked []projector.ParkedPartition, retrying []projector.RetryingPartition, wide bool) {
	// The member and client ids (a group member's id is some 60
	// characters) take a table past 200 columns: -wide adds them.
	ids := func(string, string) string { return "" }
	if wide {
		ids = func(member, client string) string {
			return "\t" + dashIf(member == "", member) + "\t" + dashIf(client == "", client)
		}
	}
	if len(rows) == 0 {
		fmt.Fprintln(w, "no consumer groups")
	} else {
		tw := table(w, "GROUP\tTOPIC\tPARTITION\tCURRENT-OFFSET\tOFFSETS-IN\tLOG-END\tLAST-STABLE\tLAG\tLAG-SECONDS\tHOST"+ids("CONSUMER-ID", "CLIENT-ID")+"\tPARKED\tRETRYING")
		for _, r := range rows {
			fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\t%d\t%d\t%d\t%s\t%s%s\t%s\t%s\n",
				r.Group, r.Topic, r.Partition, dashIf(r.Committed < 0, strconv.FormatInt(r.Committed, 10)), r.OffsetsIn,
				r.LogEnd, r.LastStable, r.Lag, lagSecondsText(r.LagSeconds), dashIf(r.Host == "", r.Host), ids(r.MemberID, r.ClientID),
				dashIf(r.Parked == "", r.Parked), dashIf(r.Retrying == "", r.Retrying))
		}
		tw.Flush()
	}
	for _, r := range rows {
		if r.OffsetsIn == kafka.OffsetsInKafka && strings.HasPrefix(r.Parked, "batch-too-large@") {
			fmt.Fprintln(w)
			fmt.Fprintln(w, "batch-too-large: the group's consumer stopped at a batch that decompresses beyond KAFKA_MAX_DECOMPRESS_BATCH_BYTES;"+
				" raise it if a legitimate producer wrote the batch, or skip the batch on purpose, recorded in the DLQ:"+
				" `onceflow commands skip-batch -note WHY -admin-addr HOST:PORT PARTITION OFFSET` at the admin address of the processor that holds it (docs/processor.md)")
			break
		}
	}
	printRetrying(w, retrying)
	if len(parked) == 0 {
		return
	}
	tw := subtable(w, "parked partitions (an operator must act: fix the cause, then `onceflow projections unpark`; or skip the record on purpose: `onceflow projections skip`):",
		"CONSUMER\tTOPIC\tPARTITION\tOFFSET\tREASON\tSINCE\tDETAIL")
	for _, p := range parked {
		detail := strings.ReplaceAll(p.Detail, "\n", " ")
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%s\t%s\t%s\n", p.Consumer, p.Topic, p.Partition, p.Offset, p.Reason,
			p.Since.UTC().Format(time.RFC3339), detail)
	}
	tw.Flush()
}

// subtable starts a table below the main one: a blank line, its title, its
// header.
func subtable(w io.Writer, title, header string) *tabwriter.Writer {
	fmt.Fprintln(w)
	fmt.Fprintln(w, title)
	return table(w, header)
}

func dashIf(cond bool, s string) string {
	if cond {
		return "-"
	}
	return s
}

func lagSecondsText(s float64) string {
	if s < 0 {
		return "?"
	}
	return strconv.FormatFloat(s, 'f', 1, 64)
}

// printRetrying lists the partitions a projector is retrying on a
// transient error: lag that grows for a reason, not silently.
func printRetrying(w io.Writer, retrying []projector.RetryingPartition) {
	if len(retrying) == 0 {
		return
	}
	tw := subtable(w, "retrying partitions (a transient error; the projector retries with backoff and skips nothing):",
		"CONSUMER\tTOPIC\tPARTITION\tCLASS\tATTEMPTS\tSINCE\tLAST\tERROR")
	for _, r := range retrying {
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%d\t%s\t%s\t%s\n", r.Consumer, r.Topic, r.Partition, r.Class, r.Attempts,
			r.Since.UTC().Format(time.RFC3339), r.LastAt.UTC().Format(time.RFC3339), strings.ReplaceAll(r.Error, "\n", " "))
	}
	tw.Flush()
}

// natsStream is a NATS sink's stream as lag shows it, or why it could
// not be read.
type natsStream struct {
	natsink.StreamInfo
	Error string `json:"error,omitempty"`
}

// natsStreams reads the stream of each domain's NATS sink when
// ONCEFLOW_NATS_URL is set: whether it keeps what JetStream acknowledged
// (its storage and replicas), and how far it is.
func natsStreams(ctx context.Context, c *config, dep *onceflow.Deployment) []natsStream {
	if c.NATSink.URL == "" {
		return nil
	}
	var out []natsStream
	for _, d := range dep.Domains {
		cfg := c.NATSink
		cfg.Topic = d.EventsTopic()
		info, err := natsink.Describe(ctx, cfg)
		s := natsStream{StreamInfo: info}
		if err != nil {
			s.Stream, s.Error = natsink.DefaultStream(cfg.Topic), err.Error()
		}
		out = append(out, s)
	}
	return out
}

func printStreams(w io.Writer, streams []natsStream) {
	for _, s := range streams {
		switch {
		case s.Error != "":
			fmt.Fprintf(w, "\nNATS stream %s: %s\n", s.Stream, s.Error)
		default:
			fmt.Fprintf(w, "\nNATS stream %s: %s storage, %d %s, %d messages (last sequence %d)\n", s.Stream, s.Storage, s.Replicas,
				map[bool]string{true: "replica", false: "replicas"}[s.Replicas == 1], s.Messages, s.LastSeq)
			if !s.Durable {
				fmt.Fprintf(w, "  NOT DURABLE: %s\n", s.Why)
			}
		}
	}
}
