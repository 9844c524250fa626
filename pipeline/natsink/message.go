package natsink

import (
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/onceflow/onceflow/pipeline"
)

// The headers a message carries besides the event's own (event-id,
// event-type, command-id, aggregate-version, tenant, command-type and
// traceparent, copied from the record as they are): what Kafka holds
// outside its headers.
const (
	// HeaderAggregateID is the record's key: the aggregate id
	// (tenant/local-id).
	HeaderAggregateID = "aggregate-id"
	// HeaderEventTime is the record's timestamp, the event's time (its
	// command's), RFC 3339 in UTC with nanoseconds.
	HeaderEventTime = "event-time"
	// HeaderKafkaPartition and HeaderKafkaOffset are where the record is in
	// the events topic, in decimal.
	HeaderKafkaPartition = "kafka-partition"
	HeaderKafkaOffset    = "kafka-offset"
)

// copied are the record headers a message carries, in the order it
// writes them. derived-command may come several times (one per command
// the decision sent); the message carries each, in the record's order.
var copied = []string{
	pipeline.HeaderEventID, pipeline.HeaderEventType, pipeline.HeaderCommandID, pipeline.HeaderAggregateVersion,
	pipeline.HeaderTenant, pipeline.HeaderCommandType, pipeline.HeaderTraceparent, pipeline.HeaderDerivedCommand,
}

// Subject returns the subject of an event of tenant and eventType under
// the subject prefix: {prefix}.{tenant}.{event-type}, each of the two
// tokens escaped by SubjectToken.
func Subject(prefix, tenant, eventType string) string {
	return prefix + "." + SubjectToken(tenant) + "." + SubjectToken(eventType)
}

// SubjectToken makes s one subject token: every byte but ASCII letters,
// digits, '-' and '_' becomes '%' and two uppercase hex digits (a tenant
// "acme.eu" is the token "acme%2Eeu", so it cannot add a token or be a
// wildcard); an empty s (a record without the header) is "%", which no
// escaped text can be.
func SubjectToken(s string) string {
	if s == "" {
		return "%"
	}
	plain := true
	for i := 0; i < len(s); i++ {
		if !tokenByte(s[i]) {
			plain = false
			break
		}
	}
	if plain {
		return s
	}
	const hex = "0123456789ABCDEF"
	var b strings.Builder
	b.Grow(len(s) + 8)
	for i := 0; i < len(s); i++ {
		c := s[i]
		if tokenByte(c) {
			b.WriteByte(c)
			continue
		}
		b.WriteByte('%')
		b.WriteByte(hex[c>>4])
		b.WriteByte(hex[c&0xF])
	}
	return b.String()
}

func tokenByte(c byte) bool {
	return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '-' || c == '_'
}

// message is what the sink publishes for r: the value as it is
// (Confluent-framed Avro), the event's headers, the record's key, time and
// position, on the event's subject. id is its Nats-Msg-Id: the event id,
// or, for a record whose event-id header is missing or no UUID (the
// processor never writes one), the record's position in the topic, which
// is as stable; valid says which.
func message(r *kgo.Record, subject string) (m *nats.Msg, id string, valid bool) {
	h := make(nats.Header, len(copied)+5)
	var tenant, eventType string
	for _, rh := range r.Headers {
		for _, k := range copied {
			if rh.Key == k {
				if k == pipeline.HeaderDerivedCommand {
					h[k] = append(h[k], string(rh.Value))
				} else {
					h[k] = []string{string(rh.Value)}
				}
				break
			}
		}
		switch rh.Key {
		case pipeline.HeaderEventID:
			if ev, err := pipeline.ParseID(string(rh.Value)); err == nil && !ev.IsZero() {
				id, valid = ev.String(), true
			}
		case pipeline.HeaderTenant:
			tenant = string(rh.Value)
		case pipeline.HeaderEventType:
			eventType = string(rh.Value)
		}
	}
	if !valid {
		id = r.Topic + "/" + strconv.FormatInt(int64(r.Partition), 10) + "/" + strconv.FormatInt(r.Offset, 10)
	}
	h[jetstream.MsgIDHeader] = []string{id}
	h[HeaderAggregateID] = []string{string(r.Key)}
	h[HeaderEventTime] = []string{r.Timestamp.UTC().Format(time.RFC3339Nano)}
	h[HeaderKafkaPartition] = []string{strconv.FormatInt(int64(r.Partition), 10)}
	h[HeaderKafkaOffset] = []string{strconv.FormatInt(r.Offset, 10)}
	return &nats.Msg{Subject: Subject(subject, tenant, eventType), Header: h, Data: r.Value}, id, valid
}
