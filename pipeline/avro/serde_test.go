package avro_test

import (
	"context"
	"encoding/binary"
	"errors"
	"math"
	"net/http/httptest"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/onceflow/onceflow/examples/ledger"
	"github.com/onceflow/onceflow/pipeline"
	"github.com/onceflow/onceflow/pipeline/avro"
)

func equalValues(got, want any) bool { return reflect.DeepEqual(got, want) }

func ptrTo(v any) any {
	p := reflect.New(reflect.TypeOf(v))
	p.Elem().Set(reflect.ValueOf(v))
	return p.Interface()
}

// everythingSchema exercises every Go type the package maps.
const everythingSchema = `{"type": "record", "name": "Everything", "namespace": "test",
 "fields": [
  {"name": "s", "type": "string"},
  {"name": "b", "type": "bytes"},
  {"name": "ok", "type": "boolean"},
  {"name": "i32", "type": "int"},
  {"name": "i64", "type": "long"},
  {"name": "n", "type": "long"},
  {"name": "small", "type": "int"},
  {"name": "f32", "type": "float"},
  {"name": "f64", "type": "double"},
  {"name": "id", "type": {"type": "fixed", "name": "UUID", "size": 16}},
  {"name": "raw_id", "type": "UUID"},
  {"name": "text_id", "type": {"type": "string", "logicalType": "uuid"}},
  {"name": "at", "type": {"type": "long", "logicalType": "timestamp-millis"}},
  {"name": "at_us", "type": {"type": "long", "logicalType": "timestamp-micros"}},
  {"name": "tags", "type": {"type": "array", "items": "string"}},
  {"name": "items", "type": {"type": "array", "items": {"type": "record", "name": "Item", "fields": [
     {"name": "sku", "type": "string"}, {"name": "qty", "type": "int"}]}}},
  {"name": "counts", "type": {"type": "map", "values": "long"}},
  {"name": "by_sku", "type": {"type": "map", "values": "Item"}},
  {"name": "nested", "type": "Item"},
  {"name": "note", "type": ["null", "string"], "default": null},
  {"name": "maybe_item", "type": ["null", "Item"], "default": null},
  {"name": "maybe_at", "type": ["null", {"type": "long", "logicalType": "timestamp-millis"}], "default": null},
  {"name": "color", "type": {"type": "enum", "name": "Color", "symbols": ["RED", "GREEN"]}},
  {"name": "blob", "type": {"type": "fixed", "name": "Blob", "size": 4}},
  {"name": "matrix", "type": {"type": "array", "items": {"type": "array", "items": "double"}}},
  {"name": "schema_only", "type": "string", "default": "filled from the default"}
 ]}`

type item struct {
	SKU string `avro:"sku"`
	Qty int32  `avro:"qty"`
}

type everything struct {
	S          string `avro:"s"`
	B          []byte `avro:"b"`
	OK         bool   `avro:"ok"`
	I32        int32
	I64        int64
	N          int
	Small      int
	F32        float32
	F64        float64
	ID         pipeline.ID `avro:"id"`
	RawID      [16]byte
	TextID     pipeline.ID
	At         time.Time
	AtUS       time.Time
	Tags       []string
	Items      []item
	Counts     map[string]int64
	BySKU      map[string]item `avro:"by_sku"`
	Nested     item
	Note       *string
	MaybeItem  *item
	MaybeAt    *time.Time
	Color      string
	Blob       []byte
	Matrix     [][]float64
	Ignored    string `avro:"-"`
	unexported int
}

