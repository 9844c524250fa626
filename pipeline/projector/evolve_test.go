package projector_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/onceflow/onceflow/examples/ledger"
	"github.com/onceflow/onceflow/pipeline"
	"github.com/onceflow/onceflow/pipeline/avro"
	"github.com/onceflow/onceflow/pipeline/kafka"
	"github.com/onceflow/onceflow/pipeline/projector"
)

// depositedV2 is Deposited as a second version of the events schema has
// it: with a memo, whose default ("") old records read as.
type depositedV2 struct {
	Amount int64  `avro:"amount"`
	Memo   string `avro:"memo"`
}

func (depositedV2) MessageType() string { return "Deposited" }

// depositsProjection is a read model of every deposit with its memo.
type depositsProjection struct{}

func (depositsProjection) Name() string     { return "evolve_deposits" }
func (depositsProjection) Tables() []string { return []string{"evolve_deposits"} }

func (depositsProjection) Apply(ctx context.Context, tx pgx.Tx, ev pipeline.Event) error {
	d, ok := ev.Payload.(depositedV2)
	if !ok {
		return nil
	}
	_, err := tx.Exec(ctx, `INSERT INTO evolve_deposits (event_id, amount, memo) VALUES ($1, $2, $3)`, ev.ID.String(), d.Amount, d.Memo)
	return err
}

// evolveEvents returns events.avsc with Deposited given the extra fields.
func evolveEvents(t *testing.T, fields string) string {
	t.Helper()
	eventsText, err := ledger.SchemaOf(ledger.Events)
	events := []byte(eventsText)
	if err != nil {
		t.Fatal(err)
	}
	const amount = `"name": "Deposited", "namespace": "onceflow.ledger",
   "fields": [{"name": "amount", "type": "long"}`
	if !strings.Contains(string(events), amount) {
		t.Fatal("events.avsc's Deposited changed: update the test")
	}
	return strings.Replace(string(events), amount, amount+fields, 1)
}

// Schema evolution as a user relies on it: events written with the events
// schema of today stay on the topic; a second version that adds a field
// with a default to Deposited is registered (the registry checks it is
// compatible) and new events are written with it; a rebuild of a read
// model reads both, the old records with the default. A version adding a
// field without a default is refused.
func TestRebuildReadsEveryVersionOfTheEventsSchema(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 2)
	ctx := context.Background()
	if _, err := e.pool.Exec(ctx, `CREATE TABLE evolve_deposits (event_id uuid PRIMARY KEY, amount bigint NOT NULL, memo text NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	reg := avro.NewEmbedded() // one registry for the deployment, as SCHEMA_REGISTRY_URL gives
	subject := avro.ValueSubject(e.topics.Events())

	// Version 1: the binary of today writes deposits without a memo.
	eventsText, err := ledger.SchemaOf(ledger.Events)
	events := []byte(eventsText)
	if err != nil {
		t.Fatal(err)
	}
	v1, err := avro.NewSerde(reg, subject, string(events), ledger.EventTypes())
	if err != nil {
		t.Fatal(err)
	}
	e.serde = v1
	want := map[pipeline.ID]depositedV2{}
	streams := []*stream{newStream("acme", "acc-1"), newStream("acme", "acc-2")}
	for i := range 10 {
		s := streams[i%2]
		if s.version == 0 {
			e.emit(s.next(ledger.AccountOpened{Currency: "EUR"}))
		}
		ev := s.next(ledger.Deposited{Amount: int64(100 + i)})
		e.emit(ev)
		want[ev.ID] = depositedV2{Amount: int64(100 + i)}
	}

	// Version 2 adds a memo with a default: compatible, a new id.
	v2, err := avro.NewSerde(reg, subject, evolveEvents(t, `,
     {"name": "memo", "type": "string", "default": ""}`), withType(ledger.EventTypes(), "onceflow.ledger.Deposited", depositedV2{}))
	if err != nil {
		t.Fatal(err)
	}
	id1, _ := v1.Register(ctx)
	id2, err := v2.Register(ctx)
	if err != nil || id2 == id1 {
		t.Fatalf("version 2: got id %d (%v), want a new id after %d", id2, err, id1)
	}
	e.serde = v2
	for i := range 10 {
		ev := streams[i%2].next(depositedV2{Amount: int64(200 + i), Memo: fmt.Sprintf("memo %d", i)})
		e.emit(ev)
		want[ev.ID] = depositedV2{Amount: int64(200 + i), Memo: fmt.Sprintf("memo %d", i)}
	}

	// A version adding a field without a default would make the records
	// above unreadable: refused, naming the record and the field.
	v3 := evolveEvents(t, `,
     {"name": "memo", "type": "string", "default": ""},
     {"name": "channel", "type": "string"}`)
	if _, err := reg.Register(ctx, subject, v3); !errors.Is(err, avro.ErrIncompatibleSchema) ||
		!strings.Contains(err.Error(), "record onceflow.ledger.Deposited, field channel") {
		t.Errorf("version 3: got %v, want ErrIncompatibleSchema naming Deposited's field channel", err)
	}

	// The upgraded live projector has applied everything; its table is
	// then lost, and rebuilt from the topic with version 2's reader.
	r := e.start(projector.Config{}, depositsProjection{})
	e.waitOffsets(projector.DefaultConsumer, e.endOffsets(), 30*time.Second)
	r.stop()
	if _, err := e.pool.Exec(ctx, `DELETE FROM evolve_deposits`); err != nil {
		t.Fatal(err)
	}
	rb, err := projector.NewRebuild(projector.RebuildConfig{Topic: e.topics.Events(), Projection: depositsProjection{}},
		kafka.Config{Brokers: e.brokers}, e.pool, v2, quietLogger())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := rb.Run(ctx); err != nil {
		t.Fatalf("rebuild: %v", err)
	}

	rows, err := e.pool.Query(ctx, `SELECT event_id, amount, memo FROM evolve_deposits`)
	if err != nil {
		t.Fatal(err)
	}
	got := map[pipeline.ID]depositedV2{}
	var idText string
	var d depositedV2
	if _, err := pgx.ForEachRow(rows, []any{&idText, &d.Amount, &d.Memo}, func() error {
		id, err := pipeline.ParseID(idText)
		got[id] = d
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if len(got) != len(want) {
		t.Errorf("rebuilt %d deposits, want %d (10 of each version)", len(got), len(want))
	}
	for id, w := range want {
		if got[id] != w {
			t.Errorf("deposit %s: rebuilt %+v, want %+v", id, got[id], w)
		}
	}
}

// withType returns types with name's Go type replaced by zero.
func withType(types map[string]any, name string, zero any) map[string]any {
	types[name] = zero
	return types
}
