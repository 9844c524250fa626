package avro_test

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/onceflow/onceflow/examples/ledger"
	"github.com/onceflow/onceflow/pipeline/avro"
)

// FuzzDecode feeds arbitrary bytes to every Serde of one registry that
// holds the ledger's schemas, an older events schema and a schema of every
// mapped Go type. Decode must never panic (a recovered panic counts as
// one); it either fails with a classified error or returns a value that
// encodes and decodes back to itself.
func FuzzDecode(f *testing.F) {
	ctx := context.Background()
	ls := newLedgerSerdes(f)
	// Under a subject of its own: an older version registered after the
	// current one would be refused as incompatible.
	v1 := newSerde(f, ls.reg, avro.ValueSubject("ledger.events.v1"), testdata(f, "events.v1.avsc"), eventTypesV1())
	every := newSerde(f, ls.reg, "everything-value", everythingSchema, map[string]any{"test.Everything": everything{}})
	serdes := []*avro.Serde{ls.commands, ls.events, ls.state, v1, every}

	commands, events, states := ledgerValues()
	for _, seed := range []struct {
		serde  *avro.Serde
		values []any
	}{
		{ls.commands, commands},
		{ls.events, events},
		{ls.state, states},
		{v1, []any{commandRejectedV1{"Deposit", "closed"}, transferDebited{"t", "a", 1}}},
		{every, everythingValues()},
	} {
		for _, v := range seed.values {
			b, err := seed.serde.Encode(ctx, v)
			if err != nil {
				f.Fatal(err)
			}
			f.Add(b)
		}
	}
	_ = ledgerSchema(f, ledger.State)

	f.Fuzz(func(t *testing.T, b []byte) {
		for i, s := range serdes {
			v, err := s.Decode(ctx, b)
			if err != nil {
				if errors.Is(err, avro.ErrPanicked) {
					t.Fatalf("serde %d: decoder panicked: %v", i, err)
				}
				if !errors.Is(err, avro.ErrMalformed) && !errors.Is(err, avro.ErrUnknownSchema) && !errors.Is(err, avro.ErrIncompatible) {
					t.Fatalf("serde %d: unclassified error: %v", i, err)
				}
				continue
			}
			again, err := s.Encode(ctx, v)
			if err != nil {
				t.Fatalf("serde %d: decoded %+v, which does not encode: %v", i, v, err)
			}
			v2, err := s.Decode(ctx, again)
			if err != nil {
				t.Fatalf("serde %d: re-encoded %+v does not decode: %v", i, v, err)
			}
			if got, want := dump(v2), dump(v); got != want {
				t.Fatalf("serde %d: round trip changed the value: got %s, want %s", i, got, want)
			}
		}
	})
}

// dump prints v deterministically, following pointers, with map keys
// sorted and NaN equal to NaN (where reflect.DeepEqual says it is not).
func dump(v any) string {
	var b strings.Builder
	dumpValue(&b, reflect.ValueOf(v))
	return b.String()
}

func dumpValue(b *strings.Builder, v reflect.Value) {
	switch v.Kind() {
	case reflect.Invalid:
		b.WriteString("nil")
	case reflect.Pointer, reflect.Interface:
		if v.IsNil() {
			b.WriteString("nil")
			return
		}
		b.WriteString("&")
		dumpValue(b, v.Elem())
	case reflect.Struct:
		if t, ok := v.Interface().(time.Time); ok {
			b.WriteString(t.UTC().Format(time.RFC3339Nano))
			return
		}
		b.WriteString("{")
		for i := range v.NumField() {
			if v.Type().Field(i).IsExported() {
				fmt.Fprintf(b, "%s:", v.Type().Field(i).Name)
				dumpValue(b, v.Field(i))
				b.WriteString(" ")
			}
		}
		b.WriteString("}")
	case reflect.Slice, reflect.Array:
		b.WriteString("[")
		for i := range v.Len() {
			dumpValue(b, v.Index(i))
			b.WriteString(" ")
		}
		b.WriteString("]")
	case reflect.Map:
		keys := v.MapKeys()
		slices.SortFunc(keys, func(x, y reflect.Value) int { return strings.Compare(x.String(), y.String()) })
		b.WriteString("map[")
		for _, k := range keys {
			fmt.Fprintf(b, "%q:", k.String())
			dumpValue(b, v.MapIndex(k))
			b.WriteString(" ")
		}
		b.WriteString("]")
	default:
		fmt.Fprintf(b, "%v", v.Interface())
	}
}
