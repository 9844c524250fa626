package processor_test

import (
	"context"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/onceflow/onceflow/examples/ledger"
	"github.com/onceflow/onceflow/pipeline"
	"github.com/onceflow/onceflow/pipeline/avro"
	"github.com/onceflow/onceflow/pipeline/kafka"
	"github.com/onceflow/onceflow/pipeline/processor"
)

// FuzzParseCommand feeds arbitrary keys, headers, values and times to the
// processor's check of a command record (what any Kafka producer can
// send). It must never panic, and whatever it accepts must be what ingest
// would accept: a valid aggregate id of the header's tenant, a command id,
// a decodable command of a registered type whose strings are UTF-8
// without NUL and whose own rules hold; whatever it refuses carries a
// known reason and a readable detail.
func FuzzParseCommand(f *testing.F) {
	ctx := context.Background()
	topics := kafka.Topics{Prefix: "fuzz"}
	s, err := newSerdes(ctx, avro.NewEmbedded(), topics)
	if err != nil {
		f.Fatal(err)
	}
	p, err := processor.New(processor.Config{Topics: topics, InstanceID: "fuzz"}, kafka.Config{}, ledger.NewDecider(), s.processor(), nil, nil)
	if err != nil {
		f.Fatal(err)
	}
	now := time.UnixMilli(1_800_000_000_000)
	for _, m := range []pipeline.Message{
		ledger.OpenAccount{Currency: "EUR"}, ledger.Deposit{Amount: 5}, ledger.Withdraw{Amount: -1},
		ledger.RequestTransfer{TransferID: "t1", To: "acc-2", Amount: 3},
		ledger.RefundTransfer{TransferID: "t\x00", To: "a", Amount: 1, Reason: "\xff"},
	} {
		v, err := s.Commands.Encode(ctx, m)
		if err != nil {
			f.Fatal(err)
		}
		f.Add("acme/acc-1", pipeline.NewCommandID().String(), "acme", m.MessageType(), "", v, int64(0))
	}
	f.Add("acme/acc\xff", "x", "", "Deposit", "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", []byte{0, 0, 0, 0, 1}, int64(1<<40))
	reasons := map[string]bool{
		processor.ReasonMissingCommandID: true, processor.ReasonInvalidCommandID: true, processor.ReasonMissingTenant: true,
		processor.ReasonInvalidKey: true, processor.ReasonTenantMismatch: true, processor.ReasonUnknownSchema: true,
		processor.ReasonUndecodable: true, processor.ReasonUnknownType: true, processor.ReasonCommandTypeMismatch: true,
		processor.ReasonInvalidField: true, processor.ReasonFutureTimestamp: true, processor.ReasonPastTimestamp: true, processor.ReasonTooLarge: true,
	}
	f.Fuzz(func(t *testing.T, key, id, tenant, cmdType, traceparent string, value []byte, ahead int64) {
		r := &kgo.Record{Topic: topics.Commands(), Key: []byte(key), Value: value, Timestamp: now.Add(time.Duration(ahead) * time.Millisecond)}
		for _, h := range []struct{ k, v string }{
			{pipeline.HeaderCommandID, id}, {pipeline.HeaderTenant, tenant}, {pipeline.HeaderCommandType, cmdType},
			{pipeline.HeaderTraceparent, traceparent},
		} {
			if h.v != "" {
				r.Headers = append(r.Headers, kgo.RecordHeader{Key: h.k, Value: []byte(h.v)})
			}
		}
		cmd, reason, detail, err := p.Parse(ctx, r, now)
		if err != nil {
			t.Fatalf("a transient error from the embedded registry: %v", err)
		}
		if reason != "" {
			if !reasons[reason] {
				t.Fatalf("unknown reason %q", reason)
			}
			if detail == "" || !utf8.ValidString(detail) || len(detail) > 1100 {
				t.Fatalf("reason %s: detail %q is empty, not UTF-8 or too long", reason, detail)
			}
			if !cmd.ID.IsZero() && cmd.AggregateID != key {
				t.Fatalf("a failure recorded on %q for a record keyed %q", cmd.AggregateID, key)
			}
			return
		}
		tn, local, err := pipeline.SplitAggregateID(cmd.AggregateID)
		if err != nil || pipeline.ValidateLocalID(tn) != nil || pipeline.ValidateLocalID(local) != nil || tn != tenant || cmd.Tenant != tenant {
			t.Fatalf("accepted key %q with tenant header %q", key, tenant)
		}
		if parsed, err := pipeline.ParseID(id); err != nil || parsed != cmd.ID {
			t.Fatalf("accepted command id %q as %s", id, cmd.ID)
		}
		if cmd.Time.UnixMilli() < 0 || now.Sub(cmd.Time) > processor.DefaultMaxCommandAge || cmd.Time.Sub(now) > p.Config().MaxClockSkew {
			t.Fatalf("accepted a command dated %s, %s from now", cmd.Time, cmd.Time.Sub(now))
		}
		if cmd.Payload == nil || pipeline.ValidateMessage(cmd.Payload, p.Config().MaxStringBytes) != nil {
			t.Fatalf("accepted a command that breaks a field rule: %#v", cmd.Payload)
		}
		if ahead > p.Config().MaxClockSkew.Milliseconds() {
			t.Fatalf("accepted a record %dms ahead", ahead)
		}
		if cmd.Traceparent != "" && cmd.Traceparent != traceparent {
			t.Fatalf("traceparent %q became %q", traceparent, cmd.Traceparent)
		}
	})
}