func everythingValues() []any {
	note := "hello"
	at := time.UnixMilli(1_700_000_000_123).UTC()
	return []any{
		everything{
			S: "s", B: []byte{0, 1, 2, 255}, OK: true, I32: math.MinInt32, I64: math.MaxInt64, N: -1, Small: math.MaxInt32,
			F32: 1.5, F64: math.Pi,
			ID: pipeline.NewCommandID(), RawID: [16]byte{1, 2, 3}, TextID: pipeline.MustParseID("01890a5d-ac96-774b-bcce-b302099a8057"),
			At: at, AtUS: time.UnixMicro(1_700_000_000_123_456).UTC(),
			Tags:      []string{"a", "", "c"},
			Items:     []item{{"x", 1}, {"y", -2}},
			Counts:    map[string]int64{"a": 1, "b": -1},
			BySKU:     map[string]item{"x": {"x", 1}},
			Nested:    item{"n", 3},
			Note:      &note,
			MaybeItem: &item{"m", 4},
			MaybeAt:   &at,
			Color:     "GREEN",
			Blob:      []byte("abcd"),
			Matrix:    [][]float64{{1, 2}, nil, {math.Inf(1)}},
		},
		everything{Color: "RED", Blob: []byte{0, 0, 0, 0}, At: time.UnixMilli(0).UTC(), AtUS: time.UnixMilli(0).UTC()},
	}
}

func TestEverythingRoundTrip(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := newSerde(t, avro.NewEmbedded(), "everything-value", everythingSchema, map[string]any{"test.Everything": everything{}})
	for _, v := range everythingValues() {
		b, err := s.Encode(ctx, v)
		if err != nil {
			t.Fatalf("Encode: %v", err)
		}
		got, err := s.Decode(ctx, b)
		if err != nil {
			t.Fatalf("Decode: %v", err)
		}
		if !equalValues(got, v) {
			t.Errorf("got  %+v\nwant %+v", got, v)
		}
	}
	// Fields skipped by tag or unexported stay zero; a value out of range
	// for the Avro type is an encoding error, not a silent truncation.
	v := everythingValues()[1].(everything)
	v.Ignored, v.unexported = "x", 1
	b, err := s.Encode(ctx, v)
	if err != nil {
		t.Fatal(err)
	}
	got, _ := s.Decode(ctx, b)
	if g := got.(everything); g.Ignored != "" || g.unexported != 0 {
		t.Errorf("skipped fields: got %q, %d, want zero", g.Ignored, g.unexported)
	}
	for _, bad := range []func(*everything){
		func(e *everything) { e.Small = math.MaxInt32 + 1 },
		func(e *everything) { e.Color = "BLUE" },
		func(e *everything) { e.Blob = []byte("abc") },
	} {
		e := everythingValues()[1].(everything)
		bad(&e)
		if _, err := s.Encode(ctx, e); err == nil {
			t.Errorf("Encode(%+v): got no error, want one", e)
		}
	}
}

// TestUUIDAsString checks that a pipeline.ID held in an Avro string is the
// canonical text form, readable by any consumer.
func TestUUIDAsString(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	reg := avro.NewEmbedded()
	type asID struct{ ID pipeline.ID }
	type asText struct{ ID string }
	const schema = `{"type":"record","name":"R","fields":[{"name":"id","type":"string"}]}`
	ids := newSerde(t, reg, "r-value", schema, map[string]any{"R": asID{}})
	texts := newSerde(t, reg, "r-value", schema, map[string]any{"R": asText{}})
	id := pipeline.MustParseID("01890a5d-ac96-774b-bcce-b302099a8057")
	b, err := ids.Encode(ctx, asID{id})
	if err != nil {
		t.Fatal(err)
	}
	got, err := texts.Decode(ctx, b)
	if err != nil || got.(asText).ID != id.String() {
		t.Fatalf("got (%v, %v), want %s", got, err, id)
	}
	b, _ = texts.Encode(ctx, asText{"not-a-uuid"})
	if _, err := ids.Decode(ctx, b); !errors.Is(err, avro.ErrMalformed) {
		t.Fatalf("decoding a non-UUID into pipeline.ID: got %v, want ErrMalformed", err)
	}
}

