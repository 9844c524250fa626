// Package consumers checks docs/consumers.md with a client that shares no
// code with onceflow: consume.py (librdkafka through Debian's
// python3-confluent-kafka, Avro through python3-avro) reads {prefix}.events
// of the embedded default after a workload, and this test checks what it
// printed against the topic as onceflow wrote it.
package consumers

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/linkedin/goavro/v2"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/onceflow/onceflow"
	"github.com/onceflow/onceflow/examples/ledger"
	"github.com/onceflow/onceflow/examples/ledger/ledgerapp"
	"github.com/onceflow/onceflow/onceflowtest"
	"github.com/onceflow/onceflow/pipeline"
	"github.com/onceflow/onceflow/pipeline/apiclient"
	"github.com/onceflow/onceflow/pipeline/avro"
	"github.com/onceflow/onceflow/pipeline/kafka"
	"github.com/onceflow/onceflow/pipeline/pipelinetest"
)

// python returns a Python 3 that has confluent_kafka and avro, or skips.
func python(t *testing.T) string {
	t.Helper()
	var tried []string
	for _, name := range []string{"python3", "/usr/bin/python3"} {
		path, err := exec.LookPath(name)
		if err != nil {
			continue
		}
		if out, err := exec.Command(path, "-c", "import confluent_kafka, avro.io").CombinedOutput(); err != nil {
			tried = append(tried, fmt.Sprintf("%s: %s", path, strings.TrimSpace(string(out))))
			continue
		}
		return path
	}
	t.Skipf("no python3 with confluent_kafka and avro (Debian: apt-get install python3-confluent-kafka python3-avro; .ci/run installs them): %v", tried)
	return ""
}

// event is one line consume.py prints.
type event struct {
	EventID          string          `json:"event_id"`
	EventType        string          `json:"event_type"`
	CommandID        string          `json:"command_id"`
	AggregateVersion int64           `json:"aggregate_version"`
	Tenant           string          `json:"tenant"`
	CommandType      *string         `json:"command_type"`
	Traceparent      *string         `json:"traceparent"`
	Key              string          `json:"key"`
	Partition        int32           `json:"partition"`
	KeyPartition     int32           `json:"key_partition"`
	Offset           int64           `json:"offset"`
	TimestampMS      int64           `json:"timestamp_ms"`
	SchemaID         int             `json:"schema_id"`
	Record           string          `json:"record"`
	Value            json.RawMessage `json:"value"`
}

const traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"

