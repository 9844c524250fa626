package cli_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/onceflow/onceflow/examples/ledger"
	"github.com/onceflow/onceflow/pipeline"
	"github.com/onceflow/onceflow/pipeline/kafka"
	"github.com/onceflow/onceflow/pipeline/pipelinetest"
	"github.com/onceflow/onceflow/pipeline/projector"
)

// projCLI is a broker with onceflow's topics and a migrated database, and
// the environment the CLI reads them from.
type projCLI struct {
	brokers []string
	topics  kafka.Topics
	pool    *pgxpool.Pool
	env     map[string]string
}

func newProjCLI(t *testing.T) *projCLI {
	t.Helper()
	b := pipelinetest.Broker(t)
	c := &projCLI{brokers: b.Addrs()}
	c.topics = pipelinetest.Topics(t, c.brokers, 2)
	var url string
	c.pool, url = pipelinetest.Pool(t, ledgerMigrations)
	c.env = map[string]string{"KAFKA_BROKERS": strings.Join(c.brokers, ","), "DATABASE_URL": url, "ONCEFLOW_TOPIC_PREFIX": c.topics.Prefix}
	return c
}

func (c *projCLI) run(args ...string) (string, error) {
	var out bytes.Buffer
	err := run(context.Background(), args, func(k string) string { return c.env[k] }, &out)
	return out.String(), err
}

