package avro_test

import (
	"context"
	"testing"

	"github.com/linkedin/goavro/v2"

	"github.com/onceflow/onceflow/examples/ledger"
	"github.com/onceflow/onceflow/pipeline/avro"
)

// The benchmarks encode and decode a Deposited event through a Serde and,
// as a baseline in the same run, the same datum with goavro alone (no
// header, no registry lookup, no reflection, no resolution), so the
// difference is the Serde's overhead.

func BenchmarkEncode(b *testing.B) {
	ctx := context.Background()
	ls := newLedgerSerdes(b)
	v := deposited{Amount: 1_000_00}
	b.Run("serde", func(b *testing.B) {
		b.ReportAllocs()
		var buf []byte
		for b.Loop() {
			var err error
			if buf, err = ls.events.AppendEncode(ctx, buf[:0], v); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("goavro", func(b *testing.B) {
		codec := rawCodec(b)
		native := map[string]any{ns + "Deposited": map[string]any{"amount": int64(1_000_00)}}
		b.ReportAllocs()
		var buf []byte
		for b.Loop() {
			var err error
			if buf, err = codec.BinaryFromNative(buf[:0], native); err != nil {
				b.Fatal(err)
			}
		}
	})
	// What a goavro user pays per record: building the native maps.
	b.Run("goavro+maps", func(b *testing.B) {
		codec := rawCodec(b)
		b.ReportAllocs()
		var buf []byte
		for b.Loop() {
			native := map[string]any{ns + "Deposited": map[string]any{"amount": v.Amount}}
			var err error
			if buf, err = codec.BinaryFromNative(buf[:0], native); err != nil {
				b.Fatal(err)
			}
		}
	})
}

func BenchmarkDecode(b *testing.B) {
	ctx := context.Background()
	ls := newLedgerSerdes(b)
	framed, err := ls.events.Encode(ctx, deposited{Amount: 1_000_00})
	if err != nil {
		b.Fatal(err)
	}
	b.Run("serde", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := ls.events.Decode(ctx, framed); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("goavro", func(b *testing.B) {
		codec := rawCodec(b)
		payload := framed[avro.HeaderSize:]
		b.ReportAllocs()
		for b.Loop() {
			if _, _, err := codec.NativeFromBinary(payload); err != nil {
				b.Fatal(err)
			}
		}
	})
}

func rawCodec(b *testing.B) *goavro.Codec {
	codec, err := goavro.NewCodec(ledgerSchema(b, ledger.Events))
	if err != nil {
		b.Fatal(err)
	}
	return codec
}
