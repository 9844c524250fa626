package processor

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"sort"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/onceflow/onceflow/pipeline"
	"github.com/onceflow/onceflow/pipeline/kafka"
)

// JSONCommand is a command written as JSON, as `onceflow produce` reads it
// (one object per line):
//
//	{"aggregate_id":"acme/acc-1","type":"Deposit","payload":{"amount":100},
//	 "command_id":"01890a5d-ac96-774b-bcce-b302099a8057"}
//
// command_id is optional (a new UUIDv7); time (RFC 3339, the command's time)
// and traceparent are optional too. Send a command again with the same
// command_id and the processor recognizes it.
type JSONCommand struct {
	AggregateID string          `json:"aggregate_id"`
	Type        string          `json:"type"`
	CommandID   string          `json:"command_id,omitempty"`
	Time        time.Time       `json:"time,omitzero"`
	Traceparent string          `json:"traceparent,omitempty"`
	Payload     json.RawMessage `json:"payload"`
}

// ParseJSONCommand parses one JSONCommand strictly: unknown fields and
// trailing data are errors.
func ParseJSONCommand(b []byte) (JSONCommand, error) {
	var c JSONCommand
	if err := strictJSON(b, &c); err != nil {
		return c, err
	}
	return c, nil
}

// Encoder encodes command payloads (the commands topic's serde).
type Encoder interface {
	Encode(ctx context.Context, v any) ([]byte, error)
}

// Record checks the command and returns it as a record of topic, encoded
// with enc. types maps the Avro full name of each command record to a zero
// value of its Go type (ledger.CommandTypes()); the payload must have every
// field of that type and no other. now is the command's time when the JSON
// gives none.
func (c JSONCommand) Record(ctx context.Context, topic string, enc Encoder, types map[string]any, now time.Time) (*kgo.Record, pipeline.ID, error) {
	tenant, local, err := pipeline.SplitAggregateID(c.AggregateID)
	if err != nil {
		return nil, pipeline.Nil, err
	}
	if err := pipeline.ValidateLocalID(tenant); err != nil {
		return nil, pipeline.Nil, fmt.Errorf("tenant %q: %w", tenant, err)
	}
	if err := pipeline.ValidateLocalID(local); err != nil {
		return nil, pipeline.Nil, fmt.Errorf("aggregate id %q: %w", local, err)
	}
	id := pipeline.NewCommandID()
	if c.CommandID != "" {
		if id, err = pipeline.ParseID(c.CommandID); err != nil {
			return nil, pipeline.Nil, fmt.Errorf("command_id %q: %w", c.CommandID, err)
		}
	}
	msg, err := CommandFromJSON(types, c.Type, c.Payload)
	if err != nil {
		return nil, pipeline.Nil, err
	}
	value, err := enc.Encode(ctx, msg)
	if err != nil {
		return nil, pipeline.Nil, fmt.Errorf("encode %s: %w", c.Type, err)
	}
	at := c.Time
	if at.IsZero() {
		at = now
	}
	r, err := kafka.CommandRecord(topic, c.AggregateID, id, msg.MessageType(), value, at, c.Traceparent)
	return r, id, err
}

// CommandFromJSON decodes payload into the command type named typ (its
// MessageType, e.g. "Deposit"), strictly: every field of the type must be
// present, no other field may be.
func CommandFromJSON(types map[string]any, typ string, payload []byte) (pipeline.Message, error) {
	var names []string
	for _, zero := range types {
		m, ok := zero.(pipeline.Message)
		if !ok {
			continue
		}
		names = append(names, m.MessageType())
		if m.MessageType() != typ {
			continue
		}
		t := reflect.TypeOf(zero)
		v := reflect.New(t)
		if len(bytes.TrimSpace(payload)) == 0 {
			payload = []byte("{}")
		}
		if err := strictJSON(payload, v.Interface()); err != nil {
			return nil, fmt.Errorf("payload of %s: %w", typ, err)
		}
		var present map[string]json.RawMessage
		if err := json.Unmarshal(payload, &present); err != nil {
			return nil, fmt.Errorf("payload of %s: %w", typ, err)
		}
		for i := range t.NumField() {
			name, _, _ := strings.Cut(t.Field(i).Tag.Get("json"), ",")
			if name == "" || name == "-" {
				continue
			}
			if _, ok := present[name]; !ok {
				return nil, fmt.Errorf("payload of %s lacks %q", typ, name)
			}
		}
		return v.Elem().Interface().(pipeline.Message), nil
	}
	sort.Strings(names)
	return nil, fmt.Errorf("unknown command type %q (want one of %s)", typ, strings.Join(names, ", "))
}

func strictJSON(b []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return err
	}
	if dec.More() {
		return errors.New("trailing data after the JSON object")
	}
	return nil
}