// TestInterfaceUnion checks a field of interface type holding a union of
// records, e.g. a snapshot whose state can be one of several aggregates.
func TestInterfaceUnion(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	type a struct{ X int64 }
	type b struct{ Y string }
	type holder struct{ Payload any }
	const schema = `{"type":"record","name":"Holder","namespace":"t","fields":[
		{"name":"payload","type":["null",
			{"type":"record","name":"A","fields":[{"name":"x","type":"long"}]},
			{"type":"record","name":"B","fields":[{"name":"y","type":"string"}]}]}]}`
	s := newSerde(t, avro.NewEmbedded(), "h-value", schema, map[string]any{"t.Holder": holder{}, "t.A": a{}, "t.B": b{}})
	for _, v := range []holder{{a{7}}, {b{"y"}}, {nil}} {
		enc, err := s.Encode(ctx, v)
		if err != nil {
			t.Fatalf("Encode(%+v): %v", v, err)
		}
		got, err := s.Decode(ctx, enc)
		if err != nil || !equalValues(got, v) {
			t.Errorf("got (%+v, %v), want %+v", got, err, v)
		}
	}
	if _, err := s.Encode(ctx, holder{&a{8}}); err != nil {
		t.Errorf("a pointer to a branch type: %v", err)
	}
	if _, err := s.Encode(ctx, holder{"a string"}); err == nil || !strings.Contains(err.Error(), "not a branch") {
		t.Errorf("a type that is no branch: got %v, want an error saying so", err)
	}
}

