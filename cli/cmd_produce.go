package cli

import (
	"bufio"
	"context"
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

func init() {
	register(&command{name: "produce", summary: "produce commands to the commands topic from JSON, Avro-encoded with their headers", more: produceUsage,
		settings: use(kafkaSettings, registrySettings, []*setting{topicPrefix}), run: runProduce})
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
