package natsink

import (
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/onceflow/onceflow/pipeline"
	"github.com/onceflow/onceflow/pipeline/kafka"
)

func TestSubjectToken(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{"acme", "acme"},
		{"Deposited", "Deposited"},
		{"a-b_c9", "a-b_c9"},
		{"acme.eu", "acme%2Eeu"},
		{"*", "%2A"},
		{">", "%3E"},
		{"a b", "a%20b"},
		{"100%", "100%25"},
		{"é", "%C3%A9"},
		{"", "%"},
	} {
		if got := SubjectToken(c.in); got != c.want {
			t.Errorf("SubjectToken(%q) = %q, want %q", c.in, got, c.want)
		}
	}
	if got, want := Subject("ledger.events", "acme.eu", "Deposited"), "ledger.events.acme%2Eeu.Deposited"; got != want {
		t.Errorf("Subject = %q, want %q", got, want)
	}
}

func TestCovers(t *testing.T) {
	for _, c := range []struct {
		pattern, filter string
		want            bool
	}{
		{"ledger.events.>", "ledger.events.>", true},
		{"ledger.>", "ledger.events.>", true},
		{">", "ledger.events.>", true},
		{"ledger.*.>", "ledger.events.>", true},
		{"ledger.events.*", "ledger.events.>", false},
		{"ledger.events.*.*", "ledger.events.>", false},
		{"ledger.events", "ledger.events.>", false},
		{"ledger.events.>", "ledger.>", false},
		{"other.>", "ledger.events.>", false},
		{"ledger.events.>.x", "ledger.events.>", true}, // '>' ends a pattern; the server refuses more
	} {
		if got := covers(c.pattern, c.filter); got != c.want {
			t.Errorf("covers(%q, %q) = %v, want %v", c.pattern, c.filter, got, c.want)
		}
	}
}

func TestConfigDefaultsAndErrors(t *testing.T) {
	c := Config{Topic: "ledger.events", URL: "nats://127.0.0.1:4222"}
	if err := c.setDefaults(); err != nil {
		t.Fatal(err)
	}
	if c.Stream != "ledger_events" || c.Subject != "ledger.events" || c.Group != DefaultGroup ||
		c.DuplicateWindow != DefaultDuplicateWindow || c.MaxInFlight != DefaultMaxInFlight || c.Replicas != DefaultReplicas {
		t.Errorf("defaults: %+v", c)
	}
	for _, bad := range []struct {
		cfg  Config
		want string
	}{
		{Config{URL: "nats://x"}, "Topic is required"},
		{Config{Topic: "t.events"}, "URL is required"},
		{Config{Topic: "t.events", URL: "nats://x", DuplicateWindow: -time.Second}, "negative"},
		{Config{Topic: "t.events", URL: "nats://x", Stream: "a.b"}, "stream name"},
		{Config{Topic: "t.events", URL: "nats://x", Subject: "a.*"}, "subject"},
		{Config{Topic: "t.events", URL: "nats://x", Subject: "a..b"}, "subject"},
		{Config{Topic: "t.events", URL: "nats://x", Replicas: 1}, "ONCEFLOW_NATS_ALLOW_SINGLE_REPLICA"},
	} {
		if err := bad.cfg.setDefaults(); err == nil || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("%+v: %v, want an error saying %q", bad.cfg, err, bad.want)
		}
	}
}

