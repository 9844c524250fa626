package processor

import (
	"encoding/binary"
	"hash/maphash"
	"strings"
)

// table holds one partition's aggregates: for each aggregate id, the value
// of its last committed snapshot, exactly the bytes its transaction wrote
// to {prefix}.state (which is also what a restore reads back). Keeping the
// encoded snapshot (about 60 bytes for an account) rather than decoded
// structs, and indexing it with a table built for it rather than a Go map,
// is what keeps a million aggregates near 100 bytes each: a
// map[string]string costs about 84 bytes per entry on its own (its tables
// grow by powers of two), more than the snapshot.
//
// Each entry is one string: uvarint(len(id)), id, value; so an aggregate
// is one allocation plus its 16-byte header in entries (in chunks of 4096,
// so growing never copies them) plus its share of slots, an
// open-addressing index with linear probing kept at most 3/4 full. A slot holds the entry's index + 1 in its low 32 bits (0 is empty)
// and 32 bits of the id's hash in its high bits. The slot an id starts
// probing at is taken from those same bits, so growing places every slot
// again without touching an entry, and a probe rarely touches an entry
// that is not the one sought.
//
// A table is not safe for concurrent use: the processor's loop writes it,
// and readers outside the loop hold the processor's mutex while it does.
type table struct {
	seed   maphash.Seed
	slots  []uint64
	chunks [][]string // entry i is chunks[i/chunkSize][i%chunkSize]
	n      int        // entries
}

const chunkBits = 12
const chunkSize = 1 << chunkBits

// at returns entry i.
func (t *table) at(i int) *string { return &t.chunks[i>>chunkBits][i&(chunkSize-1)] }

func slot(h uint32, index int) uint64 { return uint64(h)<<32 | uint64(index+1) }

func slotIndex(s uint64) int { return int(uint32(s)) - 1 }

func slotHash(s uint64) uint32 { return uint32(s >> 32) }

func newTable() *table { return &table{seed: maphash.MakeSeed()} }

// entry builds the entry of id with value, in one allocation.
func entry(id string, value []byte) string {
	var n [binary.MaxVarintLen64]byte
	k := binary.PutUvarint(n[:], uint64(len(id)))
	var b strings.Builder
	b.Grow(k + len(id) + len(value))
	b.Write(n[:k])
	b.WriteString(id)
	b.Write(value)
	return b.String()
}

// split returns an entry's id and value.
func split(e string) (id, value string) {
	n, k := uvarint(e)
	return e[k : k+n], e[k+n:]
}

func uvarint(s string) (n, k int) {
	var x uint64
	var shift uint
	for i := 0; i < len(s); i++ {
		b := s[i]
		x |= uint64(b&0x7f) << shift
		if b < 0x80 {
			return int(x), i + 1
		}
		shift += 7
	}
	return 0, 0 // not reached: entries are built by entry
}

func (t *table) len() int { return t.n }

// find returns the slot of id, hashed to h: the slot holding it, or the
// empty slot where it goes.
func (t *table) find(id string, h uint32) int {
	mask := len(t.slots) - 1
	for i := int(h) & mask; ; i = (i + 1) & mask {
		s := t.slots[i]
		if s == 0 {
			return i
		}
		if slotHash(s) == h {
			if k, _ := split(*t.at(slotIndex(s))); k == id {
				return i
			}
		}
	}
}

func (t *table) hash(id string) uint32 { return uint32(maphash.String(t.seed, id) >> 32) }

// get returns the snapshot value of id.
func (t *table) get(id string) (string, bool) {
	if len(t.slots) == 0 {
		return "", false
	}
	s := t.slots[t.find(id, t.hash(id))]
	if s == 0 {
		return "", false
	}
	_, v := split(*t.at(slotIndex(s)))
	return v, true
}

// put stores an entry built by entry, replacing the one with its id.
func (t *table) put(e string) {
	id, _ := split(e)
	h := t.hash(id)
	if (t.n+1)*4 > len(t.slots)*3 {
		t.grow()
	}
	i := t.find(id, h)
	if s := t.slots[i]; s != 0 {
		*t.at(slotIndex(s)) = e
		return
	}
	if t.n == len(t.chunks)*chunkSize {
		t.chunks = append(t.chunks, make([]string, chunkSize))
	}
	*t.at(t.n) = e
	t.slots[i] = slot(h, t.n)
	t.n++
}

// grow doubles the slots. The hash bits kept in each slot place it again.
func (t *table) grow() {
	old := t.slots
	t.slots = make([]uint64, max(16, 2*len(old)))
	mask := len(t.slots) - 1
	for _, s := range old {
		if s == 0 {
			continue
		}
		i := int(slotHash(s)) & mask
		for t.slots[i] != 0 {
			i = (i + 1) & mask
		}
		t.slots[i] = s
	}
}

// delete removes id (a tombstone on the state topic).
func (t *table) delete(id string) {
	if len(t.slots) == 0 {
		return
	}
	i := t.find(id, t.hash(id))
	if t.slots[i] == 0 {
		return
	}
	// Move the last entry into the hole, then drop the slot.
	j := slotIndex(t.slots[i])
	last := t.n - 1
	if j != last {
		lastID, _ := split(*t.at(last))
		h := t.hash(lastID)
		t.slots[t.find(lastID, h)] = slot(h, j)
		*t.at(j) = *t.at(last)
	}
	*t.at(last) = ""
	t.n--
	if t.n == (len(t.chunks)-1)*chunkSize {
		t.chunks = t.chunks[:len(t.chunks)-1]
	}
	t.unslot(i)
}

// unslot empties slot i and shifts back the entries of its probe run that
// would no longer be found (deletion without tombstones in linear probing).
func (t *table) unslot(i int) {
	mask := len(t.slots) - 1
	for j := (i + 1) & mask; t.slots[j] != 0; j = (j + 1) & mask {
		home := int(slotHash(t.slots[j])) & mask
		// The entry at j may move to i if its home is not in (i, j],
		// cyclically.
		if (i <= j && (home <= i || home > j)) || (i > j && home <= i && home > j) {
			t.slots[i] = t.slots[j]
			i = j
		}
	}
	t.slots[i] = 0
}

// each calls fn for every aggregate.
func (t *table) each(fn func(id, value string)) {
	for i := range t.n {
		fn(split(*t.at(i)))
	}
}
