package onceflow_test

import (
	"context"
	"errors"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/onceflow/onceflow"
	"github.com/onceflow/onceflow/examples/ledger"
	"github.com/onceflow/onceflow/examples/ledger/ledgerapp"
	"github.com/onceflow/onceflow/pipeline/avro"
	"github.com/onceflow/onceflow/pipeline/kafka"
)

// A component started against a registry whose events subject holds a
// version this binary's events schema cannot read refuses to start, and
// says which field and where to read about it; against a registry that
// holds its schemas, or none yet, it starts.
func TestStartRefusesAnIncompatibleRegistry(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	topics := kafka.Topics{Prefix: "ledger", Partitions: 1}
	eventsText, err := ledger.SchemaOf(ledger.Events)
	events := []byte(eventsText)
	if err != nil {
		t.Fatal(err)
	}
	// Another deployment's events schema: Deposited.amount is a string.
	other := strings.Replace(string(events), `"fields": [{"name": "amount", "type": "long"}]}`, `"fields": [{"name": "amount", "type": "string"}]}`, 1)
	if other == string(events) {
		t.Fatal("events.avsc has no Deposited amount of type long any more: update the test")
	}

	for _, tc := range []struct {
		name    string
		present string // the events subject's version before the start, if any
		want    string
	}{
		{"empty registry", "", ""},
		{"the same schema", string(events), ""},
		{"a schema it cannot read", other, "record onceflow.ledger.Deposited, field amount: version 1 writes string, which the new schema's long cannot read"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			emb := avro.NewEmbedded()
			if tc.present != "" {
				if _, err := emb.Register(ctx, avro.ValueSubject(topics.Events()), tc.present); err != nil {
					t.Fatal(err)
				}
			}
			srv := httptest.NewServer(emb.Handler())
			t.Cleanup(srv.Close)
			reg, err := avro.ClientConfig{URL: srv.URL}.NewClient()
			if err != nil {
				t.Fatal(err)
			}
			_, err = onceflow.NewSerdes(ctx, reg, ledgerapp.Domain(), "", topics)
			if tc.want == "" {
				if err != nil {
					t.Fatalf("start: %v", err)
				}
				return
			}
			if !errors.Is(err, avro.ErrIncompatibleSchema) {
				t.Fatalf("start: got %v, want ErrIncompatibleSchema", err)
			}
			for _, want := range []string{"register the ledger events schema", "ledger.events-value", tc.want, "docs/schemas.md#evolving-schemas"} {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("start: got %v, want it to say %q", err, want)
				}
			}
			for id := 1; id <= 4; id++ {
				if s, _ := emb.SchemaByID(ctx, id); s == string(events) {
					t.Errorf("the refused schema was registered, id %d", id)
				}
			}
		})
	}
}