// TestOlderWriter decodes events written with testdata/events.v1.avsc
// (registered first, its own id) with the current events.avsc.
func TestOlderWriter(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	reg := avro.NewEmbedded()
	subject := avro.ValueSubject("ledger.events")
	v1 := newSerde(t, reg, subject, testdata(t, "events.v1.avsc"), eventTypesV1())
	v1ID, err := v1.Register(ctx)
	if err != nil {
		t.Fatal(err)
	}
	current := newSerde(t, reg, subject, ledgerSchema(t, ledger.Events), eventTypes())
	curID, err := current.Register(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if v1ID != 1 || curID != 2 {
		t.Fatalf("got ids %d and %d, want 1 and 2", v1ID, curID)
	}

	// Written by the old binary: CommandRejected is branch 6 there, 7 now.
	b, err := v1.Encode(ctx, commandRejectedV1{CommandType: "Withdraw", Reason: "insufficient_funds"})
	if err != nil {
		t.Fatal(err)
	}
	if id, _, _ := avro.ParseHeader(b); id != v1ID {
		t.Fatalf("old writer framed id %d, want %d", id, v1ID)
	}
	got, err := current.Decode(ctx, b)
	if err != nil {
		t.Fatalf("Decode: %v", err)
	}
	want := commandRejected{CommandType: "Withdraw", Reason: "insufficient_funds", Detail: ""}
	if got != want {
		t.Errorf("got %#v, want %#v", got, want)
	}
	b, _ = v1.Encode(ctx, deposited{Amount: 5})
	if got, err := current.Decode(ctx, b); err != nil || got != (deposited{Amount: 5}) {
		t.Errorf("Deposited from v1: got (%#v, %v), want {5}", got, err)
	}

	// The other way: the old binary reads what the new one writes. The
	// field it lacks is dropped; the branch it lacks is a clear error.
	b, _ = current.Encode(ctx, commandRejected{CommandType: "Deposit", Reason: "closed", Detail: "dropped"})
	if got, err := v1.Decode(ctx, b); err != nil || got != (commandRejectedV1{"Deposit", "closed"}) {
		t.Errorf("new CommandRejected read by v1: got (%#v, %v), want {Deposit closed}", got, err)
	}
	b, _ = current.Encode(ctx, transferRefunded{TransferID: "t", To: "a", Amount: 1, Reason: "r"})
	_, err = v1.Decode(ctx, b)
	if !errors.Is(err, avro.ErrIncompatible) || !strings.Contains(err.Error(), "unknown type onceflow.ledger.TransferRefunded") {
		t.Errorf("a branch the reader lacks: got %v, want ErrIncompatible saying unknown type onceflow.ledger.TransferRefunded", err)
	}
	// Other branches of the same writer schema still decode.
	b, _ = current.Encode(ctx, withdrawn{Amount: 9})
	if got, err := v1.Decode(ctx, b); err != nil || got != (withdrawn{Amount: 9}) {
		t.Errorf("Withdrawn from current read by v1: got (%#v, %v)", got, err)
	}
}

// TestResolution covers Avro schema resolution: each case writes a value
// with one schema and reads it with another under the same subject.
func TestResolution(t *testing.T) {
	t.Parallel()
	rec := func(fields string) string {
		return `{"type":"record","name":"R","namespace":"t","fields":[` + fields + `]}`
	}
	type (
		i32    struct{ V int32 }
		i64    struct{ V int64 }
		f32    struct{ V float32 }
		f64    struct{ V float64 }
		str    struct{ V string }
		byt    struct{ V []byte }
		ptr    struct{ V *int64 }
		ts     struct{ V time.Time }
		two    struct{ V, W int64 }
		arr32  struct{ V []int32 }
		arr64  struct{ V []int64 }
		map32  struct{ V map[string]int32 }
		mapf   struct{ V map[string]float64 }
		strs   struct{ V []string }
		inner  struct{ A int32 }
		outer  struct{ V inner }
		inner2 struct {
			A int64
			B string
		}
		outer2 struct{ V inner2 }
	)
	for _, tc := range []struct {
		name           string
		writer, reader string
		wv             any // written
		rt             any // reader Go type
		want           any // read; nil with wantErr
		wantErr        error
		errText        string
	}{
		{"int to long", rec(`{"name":"v","type":"int"}`), rec(`{"name":"v","type":"long"}`), i32{-7}, i64{}, i64{-7}, nil, ""},
		{"int to float", rec(`{"name":"v","type":"int"}`), rec(`{"name":"v","type":"float"}`), i32{3}, f32{}, f32{3}, nil, ""},
		{"int to double", rec(`{"name":"v","type":"int"}`), rec(`{"name":"v","type":"double"}`), i32{3}, f64{}, f64{3}, nil, ""},
		{"long to float", rec(`{"name":"v","type":"long"}`), rec(`{"name":"v","type":"float"}`), i64{1 << 40}, f32{}, f32{1 << 40}, nil, ""},
		{"long to double", rec(`{"name":"v","type":"long"}`), rec(`{"name":"v","type":"double"}`), i64{-5}, f64{}, f64{-5}, nil, ""},
		{"float to double", rec(`{"name":"v","type":"float"}`), rec(`{"name":"v","type":"double"}`), f32{0.5}, f64{}, f64{0.5}, nil, ""},
		{"string to bytes", rec(`{"name":"v","type":"string"}`), rec(`{"name":"v","type":"bytes"}`), str{"hé"}, byt{}, byt{[]byte("hé")}, nil, ""},
		{"bytes to string", rec(`{"name":"v","type":"bytes"}`), rec(`{"name":"v","type":"string"}`), byt{[]byte("x")}, str{}, str{"x"}, nil, ""},
		{"array of int to array of long", rec(`{"name":"v","type":{"type":"array","items":"int"}}`), rec(`{"name":"v","type":{"type":"array","items":"long"}}`), arr32{[]int32{1, 2}}, arr64{}, arr64{[]int64{1, 2}}, nil, ""},
		{"map of int to map of double", rec(`{"name":"v","type":{"type":"map","values":"int"}}`), rec(`{"name":"v","type":{"type":"map","values":"double"}}`), map32{map[string]int32{"a": 1}}, mapf{}, mapf{map[string]float64{"a": 1}}, nil, ""},
		{"long to nullable long", rec(`{"name":"v","type":"long"}`), rec(`{"name":"v","type":["null","long"]}`), i64{4}, ptr{}, ptr{ptrInt64(4)}, nil, ""},
		{"int to nullable long", rec(`{"name":"v","type":"int"}`), rec(`{"name":"v","type":["null","long"]}`), i32{4}, ptr{}, ptr{ptrInt64(4)}, nil, ""},
		{"nullable null to nullable", rec(`{"name":"v","type":["null","long"]}`), rec(`{"name":"v","type":["long","null"],"default":0}`), ptr{}, ptr{}, ptr{}, nil, ""},
		{"nullable long to long", rec(`{"name":"v","type":["null","long"]}`), rec(`{"name":"v","type":"long"}`), ptr{ptrInt64(6)}, i64{}, i64{6}, nil, ""},
		{"nullable null to long", rec(`{"name":"v","type":["null","long"]}`), rec(`{"name":"v","type":"long"}`), ptr{}, i64{}, nil, avro.ErrIncompatible, "writer has null, reader has long"},
		{"long to timestamp", rec(`{"name":"v","type":"long"}`), rec(`{"name":"v","type":{"type":"long","logicalType":"timestamp-millis"}}`), i64{1500}, ts{}, ts{time.UnixMilli(1500).UTC()}, nil, ""},
		{"micros to millis", rec(`{"name":"v","type":{"type":"long","logicalType":"timestamp-micros"}}`), rec(`{"name":"v","type":{"type":"long","logicalType":"timestamp-millis"}}`), ts{time.UnixMicro(1_500_001).UTC()}, ts{}, ts{time.UnixMicro(1_500_001).UTC()}, nil, ""},
		{"timestamp to long", rec(`{"name":"v","type":{"type":"long","logicalType":"timestamp-millis"}}`), rec(`{"name":"v","type":"long"}`), ts{time.UnixMilli(99).UTC()}, i64{}, i64{99}, nil, ""},
		{"extra writer field dropped", rec(`{"name":"v","type":"long"},{"name":"w","type":"long"}`), rec(`{"name":"v","type":"long"}`), two{1, 2}, i64{}, i64{1}, nil, ""},
		{"missing field from default", rec(`{"name":"v","type":"long"}`), rec(`{"name":"v","type":"long"},{"name":"w","type":"long","default":-3}`), i64{1}, two{}, two{1, -3}, nil, ""},
		{"missing field without default", rec(`{"name":"v","type":"long"}`), rec(`{"name":"v","type":"long"},{"name":"w","type":"long"}`), i64{1}, two{}, nil, avro.ErrIncompatible, "no default"},
		{"array default", rec(`{"name":"w","type":"long"}`), rec(`{"name":"w","type":"long"},{"name":"v","type":{"type":"array","items":"string"},"default":["a","b"]}`), struct{ W int64 }{1}, struct {
			W int64
			V []string
		}{}, struct {
			W int64
			V []string
		}{1, []string{"a", "b"}}, nil, ""},
		{"renamed field by alias", rec(`{"name":"old","type":"long"}`), rec(`{"name":"v","type":"long","aliases":["old"]}`), struct{ Old int64 }{8}, i64{}, i64{8}, nil, ""},
		{"nested record evolves", rec(`{"name":"v","type":{"type":"record","name":"In","fields":[{"name":"a","type":"int"}]}}`),
			rec(`{"name":"v","type":{"type":"record","name":"In","fields":[{"name":"a","type":"long"},{"name":"b","type":"string","default":"d"}]}}`),
			outer{inner{5}}, outer2{}, outer2{inner2{5, "d"}}, nil, ""},
		{"nested record renamed", rec(`{"name":"v","type":{"type":"record","name":"In","fields":[{"name":"a","type":"int"}]}}`),
			rec(`{"name":"v","type":{"type":"record","name":"Other","fields":[{"name":"a","type":"int"}]}}`),
			outer{inner{5}}, outer{}, nil, avro.ErrIncompatible, "reader record t.Other"},
		{"long to int is no promotion", rec(`{"name":"v","type":"long"}`), rec(`{"name":"v","type":"int"}`), i64{1}, i32{}, nil, avro.ErrIncompatible, "writer has long, reader has int"},
		{"string to long", rec(`{"name":"v","type":"string"}`), rec(`{"name":"v","type":"long"}`), str{"1"}, i64{}, nil, avro.ErrIncompatible, ""},
		{"array to string", rec(`{"name":"v","type":{"type":"array","items":"string"}}`), rec(`{"name":"v","type":"string"}`), strs{[]string{"a"}}, str{}, nil, avro.ErrIncompatible, ""},
		{"enum symbol known", rec(`{"name":"v","type":{"type":"enum","name":"E","symbols":["A","B","C"]}}`), rec(`{"name":"v","type":{"type":"enum","name":"E","symbols":["C","A"]}}`), str{"A"}, str{}, str{"A"}, nil, ""},
		{"enum symbol to default", rec(`{"name":"v","type":{"type":"enum","name":"E","symbols":["A","B"]}}`), rec(`{"name":"v","type":{"type":"enum","name":"E","symbols":["A","UNKNOWN"],"default":"UNKNOWN"}}`), str{"B"}, str{}, str{"UNKNOWN"}, nil, ""},
		{"enum symbol unknown", rec(`{"name":"v","type":{"type":"enum","name":"E","symbols":["A","B"]}}`), rec(`{"name":"v","type":{"type":"enum","name":"E","symbols":["A"]}}`), str{"B"}, str{}, nil, avro.ErrIncompatible, `unknown symbol "B"`},
		{"fixed of another size", rec(`{"name":"v","type":{"type":"fixed","name":"F","size":4}}`), rec(`{"name":"v","type":{"type":"fixed","name":"F","size":8}}`), byt{[]byte("abcd")}, byt{}, nil, avro.ErrIncompatible, "size"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			reg := avro.NewEmbedded()
			w := newSerde(t, reg, "r-value", tc.writer, map[string]any{"t.R": tc.wv})
			r := newSerde(t, reg, "r-value", tc.reader, map[string]any{"t.R": tc.rt})
			b, err := w.Encode(ctx, tc.wv)
			if err != nil {
				t.Fatalf("Encode: %v", err)
			}
			got, err := r.Decode(ctx, b)
			if tc.wantErr != nil {
				if !errors.Is(err, tc.wantErr) || !strings.Contains(err.Error(), tc.errText) {
					t.Fatalf("got (%+v, %v), want an error wrapping %v that says %q", got, err, tc.wantErr, tc.errText)
				}
				return
			}
			if err != nil {
				t.Fatalf("Decode: %v", err)
			}
			if !equalValues(got, tc.want) {
				t.Errorf("got %+v, want %+v", got, tc.want)
			}
		})
	}
}

