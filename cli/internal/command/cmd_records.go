package command

// The commands topic's records: produce commands to it from JSON, and
// read and redrive its DLQ.

import (
	"bufio"
	"context"
	"encoding/base64"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/onceflow/onceflow"
	"github.com/onceflow/onceflow/pipeline"
	"github.com/onceflow/onceflow/pipeline/processor"
)

func runDLQList(ctx context.Context, domains []*onceflow.Domain, args []string, getenv func(string) string, stdout io.Writer) error {
	var reason, aggregate string
	var asJSON bool
	c, _, err := parse("dlq list", domains, args, getenv, stdout, func(fs *flag.FlagSet) {
		fs.StringVar(&reason, "reason", "", "only records with this dlq-reason")
		fs.StringVar(&aggregate, "aggregate-type", "", aggregateTypeUsage)
		fs.BoolVar(&asJSON, "json", false, "one JSON object per record, with the value in base64")
	})
	if err != nil {
		return err
	}
	dls, _, _, err := readDLQ(ctx, c, reason, aggregate)
	if err != nil {
		return err
	}
	if asJSON {
		enc := json.NewEncoder(stdout)
		for _, d := range dls {
			if err := enc.Encode(dlqJSON(d)); err != nil {
				return err
			}
		}
		return nil
	}
	tw := table(stdout, "DLQ\tTIME\tREASON\tKEY\tTYPE\tCOMMAND-ID\tSOURCE\tDETAIL")
	for _, d := range dls {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s/%d@%d\t%s\n", d.Coordinates(), d.Time.UTC().Format(time.RFC3339),
			d.Reason, cellText(string(d.Key)), cellText(d.Header(pipeline.HeaderCommandType)), cellText(d.Header(pipeline.HeaderCommandID)),
			d.SourceTopic, d.SourcePartition, d.SourceOffset, cellText(d.Detail))
	}
	tw.Flush()
	if len(dls) == 1 {
		fmt.Fprintln(stdout, "1 record")
	} else {
		fmt.Fprintf(stdout, "%d records\n", len(dls))
	}
	return nil
}

func runDLQRedrive(ctx context.Context, domains []*onceflow.Domain, args []string, getenv func(string) string, stdout io.Writer) error {
	var reason, aggregate string
	var all, dryRun bool
	c, fs, err := parse("dlq redrive", domains, args, getenv, stdout, func(fs *flag.FlagSet) {
		fs.StringVar(&reason, "reason", "", "redrive every record with this dlq-reason")
		fs.StringVar(&aggregate, "aggregate-type", "", aggregateTypeUsage)
		fs.BoolVar(&all, "all", false, "redrive every record")
		fs.BoolVar(&dryRun, "dry-run", false, "print what would be redriven, produce nothing")
	})
	if err != nil {
		return err
	}
	chosen := map[string]bool{}
	for _, a := range fs.Args() {
		var p int32
		var o int64
		if _, err := fmt.Sscanf(a, "%d:%d", &p, &o); err != nil || fmt.Sprintf("%d:%d", p, o) != a {
			return fmt.Errorf("%q: want PARTITION:OFFSET as `onceflow dlq list` prints them", a)
		}
		chosen[a] = true
	}
	if n := len(chosen); (n > 0) == (all || reason != "") || (all && reason != "") {
		return fmt.Errorf("choose the records: PARTITION:OFFSET arguments, or -reason, or -all (one of them)")
	}
	dls, cfg, at, err := readDLQ(ctx, c, reason, aggregate)
	if err != nil {
		return err
	}
	var pick []processor.DeadLetter
	for _, d := range dls {
		if all || reason != "" || chosen[d.Coordinates()] {
			pick = append(pick, d)
			delete(chosen, d.Coordinates())
		}
	}
	if len(chosen) > 0 {
		var missing []string
		for k := range chosen {
			missing = append(missing, k)
		}
		return fmt.Errorf("not in %s: %s (nothing was redriven)", at.Topics.DLQ(), strings.Join(missing, ", "))
	}
	if len(pick) == 0 {
		fmt.Fprintln(stdout, "nothing to redrive")
		return nil
	}
	recs := make([]*kgo.Record, 0, len(pick))
	picked := make(map[*kgo.Record]processor.DeadLetter, len(pick)) // ProduceSync answers in completion order
	var incomplete int
	for _, d := range pick {
		rec, err := d.Redrive(at.Topics.Commands(), time.Now())
		if err != nil {
			incomplete++
			fmt.Fprintf(stdout, "cannot redrive %s (%s): %v\n", d.Coordinates(), d.Reason, err)
			continue
		}
		recs = append(recs, rec)
		picked[rec] = d
		if dryRun {
			fmt.Fprintf(stdout, "would redrive %s (%s) %s command-id %s\n", d.Coordinates(), d.Reason, cellText(string(d.Key)), cellText(d.Header(pipeline.HeaderCommandID)))
		}
	}
	if dryRun || len(recs) == 0 {
		return incompleteErr(incomplete)
	}
	cl, err := cfg.Kafka.NewClient()
	if err != nil {
		return err
	}
	defer cl.Close()
	var failed int
	for _, res := range cl.ProduceSync(ctx, recs...) {
		d := picked[res.Record]
		if res.Err != nil {
			failed++
			fmt.Fprintf(stdout, "FAILED %s: %v\n", d.Coordinates(), res.Err)
			continue
		}
		fmt.Fprintf(stdout, "redrove %s (%s) %s command-id %s to %s/%d@%d\n", d.Coordinates(), d.Reason, cellText(string(d.Key)),
			cellText(d.Header(pipeline.HeaderCommandID)), res.Record.Topic, res.Record.Partition, res.Record.Offset)
	}
	if failed > 0 {
		return fmt.Errorf("%d of %d records were not redriven; run the command again (redriving twice is harmless: the command id is the same)", failed, len(recs))
	}
	return incompleteErr(incomplete)
}

