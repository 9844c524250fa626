package processor

import (
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"math/bits"
	"slices"
	"time"

	"github.com/onceflow/onceflow/pipeline"
)

// The dedup memory (docs/decisions/0021-bounded-dedup-memory.md): every
// command a partition's aggregates handled within the dedup window is
// remembered as a digest in that partition's idStore, and the digests each
// committed transaction added are in that transaction's records on
// {prefix}.dedup, the store's changelog, at the command's partition. A
// restore reads the changelog back from the records still inside the
// window. What an aggregate remembers no longer lives in its snapshot, so
// a snapshot's size does not grow with its aggregate's traffic.

// digest names one command of one aggregate: the first 16 bytes of
// SHA-256(aggregate id, 0, command id). A command id is only unique within
// its aggregate (two aggregates, or two tenants, may use the same one), so
// the aggregate is part of the name. Two different commands share a digest
// with probability about n²/2¹²⁹ for n remembered ids (below 10⁻¹⁸ for
// ten billion), and a producer cannot aim for another's digest: that would
// take a second preimage of SHA-256.
type digest [16]byte

func dedupDigest(aggregateID string, id pipeline.ID) digest {
	var buf [192]byte
	b := append(buf[:0], aggregateID...)
	b = append(b, 0)
	b = append(b, id[:]...)
	sum := sha256.Sum256(b)
	return digest(sum[:16])
}

// storeChunkBits sizes the chunks of an idStore's log: at most 1,024
// digests (16 KiB), and at most a sixteenth of the window between the
// first id of a chunk and its last. A chunk is forgotten as a whole once
// its newest id left the window, so an id is remembered for the window and
// at most a sixteenth of it longer, never shorter, whatever the traffic.
const (
	storeChunkBits = 10
	storeChunkSize = 1 << storeChunkBits
	chunkSpans     = 16 // a chunk spans at most window/chunkSpans
)

// idStore is one partition's remembered command digests: a log in the
// order they were remembered, in chunks, and an open-addressing index
// over it.
//
// The index is two parallel arrays of n slots: a tag byte (0: empty; else
// 8 bits of the digest) and the log position of the digest (as seq - base
// + 1). A lookup scans tags linearly from the digest's home slot and reads
// the log only when a tag matches, so a miss (every new command) touches
// little but the tag array. Slots whose position fell out of the log (the
// chunk was forgotten) are dead: lookups skip them, inserts reuse them, and
// the index is rebuilt (dropping them) when live and dead slots fill more
// than maxLoad of it. The size is any n (fastrange), rebuilt to hold the
// live ids at rebuildLoad, so the index costs 5/0.8 to 5/0.55 bytes an id:
// with the digest, 22 to 25 bytes for each remembered id.
//
// An idStore is not safe for concurrent use: the processor's loop and its
// restore own it.
type idStore struct {
	span   int64      // the longest time (ms) between a chunk's first and last id
	chunks [][]digest // chunks[i][j] has sequence number first + i*storeChunkSize + j
	oldest []int64    // the time (unix ms) each chunk's first id was remembered at
	newest []int64    // the newest remembered time in each chunk
	first  uint64     // sequence number of chunks[0][0]
	next   uint64     // sequence number of the next id
	n      int        // ids in the log (a chunk closed early leaves its sequence numbers unused)

	base uint64 // pos[i] holds seq - base + 1
	tags []byte
	pos  []uint32
	used int // slots with a tag, live or dead
}

const (
	maxLoad     = 0.8
	rebuildLoad = 0.55
)

func newIDStore(window time.Duration) *idStore {
	return &idStore{span: max(1, window.Milliseconds()/chunkSpans)}
}

// len is the number of ids remembered.
func (s *idStore) len() int { return s.n }

// bytes is the memory the store holds: its log's chunks and its index.
func (s *idStore) bytes() int {
	n := 16*len(s.oldest) + len(s.tags) + 4*len(s.pos)
	for _, c := range s.chunks {
		n += 16 * cap(c)
	}
	return n
}

func (s *idStore) at(seq uint64) *digest {
	off := seq - s.first
	return &s.chunks[off>>storeChunkBits][off&(storeChunkSize-1)]
}

// home is a digest's first slot and tag.
func (s *idStore) home(d *digest) (int, byte) {
	h := binary.LittleEndian.Uint64(d[:8])
	i, _ := bits.Mul64(h, uint64(len(s.tags)))
	tag := d[8]
	if tag == 0 {
		tag = 1
	}
	return int(i), tag
}

// contains reports whether d is remembered.
func (s *idStore) contains(d digest) bool {
	if len(s.tags) == 0 {
		return false
	}
	i, tag := s.home(&d)
	for {
		t := s.tags[i]
		if t == 0 {
			return false
		}
		if t == tag {
			seq := s.base + uint64(s.pos[i]) - 1
			if seq >= s.first && *s.at(seq) == d {
				return true
			}
		}
		if i++; i == len(s.tags) {
			i = 0
		}
	}
}

