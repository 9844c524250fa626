package projector

import (
	"context"
	"errors"
	"strconv"
	"testing"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/onceflow/onceflow/examples/ledger"
	"github.com/onceflow/onceflow/pipeline"
	"github.com/onceflow/onceflow/pipeline/avro"
)

// FuzzDecodeEvent feeds arbitrary keys, headers and values to the
// projector's decoding of an event record. It must never panic; a record
// it cannot read is poison (the partition parks on it), never a transient
// error that would be retried forever; and what it accepts has the event
// id, command id, version and tenant its headers say.
func FuzzDecodeEvent(f *testing.F) {
	ctx := context.Background()
	schemaText, err := ledger.SchemaOf(ledger.Events)
	schema := []byte(schemaText)
	if err != nil {
		f.Fatal(err)
	}
	dec, err := avro.NewSerde(avro.NewEmbedded(), avro.ValueSubject("fuzz.events"), string(schema), ledger.EventTypes())
	if err != nil {
		f.Fatal(err)
	}
	if _, err := dec.Register(ctx); err != nil {
		f.Fatal(err)
	}
	for _, m := range []pipeline.Message{ledger.Deposited{Amount: 5}, pipeline.CommandRejected{Reason: "r"}, pipeline.CommandFailed{Reason: "x"}} {
		v, err := dec.Encode(ctx, m)
		if err != nil {
			f.Fatal(err)
		}
		cmd := pipeline.NewCommandID()
		f.Add("acme/acc-1", pipeline.EventID("acme/acc-1", cmd, 0).String(), cmd.String(), "3", "acme", v)
	}
	f.Add("", "", "", "-1", "\xff", []byte{0, 0, 0, 0, 9, 2})
	f.Fuzz(func(t *testing.T, key, eventID, commandID, version, tenant string, value []byte) {
		r := &kgo.Record{Key: []byte(key), Value: value}
		for _, h := range []struct{ k, v string }{
			{pipeline.HeaderEventID, eventID}, {pipeline.HeaderCommandID, commandID},
			{pipeline.HeaderAggregateVersion, version}, {pipeline.HeaderTenant, tenant},
		} {
			if h.v != "" {
				r.Headers = append(r.Headers, kgo.RecordHeader{Key: h.k, Value: []byte(h.v)})
			}
		}
		e, err := decode(ctx, dec, r)
		if err != nil {
			if !errors.Is(err, errPoison) {
				t.Fatalf("a record's own fault reported as transient (it would be retried forever): %v", err)
			}
			return
		}
		if id, err := pipeline.ParseID(eventID); err != nil || id != e.ID || e.ID.IsZero() {
			t.Fatalf("accepted event id header %q as %s", eventID, e.ID)
		}
		if commandID != "" {
			if id, err := pipeline.ParseID(commandID); err != nil || id != e.CommandID {
				t.Fatalf("accepted command id header %q as %s", commandID, e.CommandID)
			}
		}
		if version != "" {
			if v, err := strconv.ParseInt(version, 10, 64); err != nil || v != e.Version {
				t.Fatalf("accepted version header %q as %d", version, e.Version)
			}
		}
		if e.Tenant != tenant || e.AggregateID != key || e.Payload == nil {
			t.Fatalf("accepted tenant %q, key %q as %q, %q (payload %v)", tenant, key, e.Tenant, e.AggregateID, e.Payload)
		}
	})
}
