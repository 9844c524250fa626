package avro_test

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"testing"

	"github.com/onceflow/onceflow/examples/ledger"
	"github.com/onceflow/onceflow/pipeline/avro"
)

// bytesPerRun returns the bytes f allocates per call, averaged over runs.
// Tests using it must not be parallel: parallel tests would add their own.
func bytesPerRun(runs int, f func()) uint64 {
	f() // warm caches (writer plans) outside the measurement
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	for range runs {
		f()
	}
	runtime.ReadMemStats(&after)
	return (after.TotalAlloc - before.TotalAlloc) / uint64(runs)
}

func varints(vs ...int64) []byte {
	var b []byte
	for _, v := range vs {
		b = binary.AppendVarint(b, v) // zig-zag, as Avro's int and long
	}
	return b
}

// TestHostileClaims decodes payloads that claim huge arrays, maps, strings
// and bytes: each must fail fast, without allocating for the claim.
func TestHostileClaims(t *testing.T) {
	ctx := context.Background()
	ls := newLedgerSerdes(t)
	reg := ls.reg
	type arr struct{ A []int64 }
	type mp struct{ M map[string]int64 }
	type bs struct{ B []byte }
	arrays := newSerde(t, reg, "a-value", `{"type":"record","name":"A","fields":[{"name":"a","type":{"type":"array","items":"long"}}]}`, map[string]any{"A": arr{}})
	maps := newSerde(t, reg, "m-value", `{"type":"record","name":"M","fields":[{"name":"m","type":{"type":"map","values":"long"}}]}`, map[string]any{"M": mp{}})
	blobs := newSerde(t, reg, "b-value", `{"type":"record","name":"B","fields":[{"name":"b","type":"bytes"}]}`, map[string]any{"B": bs{}})
	ids := map[*avro.Serde]int{}
	for _, s := range []*avro.Serde{ls.events, ls.state, arrays, maps, blobs} {
		id, err := s.Register(ctx)
		if err != nil {
			t.Fatal(err)
		}
		ids[s] = id
	}
	const huge = 1 << 40
	for _, tc := range []struct {
		name    string
		serde   *avro.Serde
		payload []byte
		say     string
	}{
		{"snapshot with 2^40 processed", ls.state, varints(0, huge), "MaxBlockCount"},
		{"snapshot with -2^40 processed (sized block)", ls.state, varints(0, -huge, 100), "MaxBlockCount"},
		{"array of 2^40 longs", arrays, varints(huge), "MaxBlockCount"},
		{"array one over the limit", arrays, varints(avro.MaxBlockCount + 1), "MaxBlockCount"},
		{"array in blocks, second one huge", arrays, varints(1, 7, huge), "MaxBlockCount"},
		{"map of 2^40 longs", maps, varints(huge), "MaxBlockCount"},
		{"CommandRejected with a 2^40-byte command_type", ls.events, varints(7, huge), "short buffer"},
		{"CommandRejected with a 2^40-byte detail", ls.events, append(varints(7, 1), append([]byte("W"), varints(0, huge)...)...), "short buffer"},
		{"2^40 bytes", blobs, varints(huge), "short buffer"},
		{"map with a 2^40-byte key", maps, varints(1, huge), "short buffer"},
	} {
		in := append(avro.AppendHeader(nil, ids[tc.serde]), tc.payload...)
		var err error
		perRun := bytesPerRun(20, func() { _, err = tc.serde.Decode(ctx, in) })
		if !errors.Is(err, avro.ErrMalformed) || !strings.Contains(err.Error(), tc.say) {
			t.Errorf("%s: got %v, want ErrMalformed saying %q", tc.name, err, tc.say)
		}
		t.Logf("%s: %d bytes allocated per decode", tc.name, perRun)
		if perRun > 16<<10 {
			t.Errorf("%s: allocated %d bytes per decode, want under 16 KiB", tc.name, perRun)
		}
	}
}