func ptrInt64(v int64) *int64 { return &v }

// TestNewSerdeChecks lists the mismatches NewSerde finds at start.
func TestNewSerdeChecks(t *testing.T) {
	t.Parallel()
	type ok struct{ X int64 }
	type extra struct {
		X int64
		Y string
	}
	type wrongType struct{ X string }
	type narrow struct{ X int32 }
	type pointer struct{ X *int64 }
	type clock struct{ X time.Time }
	type Base struct{ X int64 }
	type embedded struct{ Base }
	const rec = `{"type":"record","name":"R","namespace":"t","fields":[{"name":"x","type":"long"}]}`
	const union = `[` + rec + `,{"type":"record","name":"S","namespace":"t","fields":[]}]`
	for _, tc := range []struct {
		name   string
		schema string
		types  map[string]any
		want   string
	}{
		{"no Go type for a branch", union, map[string]any{"t.R": ok{}}, "no Go type for record t.S"},
		{"Go type for no branch", rec, map[string]any{"t.R": ok{}, "t.Nope": ok{}}, "types has t.Nope, which is not a record"},
		{"Go field without Avro field", rec, map[string]any{"t.R": extra{}}, `Go field avro_test.extra.Y (Avro name "y") is not a field of record t.R`},
		{"Avro field without Go field", `{"type":"record","name":"R","namespace":"t","fields":[{"name":"x","type":"long"},{"name":"z","type":"long"}]}`, map[string]any{"t.R": ok{}}, "field z of record t.R has no Go field"},
		{"wrong Go type", rec, map[string]any{"t.R": wrongType{}}, "t.R.x: Go type string cannot hold long"},
		{"int32 for long", rec, map[string]any{"t.R": narrow{}}, "Go type int32 cannot hold long"},
		{"pointer outside a union", rec, map[string]any{"t.R": pointer{}}, "pointers are for unions with null"},
		{"time for a plain long", rec, map[string]any{"t.R": clock{}}, "timestamp-millis"},
		{"embedded struct", rec, map[string]any{"t.R": embedded{}}, "embedded field"},
		{"one Go type for two branches", union, map[string]any{"t.R": ok{}, "t.S": ok{}}, "is the Go type of both"},
		{"not a struct", rec, map[string]any{"t.R": int64(0)}, "want a struct value"},
		{"MessageType mismatch", `{"type":"record","name":"Deposit","namespace":"onceflow.ledger","fields":[{"name":"amount","type":"long"}]}`, map[string]any{"onceflow.ledger.Deposit": deposited{}}, `MessageType() is "Deposited", want the record name "Deposit"`},
		{"union of non-records", `["null",` + rec + `]`, map[string]any{"t.R": ok{}}, "holds records only"},
		{"primitive schema", `"long"`, map[string]any{}, "needs a record or a union of records"},
		{"recursive schema", `{"type":"record","name":"L","fields":[{"name":"next","type":["null","L"]}]}`, map[string]any{"L": ok{}}, "recursive"},
		{"array of zero-width items", `{"type":"record","name":"R","namespace":"t","fields":[{"name":"x","type":{"type":"array","items":"null"}}]}`, map[string]any{"t.R": ok{}}, "zero bytes"},
		{"array of empty records", `{"type":"record","name":"R","namespace":"t","fields":[{"name":"x","type":{"type":"array","items":{"type":"record","name":"E","fields":[]}}}]}`, map[string]any{"t.R": ok{}}, "zero bytes"},
		{"not JSON", `{"type":`, map[string]any{}, "not JSON"},
		{"unknown type", `{"type":"record","name":"R","fields":[{"name":"x","type":"Nope"}]}`, map[string]any{"R": ok{}}, `unknown type "Nope"`},
		{"bad default", `{"type":"record","name":"R","fields":[{"name":"x","type":"long","default":"one"}]}`, map[string]any{"R": ok{}}, "default"},
	} {
		_, err := avro.NewSerde(avro.NewEmbedded(), "s-value", tc.schema, tc.types)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: got %v, want an error saying %q", tc.name, err, tc.want)
		}
	}
	if _, err := avro.NewSerde(nil, "s-value", rec, map[string]any{"t.R": ok{}}); err == nil {
		t.Error("nil registry: got no error")
	}
}