func (c *projCLI) exec(t *testing.T, sql string, args ...any) {
	t.Helper()
	if _, err := c.pool.Exec(context.Background(), sql, args...); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

// `onceflow lag` shows every group with the columns of
// kafka-consumer-groups --describe, the last stable offset and where the
// offsets live (Postgres wins for a projector, whose Kafka commits are a
// copy), and the parked partitions with their reason.
func TestLagCommand(t *testing.T) {
	t.Parallel()
	c := newProjCLI(t)
	ctx := context.Background()
	cl := pipelinetest.Client(t, c.brokers, kgo.RecordPartitioner(kgo.ManualPartitioner()))
	for _, topic := range []string{c.topics.Commands(), c.topics.Events()} {
		for p := int32(0); p < 2; p++ {
			for i := 0; i < 5; i++ {
				if err := cl.ProduceSync(ctx, &kgo.Record{Topic: topic, Partition: p, Value: []byte("v")}).FirstErr(); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	adm := kadm.NewClient(cl)
	commit := func(group, topic string, offsets map[int32]int64) {
		o := kadm.Offsets{}
		for p, at := range offsets {
			o.Add(kadm.Offset{Topic: topic, Partition: p, At: at, LeaderEpoch: -1})
		}
		if _, err := adm.CommitOffsets(ctx, group, o); err != nil {
			t.Fatal(err)
		}
	}
	commit("onceflow-processor", c.topics.Commands(), map[int32]int64{0: 5, 1: 2})
	commit(projector.DefaultConsumer, c.topics.Events(), map[int32]int64{0: 1, 1: 1}) // stale monitoring copy
	c.exec(t, `INSERT INTO consumer_offsets (consumer, topic, partition, next_offset) VALUES ($1, $2, 0, 5), ($1, $2, 1, 3)`,
		projector.DefaultConsumer, c.topics.Events())
	c.exec(t, `INSERT INTO projector_parked (consumer, topic, partition, next_offset, reason, detail) VALUES ($1, $2, 1, 3, 'version-gap', 'accounts: version gap on acme/a')`,
		projector.DefaultConsumer, c.topics.Events())
	c.exec(t, `INSERT INTO projector_retrying (consumer, topic, partition, class, error, attempts) VALUES ($1, $2, 0, 'connection', 'commit: unexpected EOF', 12)`,
		projector.DefaultConsumer, c.topics.Events())

	out, err := c.run("lag")
	if err != nil {
		t.Fatalf("lag: %v\n%s", err, out)
	}
	t.Logf("onceflow lag:\n%s", out)
	lines := strings.Split(out, "\n")
	find := func(prefix ...string) string {
		for _, l := range lines {
			f := strings.Fields(l)
			if len(f) >= len(prefix) && projFieldsEqual(f[:len(prefix)], prefix) {
				return l
			}
		}
		t.Errorf("no line starting %v in:\n%s", prefix, out)
		return ""
	}
	for _, w := range []struct {
		prefix []string
		rest   []string // CURRENT OFFSETS-IN LOG-END LAST-STABLE LAG ... PARKED
	}{
		{[]string{"onceflow-processor", c.topics.Commands(), "0"}, []string{"5", "kafka", "5", "5", "0"}},
		{[]string{"onceflow-processor", c.topics.Commands(), "1"}, []string{"2", "kafka", "5", "5", "3"}},
		{[]string{projector.DefaultConsumer, c.topics.Events(), "0"}, []string{"5", "postgres", "5", "5", "0"}},
		{[]string{projector.DefaultConsumer, c.topics.Events(), "1"}, []string{"3", "postgres", "5", "5", "2"}},
	} {
		l := strings.Fields(find(w.prefix...))
		if len(l) < 8 || !projFieldsEqual(l[3:8], w.rest) {
			t.Errorf("%v: got %v, want %v", w.prefix, l, w.rest)
		}
	}
	lastTwo := func(l string) []string { f := strings.Fields(l); return f[max(0, len(f)-2):] } // PARKED RETRYING
	if l := find(projector.DefaultConsumer, c.topics.Events(), "1"); !projFieldsEqual(lastTwo(l), []string{"version-gap@3", "-"}) {
		t.Errorf("parked partition not marked: %q", l)
	}
	if l := find(projector.DefaultConsumer, c.topics.Events(), "0"); !projFieldsEqual(lastTwo(l), []string{"-", "connection"}) {
		t.Errorf("retrying partition not marked: %q", l)
	}
	for _, want := range []string{"GROUP", "LAST-STABLE", "OFFSETS-IN", "RETRYING", "parked partitions", "accounts: version gap on acme/a",
		"retrying partitions", "commit: unexpected EOF"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	// A newcomer's terminal: the table's rows fit in 150 columns; -wide
	// adds the member and client ids (a row was some 230 columns).
	table, _, _ := strings.Cut(out, "\n\n") // the tables of parks and retries below have their details
	for _, l := range strings.Split(table, "\n") {
		if n := utf8.RuneCountInString(strings.TrimRight(l, " ")); n > 150 {
			t.Errorf("a lag row of %d columns:\n%s", n, l)
		}
	}
	if wide, err := c.run("lag", "-wide"); err != nil || !strings.Contains(wide, "CONSUMER-ID") || !strings.Contains(wide, "CLIENT-ID") {
		t.Errorf("lag -wide: %v\n%s", err, wide)
	}

	out, err = c.run("lag", "-o", "json", "-group", projector.DefaultConsumer)
	if err != nil {
		t.Fatalf("lag -o json: %v\n%s", err, out)
	}
	var doc struct {
		Partitions []struct {
			Group     string `json:"group"`
			Partition int32  `json:"partition"`
			Current   int64  `json:"current_offset"`
			In        string `json:"offsets_in"`
			Lag       int64  `json:"lag"`
			Parked    string `json:"parked"`
			Retrying  string `json:"retrying"`
		} `json:"partitions"`
		Retrying []projector.RetryingPartition `json:"retrying"`
	}
	if err := json.Unmarshal([]byte(out), &doc); err != nil {
		t.Fatalf("json: %v\n%s", err, out)
	}
	if len(doc.Partitions) != 2 || doc.Partitions[1].Lag != 2 || doc.Partitions[1].Parked != "version-gap@3" || doc.Partitions[1].In != "postgres" {
		t.Errorf("json: %+v", doc.Partitions)
	}
	if len(doc.Partitions) == 2 && doc.Partitions[0].Retrying != "connection" || len(doc.Retrying) != 1 || doc.Retrying[0].Attempts != 12 {
		t.Errorf("json: retrying %+v, partitions %+v", doc.Retrying, doc.Partitions)
	}

	for _, bad := range [][]string{{"lag", "-o", "xml"}, {"lag", "-group", "nobody"}, {"lag", "extra"}} {
		if _, err := c.run(bad...); err == nil {
			t.Errorf("%v: no error", bad)
		}
	}
}

func projFieldsEqual(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// `onceflow projections rebuild` rebuilds through the CLI's own wiring
// (registry, serdes, database) and reports the swap; unpark removes parked
// rows; bad input is an error with a message.
func TestProjectionsCommands(t *testing.T) {
	t.Parallel()
	c := newProjCLI(t)
	ctx := context.Background()
	serdes := ledgerSerdes(t, c.topics) // the ids the CLI's registry gives without SCHEMA_REGISTRY_URL
	cl := pipelinetest.Client(t, c.brokers)
	var recs []*kgo.Record
	for a := 0; a < 3; a++ {
		cmd := pipeline.NewCommandID()
		agg := "acme/acc-" + strconv.Itoa(a)
		for v := int64(1); v <= 4; v++ {
			var m pipeline.Message = ledger.Deposited{Amount: 10}
			if v == 1 {
				m = ledger.AccountOpened{Currency: "EUR"}
			}
			value, err := serdes.Events.Encode(ctx, m)
			if err != nil {
				t.Fatal(err)
			}
			recs = append(recs, kafka.EventRecord(c.topics.Events(), pipeline.Event{ID: pipeline.EventID(agg, cmd, int(v)), CommandID: cmd,
				Tenant: "acme", AggregateID: agg, Version: v, Payload: m}, value))
		}
	}
	if err := cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		t.Fatal(err)
	}
	proj, err := projector.New(projector.Config{Topic: c.topics.Events()}, kafka.Config{Brokers: c.brokers}, c.pool, serdes.Events,
		ledgerProjections(), slog.New(slog.NewTextHandler(io.Discard, nil)), prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	pctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- proj.Run(pctx) }()
	pipelinetest.Eventually(t, 30*time.Second, func() error {
		var n int64
		c.pool.QueryRow(ctx, `SELECT coalesce(sum(next_offset), 0) FROM consumer_offsets WHERE consumer = $1`, projector.DefaultConsumer).Scan(&n)
		if n != int64(len(recs)) {
			return fmt.Errorf("projector at %d of %d", n, len(recs))
		}
		return nil
	})
	stop()
	if err := <-done; err != nil {
		t.Fatal(err)
	}

	out, err := c.run("projections", "rebuild", "-verify", "accounts")
	if err != nil {
		t.Fatalf("rebuild: %v\n%s", err, out)
	}
	if !strings.Contains(out, "rebuilt accounts") || !strings.Contains(out, "accounts: live 3 rows") || !strings.Contains(out, "identical") {
		t.Errorf("rebuild output:\n%s", out)
	}
	out, err = c.run("projections", "list")
	if err != nil || !strings.Contains(out, "audit_log") || !strings.Contains(out, "swapped") {
		t.Errorf("list: %v\n%s", err, out)
	}
	if !regexp.MustCompile(`swapped at offsets (\d+:\d+ ?)+ \(partition:offset\)`).MatchString(out) || strings.Contains(out, "map[") {
		t.Errorf("list shows the swap's offsets as a Go map, or not at all:\n%s", out)
	}

	c.exec(t, `INSERT INTO projector_parked (consumer, topic, partition, next_offset, reason, detail) VALUES ($1, $2, 1, 3, 'version-gap', 'x')`,
		projector.DefaultConsumer, c.topics.Events())
	if out, err := c.run("projections", "unpark", "1"); err != nil || !strings.Contains(out, "unparked 1") {
		t.Errorf("unpark: %v\n%s", err, out)
	}
	if _, err := c.run("projections", "unpark", "1"); err == nil {
		t.Error("unpark of a partition that is not parked: no error")
	}

	// Skipped on purpose: only at the parked offset, and recorded.
	c.exec(t, `INSERT INTO consumer_offsets (consumer, topic, partition, next_offset) VALUES ('skip-test', $1, 0, 5)`, c.topics.Events())
	c.exec(t, `INSERT INTO projector_parked (consumer, topic, partition, next_offset, reason, detail) VALUES ('skip-test', $1, 0, 5, 'projection-error', 'boom')`,
		c.topics.Events())
	if _, err := c.run("projections", "skip", "-consumer", "skip-test", "-note", "x", "-operator", "bob", "0", "4"); err == nil || !strings.Contains(err.Error(), "parked at 5") {
		t.Errorf("skip at another offset: %v, want a refusal naming where it is parked", err)
	}
	if out, err := c.run("projections", "skip", "-consumer", "skip-test", "-note", "bad test data", "-operator", "bob", "0", "5"); err != nil ||
		!strings.Contains(out, "skipped partition 0 of skip-test from 5 to 6") {
		t.Errorf("skip: %v\n%s", err, out)
	}
	var note, operator string
	var to int64
	if err := c.pool.QueryRow(ctx, `SELECT note, operator, to_offset FROM projector_skips WHERE consumer = 'skip-test'`).Scan(&note, &operator, &to); err != nil ||
		note != "bad test data" || operator != "bob" || to != 6 {
		t.Errorf("projector_skips: %q by %q to %d (%v)", note, operator, to, err)
	}

	for _, bad := range []struct {
		args []string
		want string
	}{
		{[]string{"projections", "skip", "0", "5"}, "usage"},
		{[]string{"projections", "skip", "-note", "why", "-operator", "bob", "x", "5"}, "want two numbers"},
		{[]string{"projections", "rebuild"}, "usage"},
		{[]string{"projections", "rebuild", "balances"}, "no projection named \"balances\""},
		{[]string{"projections", "unpark", "x"}, "partition \"x\""},
	} {
		if _, err := c.run(bad.args...); err == nil || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("%v: got %v, want an error with %q", bad.args, err, bad.want)
		}
	}
	var none bytes.Buffer
	if err := run(ctx, []string{"projections", "rebuild", "accounts"}, func(string) string { return "" }, &none); err == nil || !strings.Contains(err.Error(), "DATABASE_URL") {
		t.Errorf("rebuild without a database: %v", err)
	}
}
