package kafka_test

import (
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/onceflow/onceflow/pipeline"
	"github.com/onceflow/onceflow/pipeline/kafka"
)

type deposited struct{}

func (deposited) MessageType() string { return "Deposited" }

// An event written by EventRecord reads back with EventOf as it was, but
// for its payload; a record whose headers cannot be read says which.
func TestEventRecordRoundTrip(t *testing.T) {
	ev := pipeline.Event{ID: pipeline.NewCommandID(), CommandID: pipeline.NewCommandID(), CommandType: "Deposit",
		Tenant: "acme", AggregateID: "acme/acc-1", Version: 7, Time: time.UnixMilli(1_700_000_000_123), Traceparent: "00-" + strings.Repeat("a", 32) + "-" + strings.Repeat("b", 16) + "-01",
		Payload: deposited{},
		Derived: []pipeline.CommandRef{{ID: pipeline.NewCommandID(), AggregateID: "acme/acc-2", Type: "CreditTransfer"}, {ID: pipeline.NewCommandID(), AggregateID: "acme/a b", Type: "Refund"}}}
	r := kafka.EventRecord("ledger.events", ev, []byte("value"))
	got, err := kafka.EventOf(r)
	if err != nil {
		t.Fatal(err)
	}
	got.Payload = ev.Payload
	if !reflect.DeepEqual(got, ev) || string(r.Value) != "value" || r.Topic != "ledger.events" {
		t.Errorf("EventOf(EventRecord(ev)) = %+v, want %+v", got, ev)
	}
	for _, tc := range []struct {
		header, value, want string
	}{
		{pipeline.HeaderEventID, "42", pipeline.HeaderEventID},
		{pipeline.HeaderCommandID, "x", pipeline.HeaderCommandID},
		{pipeline.HeaderAggregateVersion, "seven", pipeline.HeaderAggregateVersion},
		{pipeline.HeaderDerivedCommand, "x CreditTransfer acme/acc-2", pipeline.HeaderDerivedCommand},
		{pipeline.HeaderDerivedCommand, pipeline.NewCommandID().String() + " CreditTransfer", pipeline.HeaderDerivedCommand},
	} {
		bad := *r
		bad.Headers = append([]kgo.RecordHeader(nil), r.Headers...)
		for i := range bad.Headers {
			if bad.Headers[i].Key == tc.header {
				bad.Headers[i].Value = []byte(tc.value)
			}
		}
		if _, err := kafka.EventOf(&bad); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s %q: error %v, want one naming %s", tc.header, tc.value, err, tc.want)
		}
	}
	if _, err := kafka.EventOf(&kgo.Record{}); err == nil {
		t.Error("a record without headers read as an event")
	}
}

// A command written by CommandRecord carries the aggregate id's tenant,
// and CommandFieldsOf tells an absent header from an empty one.
func TestCommandRecordFields(t *testing.T) {
	id := pipeline.NewCommandID()
	r, err := kafka.CommandRecord("ledger.commands", "acme/acc-1", id, "Deposit", []byte("v"), time.Time{}, "")
	if err != nil {
		t.Fatal(err)
	}
	f := kafka.CommandFieldsOf(r)
	if string(f.CommandID) != id.String() || string(f.Tenant) != "acme" || string(f.CommandType) != "Deposit" || !f.HasCommandID || !f.HasTenant || f.Traceparent != nil {
		t.Errorf("fields %+v", f)
	}
	if f := kafka.CommandFieldsOf(&kgo.Record{Headers: []kgo.RecordHeader{{Key: pipeline.HeaderTenant}}}); f.HasCommandID || !f.HasTenant {
		t.Errorf("an empty tenant header and no command-id: %+v", f)
	}
	if _, err := kafka.CommandRecord("t", "no-tenant", id, "Deposit", nil, time.Time{}, ""); err == nil {
		t.Error("a command for a key without a tenant")
	}
	if _, err := kafka.CommandRecord("t", "acme/a", pipeline.Nil, "Deposit", nil, time.Time{}, ""); err == nil {
		t.Error("a command without an id")
	}
}
