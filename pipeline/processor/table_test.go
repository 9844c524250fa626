package processor

import (
	"fmt"
	"math/rand/v2"
	"testing"
)

// The table behaves as a map from aggregate id to snapshot value under any
// sequence of puts, replacements and deletes (deletes shift probe runs
// back, the subtle part of linear probing).
func TestTableMatchesMap(t *testing.T) {
	t.Parallel()
	for seed := range uint64(20) {
		rng := rand.New(rand.NewPCG(seed, 1))
		tab, want := newTable(), map[string]string{}
		keys := 1 + rng.IntN(300)
		for op := range 5000 {
			id := fmt.Sprintf("acme/%d", rng.IntN(keys))
			switch rng.IntN(4) {
			case 0:
				tab.delete(id)
				delete(want, id)
			default:
				v := fmt.Sprintf("v%d-%d", op, rng.IntN(1000))
				tab.put(entry(id, []byte(v)))
				want[id] = v
			}
			if tab.len() != len(want) {
				t.Fatalf("seed %d op %d: len %d, want %d", seed, op, tab.len(), len(want))
			}
		}
		for i := range keys {
			id := fmt.Sprintf("acme/%d", i)
			got, ok := tab.get(id)
			w, wok := want[id]
			if ok != wok || got != w {
				t.Fatalf("seed %d: get(%s) = %q, %v; want %q, %v", seed, id, got, ok, w, wok)
			}
		}
		n := 0
		tab.each(func(id, value string) {
			n++
			if want[id] != value {
				t.Fatalf("seed %d: each gave %s=%q, want %q", seed, id, value, want[id])
			}
		})
		if n != len(want) {
			t.Fatalf("seed %d: each visited %d, want %d", seed, n, len(want))
		}
	}
}

// Ids of any length round-trip through an entry (the length is a uvarint).
func TestTableEntry(t *testing.T) {
	t.Parallel()
	for _, n := range []int{0, 1, 127, 128, 300, 20000} {
		id := string(make([]byte, n))
		e := entry(id, []byte("value"))
		gotID, v := split(e)
		if gotID != id || v != "value" {
			t.Fatalf("id of %d bytes: split gave %d bytes and %q", n, len(gotID), v)
		}
	}
}

// Entries live in chunks: filling several and emptying them again keeps
// every entry reachable and gives the chunks back.
func TestTableChunks(t *testing.T) {
	t.Parallel()
	tab := newTable()
	const n = 3*chunkSize + 17
	for i := range n {
		tab.put(entry(fmt.Sprintf("acme/%d", i), []byte{byte(i)}))
	}
	if len(tab.chunks) != 4 {
		t.Fatalf("%d chunks for %d entries, want 4", len(tab.chunks), n)
	}
	rng := rand.New(rand.NewPCG(9, 9))
	order := rng.Perm(n)
	for k, i := range order {
		tab.delete(fmt.Sprintf("acme/%d", i))
		if k%997 == 0 {
			for _, j := range order[k+1:] {
				if v, ok := tab.get(fmt.Sprintf("acme/%d", j)); !ok || v != string([]byte{byte(j)}) {
					t.Fatalf("after %d deletes: acme/%d = %q, %v", k+1, j, v, ok)
				}
			}
		}
	}
	if tab.len() != 0 || len(tab.chunks) != 0 {
		t.Fatalf("emptied table: len %d, %d chunks; want 0, 0", tab.len(), len(tab.chunks))
	}
}