// TestDecodeErrors checks that each way a record can be bad is classified.
func TestDecodeErrors(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	ls := newLedgerSerdes(t)
	good, err := ls.events.Encode(ctx, deposited{Amount: 300})
	if err != nil {
		t.Fatal(err)
	}
	id, _, _ := avro.ParseHeader(good)
	frame := func(payload ...byte) []byte { return append(avro.AppendHeader(nil, id), payload...) }
	for _, tc := range []struct {
		name string
		in   []byte
		want error
		text string
	}{
		{"empty", nil, avro.ErrMalformed, "too short"},
		{"bad magic", append([]byte{1}, good[1:]...), avro.ErrMalformed, "magic"},
		{"unknown id", append(avro.AppendHeader(nil, 4242), good[5:]...), avro.ErrUnknownSchema, "4242"},
		{"header only", frame(), avro.ErrMalformed, ""},
		{"truncated", good[:len(good)-1], avro.ErrMalformed, ""},
		{"trailing bytes", append(append([]byte{}, good...), 0, 0), avro.ErrMalformed, "2 trailing bytes"},
		{"union index out of range", frame(binary.AppendVarint(nil, 9)...), avro.ErrMalformed, "index"},
		{"negative union index", frame(binary.AppendVarint(nil, -1)...), avro.ErrMalformed, "index"},
		{"negative string length", frame(append(binary.AppendVarint(nil, 7), binary.AppendVarint(nil, -5)...)...), avro.ErrMalformed, ""},
		{"state schema id on events", nil, avro.ErrIncompatible, "unknown type onceflow.Snapshot"},
	} {
		in := tc.in
		if tc.name == "state schema id on events" {
			in, _ = ls.state.Encode(ctx, snapshot{})
		}
		got, err := ls.events.Decode(ctx, in)
		if !errors.Is(err, tc.want) || !strings.Contains(err.Error(), tc.text) {
			t.Errorf("%s: got (%v, %v), want an error wrapping %q that says %q", tc.name, got, err, tc.want, tc.text)
		}
		if errors.Is(err, avro.ErrPanicked) {
			t.Errorf("%s: decoder panicked: %v", tc.name, err)
		}
	}
}