// add remembers ds, which it does not hold, at time at (unix ms).
func (s *idStore) add(ds []digest, at int64) {
	for _, d := range ds {
		seq := s.append(d, at)
		if float64(s.used+1) > maxLoad*float64(len(s.tags)) || seq-s.base >= 1<<32-1 {
			s.reindex()
			continue // reindex placed it
		}
		s.place(d, seq)
	}
}

// append adds d to the log and returns its sequence number.
func (s *idStore) append(d digest, at int64) uint64 {
	n := len(s.chunks)
	if n == 0 || len(s.chunks[n-1]) == storeChunkSize || at-s.oldest[n-1] > s.span {
		if n > 0 { // close the last chunk: the next starts at a chunk boundary
			s.next = s.first + uint64(n)<<storeChunkBits
		}
		s.chunks = append(s.chunks, nil)
		s.oldest = append(s.oldest, at)
		s.newest = append(s.newest, at)
		n++
	}
	c := s.chunks[n-1]
	if len(c) == cap(c) { // grow by hand: never past a chunk's size
		grown := make([]digest, len(c), min(storeChunkSize, max(16, 2*cap(c))))
		copy(grown, c)
		c = grown
	}
	s.chunks[n-1] = append(c, d)
	s.newest[n-1] = max(s.newest[n-1], at)
	seq := s.next
	s.next++
	s.n++
	return seq
}

// place puts seq's slot in the index: at the first empty or dead slot from
// d's home (d is not in the index, so no live slot of it is further on).
func (s *idStore) place(d digest, seq uint64) {
	i, tag := s.home(&d)
	for {
		t := s.tags[i]
		if t == 0 {
			s.used++
			break
		}
		if s.base+uint64(s.pos[i])-1 < s.first { // dead
			break
		}
		if i++; i == len(s.tags) {
			i = 0
		}
	}
	s.tags[i] = tag
	s.pos[i] = uint32(seq - s.base + 1)
}

// reindex rebuilds the index over the live log, sized for its ids at
// rebuildLoad.
func (s *idStore) reindex() {
	n := max(64, int(float64(s.n+1)/rebuildLoad))
	s.tags = make([]byte, n)
	s.pos = make([]uint32, n)
	s.base, s.used = s.first, 0
	for i, c := range s.chunks {
		seq := s.first + uint64(i)<<storeChunkBits
		for j := range c {
			s.place(c[j], seq+uint64(j))
		}
	}
}

// expire forgets the chunks whose newest id is older than cutoff (unix
// ms). Their slots die in place; the index is rebuilt once dead slots make
// it too full.
func (s *idStore) expire(cutoff int64) {
	k := 0
	for k < len(s.chunks) && s.newest[k] < cutoff {
		s.n -= len(s.chunks[k])
		k++
	}
	if k == 0 {
		return
	}
	if k == len(s.chunks) {
		*s = idStore{span: s.span, first: s.next, next: s.next}
		return
	}
	s.first += uint64(k) << storeChunkBits
	s.chunks = slices.Delete(s.chunks, 0, k)
	s.oldest = slices.Delete(s.oldest, 0, k)
	s.newest = slices.Delete(s.newest, 0, k)
}

// restored appends the digests a restore read at time at, without
// indexing them: the restore indexes them all at once when it is done
// (restoreDone), sized for what it read.
func (s *idStore) restored(ds []digest, at int64) {
	for _, d := range ds {
		s.append(d, at)
	}
}

// restoreDone indexes what restored appended.
func (s *idStore) restoreDone() { s.reindex() }

// The changelog's record values: a format byte, then the digests.
const (
	dedupFormat = 1
	// maxDigestsPerRecord keeps a changelog record at 256 KiB, well under
	// any broker's message size limit, however large a batch is.
	maxDigestsPerRecord = 16 << 10
)

func dedupRecordValue(ds []digest) []byte {
	v := make([]byte, 1, 1+16*len(ds))
	v[0] = dedupFormat
	for i := range ds {
		v = append(v, ds[i][:]...)
	}
	return v
}

// appendDedupRecord appends the digests a changelog record value holds.
func appendDedupRecord(dst []digest, v []byte) ([]digest, error) {
	if len(v) < 1 || v[0] != dedupFormat || (len(v)-1)%16 != 0 {
		return dst, fmt.Errorf("%w: dedup record of %d bytes is not format %d", pipeline.ErrUndecodable, len(v), dedupFormat)
	}
	for v = v[1:]; len(v) > 0; v = v[16:] {
		dst = append(dst, digest(v[:16]))
	}
	return dst, nil
}
