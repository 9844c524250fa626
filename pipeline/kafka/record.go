package kafka

import (
	"fmt"
	"strconv"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/onceflow/onceflow/pipeline"
)

// The records of onceflow's topics, as docs/architecture.md#topics-keys-and-headers
// describes them: what a command and an event are on Kafka. Every part
// that writes or reads them goes through this file: ingest (the outbox
// row's headers), the processor (commands in, events and commands out),
// the projector (events in), the operator commands and the tests.

// CommandHeaders are the headers of a command record: command-id, tenant,
// command-type and, when given, traceparent.
func CommandHeaders(id pipeline.ID, tenant, commandType, traceparent string) []kgo.RecordHeader {
	h := []kgo.RecordHeader{
		{Key: pipeline.HeaderCommandID, Value: []byte(id.String())},
		{Key: pipeline.HeaderTenant, Value: []byte(tenant)},
		{Key: pipeline.HeaderCommandType, Value: []byte(commandType)},
	}
	if traceparent != "" {
		h = append(h, kgo.RecordHeader{Key: pipeline.HeaderTraceparent, Value: []byte(traceparent)})
	}
	return h
}

// CommandRecord returns a command as the processor expects to find it on the
// commands topic, for any producer of commands: the key is the aggregate id
// ("tenant/local-id"), the value the encoded command (Confluent-framed Avro
// of the topic's schema), the headers CommandHeaders with the aggregate
// id's tenant. The record timestamp is the command's time, which deciders
// and the dedup window use; a zero at leaves it to the client (now).
// Produce it with the default (murmur2) key partitioner.
func CommandRecord(topic, aggregateID string, id pipeline.ID, commandType string, value []byte, at time.Time, traceparent string) (*kgo.Record, error) {
	tenant, _, err := pipeline.SplitAggregateID(aggregateID)
	if err != nil {
		return nil, err
	}
	if id.IsZero() {
		return nil, fmt.Errorf("command for %s: the command id is required", aggregateID)
	}
	return &kgo.Record{
		Topic: topic, Key: []byte(aggregateID), Value: value, Timestamp: at,
		Headers: CommandHeaders(id, tenant, commandType, traceparent),
	}, nil
}

// CommandFields are the parts of a command record that say which command
// it is, as they came: a producer may send anything, and the processor
// decides what is poison. Has* tell a header that is absent from one that
// is empty.
type CommandFields struct {
	CommandID, Tenant, CommandType, Traceparent []byte
	HasCommandID, HasTenant                     bool
	// AcceptedBy is the accepted-by header: who in the pipeline accepted
	// the command before it reached the topic (pipeline.HeaderAcceptedBy).
	AcceptedBy []byte
}

// CommandFieldsOf reads r's command headers.
func CommandFieldsOf(r *kgo.Record) CommandFields {
	var f CommandFields
	for _, h := range r.Headers {
		switch h.Key {
		case pipeline.HeaderCommandID:
			f.CommandID, f.HasCommandID = h.Value, true
		case pipeline.HeaderTenant:
			f.Tenant, f.HasTenant = h.Value, true
		case pipeline.HeaderCommandType:
			f.CommandType = h.Value
		case pipeline.HeaderTraceparent:
			f.Traceparent = h.Value
		case pipeline.HeaderAcceptedBy:
			f.AcceptedBy = h.Value
		}
	}
	return f
}

// EventRecord returns ev as it goes to an events topic, its payload
// already encoded as value: keyed by the aggregate id, timestamped with
// the event's time, with the headers event-id, event-type, command-id,
// aggregate-version, tenant and, when set, command-type, traceparent and a
// derived-command for each command of ev.Derived.
func EventRecord(topic string, ev pipeline.Event, value []byte) *kgo.Record {
	rec := &kgo.Record{
		Topic: topic, Key: []byte(ev.AggregateID), Value: value, Timestamp: ev.Time,
		Headers: []kgo.RecordHeader{
			{Key: pipeline.HeaderEventID, Value: []byte(ev.ID.String())},
			{Key: pipeline.HeaderEventType, Value: []byte(ev.Type())},
			{Key: pipeline.HeaderCommandID, Value: []byte(ev.CommandID.String())},
			{Key: pipeline.HeaderAggregateVersion, Value: []byte(strconv.FormatInt(ev.Version, 10))},
			{Key: pipeline.HeaderTenant, Value: []byte(ev.Tenant)},
		},
	}
	if ev.CommandType != "" {
		rec.Headers = append(rec.Headers, kgo.RecordHeader{Key: pipeline.HeaderCommandType, Value: []byte(ev.CommandType)})
	}
	if ev.Traceparent != "" {
		rec.Headers = append(rec.Headers, kgo.RecordHeader{Key: pipeline.HeaderTraceparent, Value: []byte(ev.Traceparent)})
	}
	for _, d := range ev.Derived {
		rec.Headers = append(rec.Headers, kgo.RecordHeader{Key: pipeline.HeaderDerivedCommand, Value: []byte(d.String())})
	}
	return rec
}

// EventOf reads the envelope of the event r holds, everything but its
// payload (which the topic's serde decodes from r.Value). An error names
// the header at fault: the record can never be read.
func EventOf(r *kgo.Record) (pipeline.Event, error) {
	e := pipeline.Event{AggregateID: string(r.Key), Time: r.Timestamp}
	var err error
	for _, h := range r.Headers {
		switch h.Key {
		case pipeline.HeaderEventID:
			e.ID, err = pipeline.ParseID(string(h.Value))
		case pipeline.HeaderCommandID:
			e.CommandID, err = pipeline.ParseID(string(h.Value))
		case pipeline.HeaderAggregateVersion:
			e.Version, err = strconv.ParseInt(string(h.Value), 10, 64)
		case pipeline.HeaderTenant:
			e.Tenant = string(h.Value)
		case pipeline.HeaderCommandType:
			e.CommandType = string(h.Value)
		case pipeline.HeaderTraceparent:
			e.Traceparent = string(h.Value)
		case pipeline.HeaderDerivedCommand:
			var d pipeline.CommandRef
			if d, err = pipeline.ParseCommandRef(string(h.Value)); err == nil {
				e.Derived = append(e.Derived, d)
			}
		}
		if err != nil {
			return e, fmt.Errorf("%s: %v", h.Key, err)
		}
	}
	if e.ID.IsZero() {
		return e, fmt.Errorf("no %s header", pipeline.HeaderEventID)
	}
	return e, nil
}