// A consumer in another language that follows docs/consumers.md reads
// every committed event once (not an aborted transaction's, not a copy
// twice), with the headers onceflow wrote, decodes each by its writer's
// schema id, sees an aggregate's events in one partition (murmur2 of the
// key) in version order, with rejections and failures at the version they
// did not change, and its group's lag reaches 0.
func TestPythonConsumerFollowsTheContract(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the embedded default and a Python consumer")
	}
	py := python(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	// The embedded default, as `onceflow dev` runs it; on the cluster
	// KAFKA_BROKERS names, when it does (make test-kafka), with topics of
	// its own.
	const apiKey = "consumers-test-key"
	topics := kafka.Topics{Prefix: "ledger", Partitions: 4}
	external := kafka.ParseBrokers(os.Getenv("KAFKA_BROKERS"))
	if len(external) > 0 {
		topics.Prefix = fmt.Sprintf("ledger-consumers-%d", time.Now().UnixNano())
	}
	addrs, _ := onceflowtest.Dev(t, onceflow.DevConfig{
		RunConfig: onceflow.RunConfig{
			Config: onceflow.Config{
				Domains: []*onceflow.Domain{ledgerapp.Domain()},
				Kafka:   kafka.Config{Brokers: external},
				Topics:  topics, DatabaseURL: pipelinetest.DatabaseURL(t),
				Logger: slog.New(slog.DiscardHandler), InstanceID: "consumers-test",
			},
		},
		ExternalKafka: len(external) > 0,
		APIKey:        apiKey, Out: io.Discard,
	})
	brokers := kafka.ParseBrokers(addrs.Kafka)
	api := &ledgerapp.Client{Client: &apiclient.Client{BaseURL: "http://" + addrs.HTTP, APIKey: apiKey}}

	// The workload: two accounts, a deposit with a trace context and its
	// retry (the same Idempotency-Key: one command), a rejected
	// withdrawal, a transfer (events on both accounts), a command produced
	// to Kafka twice with one command id (one decision), and a poison
	// command (the DLQ and a CommandFailed event).
	var commandIDs []string
	send := func(a apiclient.Accepted, _ *apiclient.Response, err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		commandIDs = append(commandIDs, a.CommandID)
	}
	send(api.OpenAccount(ctx, "open-a", "acc-a", "EUR"))
	send(api.OpenAccount(ctx, "open-b", "acc-b", "EUR"))
	deposit := func() string {
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, api.BaseURL+"/v1/accounts/acc-a/deposits", strings.NewReader(`{"amount":1000}`))
		req.Header.Set("Authorization", "Bearer "+apiKey)
		req.Header.Set("Idempotency-Key", "dep-1")
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("traceparent", traceparent)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var a apiclient.Accepted
		if err := json.NewDecoder(resp.Body).Decode(&a); err != nil || resp.StatusCode != http.StatusAccepted {
			t.Fatalf("deposit: %d %v", resp.StatusCode, err)
		}
		return a.CommandID
	}
	first, retry := deposit(), deposit()
	if first != retry {
		t.Fatalf("a retry with the same key got command %s, the first %s", retry, first)
	}
	commandIDs = append(commandIDs, first)
	send(api.Withdraw(ctx, "wd-b", "acc-b", 5000)) // rejected: insufficient funds
	// Decided before the transfer is sent: the transfer's credit reaches
	// acc-b through acc-a's partition and the processor, and would
	// otherwise race the withdrawal, sent through the outbox to acc-b's.
	if cmd, err := api.WaitCommand(ctx, commandIDs[len(commandIDs)-1]); err != nil || cmd.Status != "rejected" {
		t.Fatalf("withdrawal: %+v, %v", cmd, err)
	}
	send(api.Transfer(ctx, "tr-1", "t-1", "acc-a", "acc-b", 300))
	for _, id := range commandIDs {
		if cmd, err := api.WaitCommand(ctx, id); err != nil || cmd.Status == "pending" {
			t.Fatalf("command %s: %+v, %v", id, cmd, err)
		}
	}

	reg, err := avro.NewClient(addrs.RegistryURL)
	if err != nil {
		t.Fatal(err)
	}
	serdes, err := onceflow.NewSerdes(ctx, reg, ledgerapp.Domain(), "", topics)
	if err != nil {
		t.Fatal(err)
	}
	value, err := serdes.Commands.Encode(ctx, ledger.Deposit{Amount: 7})
	if err != nil {
		t.Fatal(err)
	}
	twice := pipeline.NewCommandID()
	poison := pipeline.NewCommandID()
	prod := pipelinetest.Client(t, brokers)
	for _, c := range []struct {
		id    pipeline.ID
		value []byte
	}{{twice, value}, {twice, value}, {poison, []byte("not avro")}} {
		rec, err := kafka.CommandRecord(topics.Commands(), onceflow.DemoTenant+"/acc-a", c.id, "Deposit", c.value, time.Time{}, "")
		if err != nil {
			t.Fatal(err)
		}
		if err := prod.ProduceSync(ctx, rec).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	if cmd, err := api.WaitCommand(ctx, twice.String()); err != nil || cmd.Status != "accepted" {
		t.Fatalf("command %s produced twice: %+v, %v", twice, cmd, err)
	}
	// The poison command's DLQ record commits with its CommandFailed event
	// (where the processor emits one), so once it is there, so is that.
	waitDLQ(t, ctx, brokers, topics.DLQ(), poison)

	// The topic as onceflow wrote it, read committed to its end.
	truth := readEvents(t, ctx, brokers, topics.Events())
	byID := map[string]*kgo.Record{}
	for _, r := range truth {
		byID[header(r, pipeline.HeaderEventID)] = r
	}
	failed := ""
	for _, r := range truth {
		if header(r, pipeline.HeaderEventType) == "CommandFailed" {
			failed = " CommandFailed"
		}
	}
	if want := 7 + len(strings.Fields(failed)); len(byID) != want || len(truth) != want {
		t.Fatalf("the events topic holds %d events (%d distinct), want %d", len(truth), len(byID), want)
	}
	if failed == "" {
		t.Log("the processor emitted no CommandFailed event for the poison command")
	}

	// What a consumer must not trip over: a copy of a committed event (as
	// a replay or an at-least-once producer delivers it), and an aborted
	// transaction's event.
	orig := truth[0]
	dup := pipelinetest.Client(t, brokers, kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err := dup.ProduceSync(ctx, &kgo.Record{Topic: orig.Topic, Partition: orig.Partition, Key: orig.Key, Value: orig.Value,
		Headers: orig.Headers, Timestamp: orig.Timestamp}).FirstErr(); err != nil {
		t.Fatal(err)
	}
	const abortedID = "00000000-0000-5000-8000-00000000dead"
	txn := pipelinetest.Client(t, brokers, kgo.TransactionalID("consumers-test-aborted"), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err := txn.BeginTransaction(); err != nil {
		t.Fatal(err)
	}
	aborted := &kgo.Record{Topic: orig.Topic, Partition: orig.Partition, Key: orig.Key, Value: orig.Value, Timestamp: orig.Timestamp}
	for _, h := range orig.Headers {
		if h.Key == pipeline.HeaderEventID {
			h.Value = []byte(abortedID)
		}
		aborted.Headers = append(aborted.Headers, h)
	}
	if err := txn.ProduceSync(ctx, aborted).FirstErr(); err != nil {
		t.Fatal(err)
	}
	if err := txn.EndTransaction(ctx, kgo.TryAbort); err != nil {
		t.Fatal(err)
	}

	// The Python consumer.
	const group = "python-consumer"
	cmd := exec.CommandContext(ctx, py, "consume.py", "--brokers", addrs.Kafka, "--registry", addrs.RegistryURL,
		"--topic", topics.Events(), "--group", group)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("consume.py: %v\n%s", err, stderr.String())
	}
	t.Logf("consume.py: %s", strings.TrimSpace(stderr.String()))
	var got []event
	dec := json.NewDecoder(&stdout)
	for dec.More() {
		var e event
		if err := dec.Decode(&e); err != nil {
			t.Fatalf("consume.py output: %v", err)
		}
		got = append(got, e)
	}

	// Every event once, as written.
	seen := map[string]bool{}
	schemas := map[int]*goavro.Codec{}
	for _, e := range got {
		if seen[e.EventID] {
			t.Errorf("event %s printed twice", e.EventID)
		}
		seen[e.EventID] = true
		r, ok := byID[e.EventID]
		if !ok {
			t.Errorf("event %s (%s at %d/%d) is not a committed event", e.EventID, e.EventType, e.Partition, e.Offset)
			continue
		}
		if e.Partition != r.Partition || e.Offset != r.Offset {
			t.Errorf("event %s at %d/%d, want its first copy at %d/%d", e.EventID, e.Partition, e.Offset, r.Partition, r.Offset)
		}
		want := map[string]string{"event-type": e.EventType, "command-id": e.CommandID, "tenant": e.Tenant,
			"aggregate-version": strconv.FormatInt(e.AggregateVersion, 10)}
		for k, v := range want {
			if h := header(r, k); h != v {
				t.Errorf("event %s: %s %q, want %q", e.EventID, k, v, h)
			}
		}
		if ct := header(r, pipeline.HeaderCommandType); e.CommandType == nil || *e.CommandType != ct || ct == "" {
			t.Errorf("event %s: command-type %v, want %q (every event names its command's type)", e.EventID, e.CommandType, ct)
		}
		if tp := header(r, pipeline.HeaderTraceparent); e.Traceparent == nil && tp != "" || e.Traceparent != nil && *e.Traceparent != tp {
			t.Errorf("event %s: traceparent %v, want %q", e.EventID, e.Traceparent, tp)
		}
		if e.Key != string(r.Key) || e.Tenant != onceflow.DemoTenant || !strings.HasPrefix(e.Key, e.Tenant+"/") {
			t.Errorf("event %s: key %q tenant %q, want key %q of tenant %s", e.EventID, e.Key, e.Tenant, r.Key, onceflow.DemoTenant)
		}
		if e.TimestampMS != r.Timestamp.UnixMilli() {
			t.Errorf("event %s: timestamp %d, want %d", e.EventID, e.TimestampMS, r.Timestamp.UnixMilli())
		}
		// Decoded by the writer's schema, the same as an independent
		// decoder (goavro) reads it.
		id, payload, err := avro.ParseHeader(r.Value)
		if err != nil || id != e.SchemaID {
			t.Errorf("event %s: schema id %d, want %d (%v)", e.EventID, e.SchemaID, id, err)
			continue
		}
		codec := schemas[id]
		if codec == nil {
			text, err := reg.SchemaByID(ctx, id)
			if err != nil {
				t.Fatal(err)
			}
			if codec, err = goavro.NewCodec(text); err != nil {
				t.Fatal(err)
			}
			schemas[id] = codec
		}
		native, _, err := codec.NativeFromBinary(payload)
		if err != nil {
			t.Fatal(err)
		}
		union := native.(map[string]any)
		if _, ok := union[e.Record]; !ok || !strings.HasSuffix(e.Record, "."+e.EventType) {
			t.Errorf("event %s: record %s, want the branch %v named by event-type %s", e.EventID, e.Record, union, e.EventType)
			continue
		}
		if w, g := normalize(t, union[e.Record]), normalize(t, e.Value); !reflect.DeepEqual(w, g) {
			t.Errorf("event %s (%s): value %v, want %v", e.EventID, e.EventType, g, w)
		}
	}
	for id, r := range byID {
		if !seen[id] {
			t.Errorf("event %s (%s) at %d/%d not printed", id, header(r, pipeline.HeaderEventType), r.Partition, r.Offset)
		}
	}
	if seen[abortedID] {
		t.Errorf("the aborted transaction's event was printed")
	}

	// Per aggregate: one partition, murmur2 of the key; versions in
	// order, a rejection or failure at the version it did not change.
	type agg struct {
		partition int32
		version   int64
		offset    int64
		types     []string
	}
	aggs := map[string]*agg{}
	for _, e := range got {
		if e.Partition != e.KeyPartition {
			t.Errorf("event %s of %s in partition %d, murmur2 of its key says %d", e.EventID, e.Key, e.Partition, e.KeyPartition)
		}
		a := aggs[e.Key]
		if a == nil {
			a = &agg{partition: e.Partition, offset: -1}
			aggs[e.Key] = a
		}
		want := a.version + 1
		if e.EventType == "CommandRejected" || e.EventType == "CommandFailed" {
			want = a.version
		}
		if e.Partition != a.partition || e.Offset <= a.offset || e.AggregateVersion != want {
			t.Errorf("%s: %s at %d/%d version %d after %v (version %d at %d/%d)", e.Key, e.EventType, e.Partition, e.Offset,
				e.AggregateVersion, a.types, a.version, a.partition, a.offset)
		}
		a.version, a.offset, a.types = e.AggregateVersion, e.Offset, append(a.types, e.EventType)
	}
	wantTypes := map[string]string{
		"demo/acc-a": "AccountOpened Deposited TransferDebited Deposited" + failed,
		"demo/acc-b": "AccountOpened CommandRejected TransferCredited",
	}
	for k, w := range wantTypes {
		if aggs[k] == nil || strings.Join(aggs[k].types, " ") != w {
			t.Errorf("%s: events %v, want %s", k, aggs[k], w)
		}
	}

	// The Python group committed as it read: its lag, against the last
	// stable offset, is 0 although commit markers follow its offsets.
	rows, err := kafka.Lag(ctx, pipelinetest.Client(t, brokers), []kafka.LagSource{{Group: group}})
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range rows {
		if r.Lag != 0 || r.LagSeconds != 0 {
			t.Errorf("group %s partition %d: lag %d (%.1f s), want 0 (offset %d, last stable %d)", group, r.Partition, r.Lag, r.LagSeconds, r.Committed, r.LastStable)
		}
	}
	if len(rows) == 0 {
		t.Errorf("group %s has no offsets", group)
	}
}

// readEvents reads topic read_committed from its start until a group's lag
// on every partition is 0.
func readEvents(t *testing.T, ctx context.Context, brokers []string, topic string) []*kgo.Record {
	t.Helper()
	const group = "consumers-test-truth"
	cl := pipelinetest.Client(t, brokers, kgo.ConsumerGroup(group), kgo.ConsumeTopics(topic), kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		kgo.DisableAutoCommit(), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	meter := kafka.NewLagMeter(pipelinetest.Client(t, brokers))
	var out []*kgo.Record
	for {
		pollCtx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
		fs := cl.PollFetches(pollCtx)
		cancel()
		out = append(out, fs.Records()...)
		if err := cl.CommitUncommittedOffsets(ctx); err != nil {
			t.Fatal(err)
		}
		rows, err := meter.Lag(ctx, []kafka.LagSource{{Group: group, Topics: []string{topic}}})
		if err != nil {
			t.Fatal(err)
		}
		behind := false
		for _, r := range rows {
			behind = behind || r.Lag > 0
		}
		if !behind {
			return out
		}
		if ctx.Err() != nil {
			t.Fatalf("reading %s: %v", topic, ctx.Err())
		}
	}
}

// waitDLQ waits until the command id's record is in the DLQ topic.
func waitDLQ(t *testing.T, ctx context.Context, brokers []string, topic string, id pipeline.ID) {
	t.Helper()
	cl := pipelinetest.Client(t, brokers, kgo.ConsumeTopics(topic), kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	for {
		fs := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			t.Fatalf("command %s not in %s: %v", id, topic, ctx.Err())
		}
		for _, r := range fs.Records() {
			if header(r, pipeline.HeaderCommandID) == id.String() {
				return
			}
		}
	}
}

func header(r *kgo.Record, key string) string {
	for _, h := range r.Headers {
		if h.Key == key {
			return string(h.Value)
		}
	}
	return ""
}

// normalize returns v as JSON would decode it.
func normalize(t *testing.T, v any) any {
	t.Helper()
	b, ok := v.(json.RawMessage)
	if !ok {
		var err error
		if b, err = json.Marshal(v); err != nil {
			t.Fatal(err)
		}
	}
	var out any
	if err := json.Unmarshal(b, &out); err != nil {
		t.Fatal(err)
	}
	return out
}