// checkOrder counts an event stored after a later event of its aggregate,
// never one after another aggregate's, nor a duplicate (it stored nothing).
func TestCheckOrder(t *testing.T) {
	s, err := New(Config{Topic: "t.events", URL: "nats://x"}, kafka.Config{}, nil, prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	acked := func(key string, seq uint64, dup bool) entry {
		return entry{rec: &kgo.Record{Key: []byte(key)}, ack: &jetstream.PubAck{Sequence: seq, Duplicate: dup}}
	}
	b := &batch{entries: []entry{
		acked("a/1", 10, false),
		acked("a/2", 9, false),  // another aggregate: in order for its own
		acked("a/1", 12, false), // retried: stored after the next one
		acked("a/1", 11, false), // counted
		acked("a/1", 3, true),   // a duplicate: not counted
		acked("a/2", 13, false),
	}}
	s.checkOrder(b)
	if got := testutil.ToFloat64(s.metrics.outOfOrder); got != 1 {
		t.Errorf("out of order %v, want 1", got)
	}
}

// message never fails on what a record holds: its subject is the prefix
// and two tokens without wildcards or spaces, its message id is never
// empty, and it carries no header but those the sink writes.
func FuzzMessage(f *testing.F) {
	f.Add("acme/acc-1", "acme", "Deposited", "0191a0b0-0000-5000-8000-000000000000", []byte{0, 0, 0, 0, 1})
	f.Add("", "", "", "", []byte(nil))
	f.Add("x", "a.b *>", "T\r\nNats-Expected-Stream: x", "not-a-uuid", []byte("v"))
	f.Fuzz(func(t *testing.T, key, tenant, eventType, eventID string, value []byte) {
		r := &kgo.Record{Topic: "t.events", Partition: 3, Offset: 7, Key: []byte(key), Value: value, Timestamp: time.Unix(1, 0),
			Headers: []kgo.RecordHeader{
				{Key: pipeline.HeaderTenant, Value: []byte(tenant)},
				{Key: pipeline.HeaderEventType, Value: []byte(eventType)},
				{Key: pipeline.HeaderEventID, Value: []byte(eventID)},
				{Key: "Nats-Expected-Stream", Value: []byte("other")},
			}}
		m, id, valid := message(r, "t.events")
		toks := strings.Split(m.Subject, ".")
		if len(toks) != 4 || toks[0] != "t" || toks[1] != "events" {
			t.Fatalf("subject %q: want t.events.TENANT.TYPE", m.Subject)
		}
		for _, tok := range toks[2:] {
			if tok == "" || tok == "*" || tok == ">" || strings.ContainsAny(tok, " \t\r\n.") {
				t.Fatalf("subject %q: token %q", m.Subject, tok)
			}
		}
		if id == "" || m.Header.Get(jetstream.MsgIDHeader) != id {
			t.Fatalf("message id %q, header %q", id, m.Header.Get(jetstream.MsgIDHeader))
		}
		if pid, err := pipeline.ParseID(eventID); valid != (err == nil && !pid.IsZero()) {
			t.Fatalf("event id %q: valid %v", eventID, valid)
		}
		for k := range m.Header {
			if strings.HasPrefix(k, "Nats-") && k != jetstream.MsgIDHeader {
				t.Fatalf("header %q carried over", k)
			}
		}
	})
}

// A message carries the event's headers as Kafka has them, each
// derived-command of a decision that sent several among them: what a NATS
// consumer follows to the commands an event led to (docs/consumers.md).
func TestMessageCarriesEveryDerivedCommand(t *testing.T) {
	credit := "994f8adf-0000-5000-8000-000000000001 CreditTransfer acme/b"
	fee := "994f8adf-0000-5000-8000-000000000002 CreditTransfer acme/fees"
	r := &kgo.Record{Topic: "t.events", Key: []byte("acme/a"), Value: []byte{0}, Timestamp: time.Unix(1, 0),
		Headers: []kgo.RecordHeader{
			{Key: pipeline.HeaderEventID, Value: []byte("0191a0b0-0000-5000-8000-000000000000")},
			{Key: pipeline.HeaderTenant, Value: []byte("acme")},
			{Key: pipeline.HeaderEventType, Value: []byte("TransferDebited")},
			{Key: pipeline.HeaderDerivedCommand, Value: []byte(credit)},
			{Key: pipeline.HeaderDerivedCommand, Value: []byte(fee)},
		}}
	m, _, _ := message(r, "t.events")
	got := m.Header.Values(pipeline.HeaderDerivedCommand)
	if len(got) != 2 || got[0] != credit || got[1] != fee {
		t.Errorf("derived-command headers %q, want [%q %q]", got, credit, fee)
	}
	if got := m.Header.Get(pipeline.HeaderEventType); got != "TransferDebited" {
		t.Errorf("event-type %q", got)
	}
}