// countingRegistry counts schema fetches of a real registry.
type countingRegistry struct {
	avro.Registry
	fetches atomic.Int32
}

func (c *countingRegistry) SchemaByID(ctx context.Context, id int) (string, error) {
	c.fetches.Add(1)
	return c.Registry.SchemaByID(ctx, id)
}

// TestConcurrentDecode decodes from many goroutines (run with -race) and
// checks that a writer schema is fetched once per id.
func TestConcurrentDecode(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	emb := avro.NewEmbedded()
	subject := avro.ValueSubject("ledger.events")
	old := newSerde(t, emb, subject, testdata(t, "events.v1.avsc"), eventTypesV1())
	b, err := old.Encode(ctx, withdrawn{Amount: 3})
	if err != nil {
		t.Fatal(err)
	}
	reg := &countingRegistry{Registry: emb}
	s := newSerde(t, reg, subject, ledgerSchema(t, ledger.Events), eventTypes())
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 100 {
				own, err := s.Encode(ctx, deposited{Amount: 1})
				if err != nil {
					t.Error(err)
					return
				}
				for _, in := range [][]byte{b, own} {
					if _, err := s.Decode(ctx, in); err != nil {
						t.Error(err)
						return
					}
				}
			}
		})
	}
	wg.Wait()
	// The old id is fetched once; the Serde's own id never: it knows its schema.
	if n := reg.fetches.Load(); n != 1 {
		t.Errorf("got %d schema fetches, want 1", n)
	}
}