// TestBlockCountClaimAtLimit measures the worst a claim within the limit
// costs: goavro allocates for a block's whole count before reading an item.
// These are the figures documented in limits.go.
func TestBlockCountClaimAtLimit(t *testing.T) {
	ctx := context.Background()
	reg := avro.NewEmbedded()
	type arr struct{ A []int64 }
	type mp struct{ M map[string]int64 }
	arrays := newSerde(t, reg, "a-value", `{"type":"record","name":"A","fields":[{"name":"a","type":{"type":"array","items":"long"}}]}`, map[string]any{"A": arr{}})
	maps := newSerde(t, reg, "m-value", `{"type":"record","name":"M","fields":[{"name":"m","type":{"type":"map","values":"long"}}]}`, map[string]any{"M": mp{}})
	for _, tc := range []struct {
		name  string
		serde *avro.Serde
		limit uint64
	}{
		{"array", arrays, 5 << 20},
		{"map", maps, 32 << 20},
	} {
		id, err := tc.serde.Register(ctx)
		if err != nil {
			t.Fatal(err)
		}
		in := append(avro.AppendHeader(nil, id), varints(avro.MaxBlockCount)...)
		perRun := bytesPerRun(3, func() { _, err = tc.serde.Decode(ctx, in) })
		if !errors.Is(err, avro.ErrMalformed) {
			t.Errorf("%s: got %v, want ErrMalformed", tc.name, err)
		}
		t.Logf("%s: a claim of %d items backed by no bytes allocates %.1f MiB", tc.name, avro.MaxBlockCount, float64(perRun)/(1<<20))
		if perRun > tc.limit {
			t.Errorf("%s: allocated %d bytes, want at most %d", tc.name, perRun, tc.limit)
		}
	}
}

// TestLongArraysRoundTrip: what we write we read, even past the block
// limit (the encoder splits arrays into blocks).
func TestLongArraysRoundTrip(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	type arr struct{ A []int64 }
	s := newSerde(t, avro.NewEmbedded(), "a-value", `{"type":"record","name":"A","fields":[{"name":"a","type":{"type":"array","items":"long"}}]}`, map[string]any{"A": arr{}})
	v := arr{A: make([]int64, avro.MaxBlockCount+10)}
	for i := range v.A {
		v.A[i] = int64(i)
	}
	b, err := s.Encode(ctx, v)
	if err != nil {
		t.Fatal(err)
	}
	got, err := s.Decode(ctx, b)
	if err != nil {
		t.Fatal(err)
	}
	if g := got.(arr).A; len(g) != len(v.A) || g[len(g)-1] != v.A[len(v.A)-1] {
		t.Fatalf("got %d items, want %d", len(g), len(v.A))
	}
}

// TestHostileWriterSchemas: a writer schema from the registry that would
// let payloads grow without bound is refused as incompatible, not decoded.
func TestHostileWriterSchemas(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	reg := avro.NewEmbedded()
	s := newSerde(t, reg, avro.ValueSubject("ledger.events"), ledgerSchema(t, ledger.Events), eventTypes())
	for i, ws := range []string{
		`{"type":"record","name":"L","namespace":"onceflow.ledger","fields":[{"name":"next","type":["null","L"]}]}`,
		`{"type":"record","name":"Deposited","namespace":"onceflow.ledger","fields":[{"name":"amount","type":"long"},{"name":"pad","type":{"type":"array","items":"null"}}]}`,
	} {
		id, err := reg.Register(ctx, fmt.Sprintf("other-%d-value", i), ws)
		if err != nil {
			t.Fatal(err)
		}
		// A million-deep list, or a billion nulls, in a few bytes.
		payload := append(avro.AppendHeader(nil, id), varints(0, 1_000_000_000, 0)...)
		if _, err := s.Decode(ctx, payload); !errors.Is(err, avro.ErrIncompatible) {
			t.Errorf("writer schema %s: got %v, want ErrIncompatible", ws, err)
		}
	}
}