// incompleteErr is redrive's error when n chosen records were left out
// because their DLQ copy is incomplete.
func incompleteErr(n int) error {
	if n == 0 {
		return nil
	}
	return fmt.Errorf("%d records cannot be redriven: their DLQ copy left part of the command out (dlq-omitted); produce them again from the source coordinates printed above", n)
}

// aggregateTypeUsage is the -aggregate-type flag of the dlq commands.
const aggregateTypeUsage = "the aggregate type whose DLQ to read, DOMAIN/TYPE (default: the only one)"

// readDLQ reads the DLQ of the aggregate type named DOMAIN/TYPE (empty:
// the deployment's only one), keeping the records with reason (all if
// empty).
func readDLQ(ctx context.Context, c *config, reason, aggregate string) ([]processor.DeadLetter, onceflow.Config, *onceflow.DeployedAggregate, error) {
	cfg := c.Config
	dep, err := cfg.Deployment()
	if err != nil {
		return nil, cfg, nil, err
	}
	at, err := dep.FindAggregate(aggregate)
	if err != nil {
		return nil, cfg, nil, err
	}
	cl, err := cfg.Kafka.NewClient()
	if err != nil {
		return nil, cfg, nil, err
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	all, err := processor.ReadDLQ(ctx, cl, at.Topics.DLQ())
	if err != nil {
		return nil, cfg, nil, err
	}
	if reason == "" {
		return all, cfg, at, nil
	}
	var out []processor.DeadLetter
	for _, d := range all {
		if d.Reason == reason {
			out = append(out, d)
		}
	}
	return out, cfg, at, nil
}

// cellText keeps text a client chose (a poison record's key or header, an
// Idempotency-Key) from garbling the terminal or a table's columns: as it
// is when plain, else quoted with control and non-printable characters
// escaped; "-" when empty.
func cellText(s string) string {
	if s == "" {
		return "-"
	}
	q := fmt.Sprintf("%q", s)
	if q[1:len(q)-1] == s && !strings.ContainsAny(s, " \t") {
		return s
	}
	return q
}

type dlqRecord struct {
	Partition       int32             `json:"partition"`
	Offset          int64             `json:"offset"`
	Time            time.Time         `json:"time"`
	Reason          string            `json:"reason"`
	Detail          string            `json:"detail"`
	SourceTopic     string            `json:"source_topic"`
	SourcePartition int32             `json:"source_partition"`
	SourceOffset    int64             `json:"source_offset"`
	Key             string            `json:"key"`
	Headers         map[string]string `json:"headers"`
	Value           string            `json:"value_base64"`
	Omitted         []string          `json:"omitted,omitempty"` // what the copy left out (dlq-omitted)
}

func dlqJSON(d processor.DeadLetter) dlqRecord {
	h := make(map[string]string, len(d.Headers))
	for _, x := range d.Headers {
		h[x.Key] = string(x.Value)
	}
	return dlqRecord{
		Partition: d.Partition, Offset: d.Offset, Time: d.Time, Reason: d.Reason, Detail: d.Detail,
		SourceTopic: d.SourceTopic, SourcePartition: d.SourcePartition, SourceOffset: d.SourceOffset,
		Key: string(d.Key), Headers: h, Value: base64.StdEncoding.EncodeToString(d.Value), Omitted: d.Omitted,
	}
}

const produceUsage = `usage:
  onceflow produce -aggregate TENANT/ID -type TYPE [-command-id UUID] 'PAYLOAD-JSON'
  onceflow produce < commands.jsonl     (or -file commands.jsonl; one JSON object per line:
    {"aggregate_id":"acme/acc-1","type":"Deposit","payload":{"amount":100},"command_id":"..."})
Every line is checked before anything is produced. Each produced command is
printed with its command id: send it again with the same id and the
processor recognizes it.`

func runProduce(ctx context.Context, domains []*onceflow.Domain, args []string, getenv func(string) string, stdout io.Writer) error {
	var one processor.JSONCommand
	var at, file string
	c, fs, err := parse("produce", domains, args, getenv, stdout, func(fs *flag.FlagSet) {
		fs.StringVar(&one.AggregateID, "aggregate", "", "aggregate id TENANT/ID (the record key)")
		fs.StringVar(&one.Type, "type", "", "command type: "+commandTypesOf(domains))
		fs.StringVar(&one.CommandID, "command-id", "", "command id (UUID); default a new UUIDv7")
		fs.StringVar(&at, "time", "", "the command's time, RFC 3339; default now")
		fs.StringVar(&one.Traceparent, "traceparent", "", "W3C traceparent header")
		fs.StringVar(&file, "file", "", "read JSON lines from this file instead of standard input")
	})
	if err != nil {
		return err
	}
	var cmds []processor.JSONCommand
	var where []string // for error messages
	switch {
	case one.AggregateID != "" || one.Type != "":
		if fs.NArg() > 1 {
			return fmt.Errorf("one payload argument expected, got %d (quote the JSON)", fs.NArg())
		}
		if file != "" {
			return fmt.Errorf("-file and -aggregate/-type exclude each other")
		}
		if fs.NArg() == 1 {
			one.Payload = json.RawMessage(fs.Arg(0))
		}
		if at != "" {
			if one.Time, err = time.Parse(time.RFC3339Nano, at); err != nil {
				return fmt.Errorf("-time: %w", err)
			}
		}
		cmds, where = append(cmds, one), append(where, "the command")
	default:
		if fs.NArg() > 0 {
			return fmt.Errorf("unexpected arguments %v: give -aggregate and -type, or JSON lines on standard input\n%s", fs.Args(), produceUsage)
		}
		in := io.Reader(os.Stdin)
		if file != "" {
			f, err := os.Open(file) // #nosec G304 -- the operator's -file argument
			if err != nil {
				return err
			}
			defer f.Close()
			in = f
		}
		if cmds, where, err = readJSONLines(in); err != nil {
			return err
		}
		if len(cmds) == 0 {
			return fmt.Errorf("no commands on the input\n%s", produceUsage)
		}
	}

	cfg := c.Config
	dep, serdes, err := deploymentSerdes(ctx, cfg)
	if err != nil {
		return err
	}
	// Check and encode everything first: a bad line produces nothing.
	now := time.Now()
	recs := make([]*kgo.Record, len(cmds))
	for i, cmd := range cmds {
		a := dep.Handler(cmd.Type)
		if a == nil {
			return fmt.Errorf("%s: unknown command type %q; the deployment's are %s (nothing was produced)", where[i], cmd.Type, dep.CommandTypes())
		}
		_, types, err := a.CommandsSchema()
		if err != nil {
			return err
		}
		r, _, err := cmd.Record(ctx, a.Topics.Commands(), serdes[a.Topics.Commands()], types, now)
		if err != nil {
			return fmt.Errorf("%s: %w (nothing was produced)", where[i], err)
		}
		recs[i] = r
	}

	cl, err := cfg.Kafka.NewClient() // idempotent, murmur2 key partitioner: franz-go's defaults
	if err != nil {
		return err
	}
	defer cl.Close()
	results := cl.ProduceSync(ctx, recs...)
	var failed int
	for _, res := range results {
		r := res.Record
		id := ""
		for _, h := range r.Headers {
			if h.Key == pipeline.HeaderCommandID {
				id = string(h.Value)
			}
		}
		if res.Err != nil {
			failed++
			fmt.Fprintf(stdout, "FAILED %s %s command-id %s: %v\n", r.Key, typeOf(r), id, res.Err)
			continue
		}
		fmt.Fprintf(stdout, "produced %s %s command-id %s to %s/%d@%d\n", r.Key, typeOf(r), id, r.Topic, r.Partition, r.Offset)
	}
	if failed > 0 {
		return fmt.Errorf("%d of %d commands were not produced; send them again with the same command ids", failed, len(recs))
	}
	return nil
}

func typeOf(r *kgo.Record) string {
	for _, h := range r.Headers {
		if h.Key == pipeline.HeaderCommandType {
			return string(h.Value)
		}
	}
	return ""
}

// readJSONLines reads one JSONCommand per non-empty line.
func readJSONLines(in io.Reader) ([]processor.JSONCommand, []string, error) {
	var cmds []processor.JSONCommand
	var where []string
	sc := bufio.NewScanner(in)
	sc.Buffer(make([]byte, 64<<10), 4<<20)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" {
			continue
		}
		cmd, err := processor.ParseJSONCommand([]byte(line))
		if err != nil {
			return nil, nil, fmt.Errorf("line %d: %w (nothing was produced)", n, err)
		}
		cmds, where = append(cmds, cmd), append(where, fmt.Sprintf("line %d", n))
	}
	if err := sc.Err(); err != nil {
		return nil, nil, fmt.Errorf("read commands: %w", err)
	}
	return cmds, where, nil
}