// TestEncodeErrors checks what Encode refuses.
func TestEncodeErrors(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	ls := newLedgerSerdes(t)
	for _, tc := range []struct {
		name string
		v    any
		want string
	}{
		{"type of another topic", deposit{Amount: 1}, "not one of the subject's Go types"},
		{"nil", nil, "nil value"},
		{"nil pointer", (*deposited)(nil), "nil pointer"},
	} {
		if _, err := ls.events.Encode(ctx, tc.v); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: got %v, want an error saying %q", tc.name, err, tc.want)
		}
	}
	// AppendEncode appends, and leaves dst alone on error.
	dst := []byte("prefix")
	out, err := ls.events.AppendEncode(ctx, dst, deposited{Amount: 1})
	if err != nil || string(out[:6]) != "prefix" || len(out) <= 6+avro.HeaderSize {
		t.Errorf("AppendEncode: got (%x, %v)", out, err)
	}
	if out, err := ls.events.AppendEncode(ctx, dst, deposit{}); err == nil || string(out) != "prefix" {
		t.Errorf("AppendEncode error: got (%q, %v), want (prefix, error)", out, err)
	}
}

// TestRegisterErrors: an unreachable registry stops Encode, with an error
// that is not classified as a poison record (it is worth retrying).
func TestRegisterErrors(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	srv := httptest.NewServer(avro.NewEmbedded().Handler())
	srv.Close()
	cl, err := avro.NewClient(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	s := newSerde(t, cl, "s-value", ledgerSchema(t, ledger.Events), eventTypes())
	if _, err := s.Encode(ctx, deposited{}); err == nil || !strings.Contains(err.Error(), "register schema of s-value") {
		t.Errorf("Encode: got %v, want a registration error", err)
	}
	_, err = s.Decode(ctx, avro.AppendHeader(nil, 1))
	if err == nil || errors.Is(err, avro.ErrMalformed) || errors.Is(err, avro.ErrUnknownSchema) || errors.Is(err, avro.ErrIncompatible) {
		t.Errorf("Decode: got %v, want an unclassified (transient) error", err)
	}
}

// Fields names a struct's fields as its Avro record does, so the audit
// log's JSON copy of an event uses the topic's field names.
func TestFields(t *testing.T) {
	type ev struct {
		TransferID string
		AtMS       int64
		HTTPStatus int
		Amount     int64  `avro:"amount_minor"`
		Note       string `avro:"-"`
		internal   int
	}
	v := ev{TransferID: "t-1", AtMS: 7, HTTPStatus: 201, Amount: 5, Note: "x", internal: 1}
	for _, in := range []any{v, &v} {
		got, err := avro.Fields(in)
		if err != nil {
			t.Fatal(err)
		}
		want := map[string]any{"transfer_id": "t-1", "at_ms": int64(7), "http_status": 201, "amount_minor": int64(5)}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("Fields(%T) = %v, want %v", in, got, want)
		}
	}
	if _, err := avro.Fields(42); err == nil {
		t.Error("Fields of an int: no error")
	}
}
