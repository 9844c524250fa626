package processor_test

import (
	"context"
	"errors"
	"math"
	"math/rand/v2"
	"reflect"
	"testing"

	"github.com/onceflow/onceflow/examples/ledger"
	"github.com/onceflow/onceflow/pipeline"
	"github.com/onceflow/onceflow/pipeline/avro"
	"github.com/onceflow/onceflow/pipeline/kafka"
	"github.com/onceflow/onceflow/pipeline/processor"
)

// codecProcessor is a ledger processor that is never run: its snapshot
// codec is what these tests exercise.
func codecProcessor(t testing.TB) (*processor.Processor[ledger.Account], serdes) {
	t.Helper()
	topics := kafka.Topics{Prefix: "codec"}
	s, err := newSerdes(context.Background(), avro.NewEmbedded(), topics)
	if err != nil {
		t.Fatal(err)
	}
	p, err := processor.New(processor.Config{Topics: topics, InstanceID: "codec"}, kafka.Config{}, ledger.NewDecider(), s.processor(), nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !p.FastSnapshots() {
		t.Fatal("ledger.Account snapshots do not take the fast path")
	}
	return p, s
}

func randomSnapshot(rng *rand.Rand) processor.Snapshot[ledger.Account] {
	snap := processor.Snapshot[ledger.Account]{
		Version: rng.Int64N(1 << uint(rng.IntN(63))),
		State: ledger.Account{
			Open: rng.IntN(2) == 0, Closed: rng.IntN(2) == 0,
			Currency: []string{"", "EUR", "USD", "XAU", "ZZZZZZ"}[rng.IntN(5)],
			Balance:  []int64{0, 1, -1, math.MaxInt64, math.MinInt64, rng.Int64()}[rng.IntN(6)],
		},
	}
	for range rng.IntN(4) {
		var id pipeline.ID
		for i := range id {
			id[i] = byte(rng.Uint32())
		}
		snap.Processed = append(snap.Processed, processor.ProcessedCommand{CommandID: id, AtMs: rng.Int64N(1 << 45)})
	}
	return snap
}

// The fast path writes exactly the bytes the schema-driven Serde writes,
// and each reads what the other wrote: a snapshot written by this binary
// can be read by any Avro reader of state.avsc, and vice versa.
func TestSnapshotCodecMatchesSerde(t *testing.T) {
	t.Parallel()
	p, s := codecProcessor(t)
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range 2000 {
		snap := randomSnapshot(rng)
		fast, err := p.EncodeSnapshot(ctx, snap)
		if err != nil {
			t.Fatal(err)
		}
		slow, err := s.State.Encode(ctx, snap)
		if err != nil {
			t.Fatal(err)
		}
		if string(fast) != string(slow) {
			t.Fatalf("snapshot %d %+v:\nfast  %x\nserde %x", i, snap, fast, slow)
		}
		got, err := p.DecodeSnapshot(ctx, slow)
		if err != nil {
			t.Fatalf("snapshot %d: fast decode of the serde's bytes: %v", i, err)
		}
		if !reflect.DeepEqual(got, snap) {
			t.Fatalf("snapshot %d: decoded %+v, want %+v", i, got, snap)
		}
		v, err := s.State.Decode(ctx, fast)
		if err != nil || !reflect.DeepEqual(v, snap) {
			t.Fatalf("snapshot %d: serde decode of the fast bytes: %+v, %v", i, v, err)
		}
	}
}

// A truncated or corrupted snapshot is an error wrapping
// pipeline.ErrUndecodable, never a panic or a huge allocation.
func TestSnapshotCodecRejectsBadBytes(t *testing.T) {
	t.Parallel()
	p, _ := codecProcessor(t)
	ctx := context.Background()
	snap := randomSnapshot(rand.New(rand.NewPCG(3, 4)))
	snap.Processed = append(snap.Processed, processor.ProcessedCommand{AtMs: 1})
	b, err := p.EncodeSnapshot(ctx, snap)
	if err != nil {
		t.Fatal(err)
	}
	for n := 5; n < len(b); n++ {
		if _, err := p.DecodeSnapshot(ctx, b[:n]); !errors.Is(err, pipeline.ErrUndecodable) {
			t.Fatalf("truncated to %d of %d bytes: got %v, want ErrUndecodable", n, len(b), err)
		}
	}
	if _, err := p.DecodeSnapshot(ctx, append(b, 0)); !errors.Is(err, pipeline.ErrUndecodable) {
		t.Fatalf("trailing byte: got %v, want ErrUndecodable", err)
	}
	huge := append(append([]byte(nil), b[:5]...), 2, 0xfe, 0xff, 0xff, 0xff, 0x0f) // version 1, then 2^31 ids
	if _, err := p.DecodeSnapshot(ctx, huge); !errors.Is(err, pipeline.ErrUndecodable) {
		t.Fatalf("a count of 2^31 ids: got %v, want ErrUndecodable", err)
	}
}

// FuzzSnapshotPayload feeds the fast decoder arbitrary bytes (a state
// topic is input like any other): it must return an error or a snapshot
// that encodes back to the same bytes.
func FuzzSnapshotPayload(f *testing.F) {
	p, _ := codecProcessor(f)
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(5, 6))
	for range 8 {
		b, err := p.EncodeSnapshot(ctx, randomSnapshot(rng))
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b[5:])
	}
	f.Fuzz(func(t *testing.T, payload []byte) {
		snap, err := processor.DecodeSnapshotPayload[ledger.Account](payload)
		if err != nil {
			if !errors.Is(err, pipeline.ErrUndecodable) {
				t.Fatalf("error %v does not wrap ErrUndecodable", err)
			}
			return
		}
		b, err := p.EncodeSnapshot(ctx, snap)
		if err != nil {
			t.Fatal(err)
		}
		// Avro allows several encodings of one value (array blocks,
		// non-minimal varints), so only check it decodes to the same.
		again, err := processor.DecodeSnapshotPayload[ledger.Account](b[5:])
		if err != nil || !reflect.DeepEqual(again, snap) {
			t.Fatalf("re-encoded snapshot decodes to %+v, %v; want %+v", again, err, snap)
		}
	})
}
