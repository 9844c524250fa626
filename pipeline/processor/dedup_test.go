package processor

import (
	"math/rand/v2"
	"testing"
	"time"

	"github.com/onceflow/onceflow/pipeline"
)

// TestIDStoreAgainstAModel adds, looks up and expires ids at random, with
// time moving on, and compares every answer with a map of what must be
// remembered: an id added within the window is always found, one added
// more than the window and a chunk's span ago never is, and the store
// holds no more than that.
func TestIDStoreAgainstAModel(t *testing.T) {
	t.Parallel()
	for seed := range uint64(8) {
		rng := rand.New(rand.NewPCG(seed, 1))
		window := time.Duration(1+rng.IntN(100)) * time.Second
		s := newIDStore(window)
		span := s.span
		added := map[digest]int64{} // id -> time it was added
		now := int64(1_700_000_000_000)
		expiredAt := now // the last expire's time: ids older than it by the window and a span are gone
		var all []digest
		for step := range 6_000 {
			now += int64(rng.IntN(int(window.Milliseconds()/50) + 1))
			switch k := rng.IntN(10); {
			case k < 6: // a batch of new ids
				ds := make([]digest, 1+rng.IntN(40))
				for i := range ds {
					id := pipeline.NewCommandID()
					ds[i] = dedupDigest("acme/acc-"+string(rune('a'+rng.IntN(3))), id)
					added[ds[i]] = now
				}
				s.add(ds, now)
				s.expire(now - window.Milliseconds())
				expiredAt = now
				all = append(all, ds...)
			default: // look up ids of any age, and some never added
				for range 20 {
					var d digest
					if len(all) > 0 && rng.IntN(4) > 0 {
						d = all[rng.IntN(len(all))]
					} else {
						d = dedupDigest("acme/x", pipeline.NewCommandID())
					}
					at, ok := added[d]
					got := s.contains(d)
					switch {
					case !ok && got:
						t.Fatalf("seed %d step %d: found an id never added", seed, step)
					case ok && now-at <= window.Milliseconds() && !got:
						t.Fatalf("seed %d step %d: id added %dms ago, inside the %s window, is forgotten", seed, step, now-at, window)
					case ok && expiredAt-at > window.Milliseconds()+span && got:
						t.Fatalf("seed %d step %d: id added %dms before the last expiry is still remembered (window %s, span %dms)", seed, step, expiredAt-at, window, span)
					}
				}
			}
		}
		live := 0
		for _, at := range added {
			if expiredAt-at <= window.Milliseconds()+span {
				live++
			}
		}
		if s.len() > live {
			t.Errorf("seed %d: the store holds %d ids, at most %d can be inside the window and a span", seed, s.len(), live)
		}
	}
}

// TestIDStoreRestore indexes what a restore appended at once, and finds
// every id.
func TestIDStoreRestore(t *testing.T) {
	t.Parallel()
	s := newIDStore(time.Hour)
	var ds []digest
	for i := range 5000 {
		ds = append(ds, dedupDigest("acme/hot", pipeline.NewCommandID()))
		if i%700 == 0 {
			s.restored(ds, int64(1_700_000_000_000+i))
			ds = ds[:0]
		}
	}
	s.restored(ds, 1_700_000_000_000+5000)
	s.restoreDone()
	if s.len() != 5000 {
		t.Fatalf("restored %d ids, want 5000", s.len())
	}
	n := 0
	for _, c := range s.chunks {
		for _, d := range c {
			if !s.contains(d) {
				t.Fatal("a restored id is not found")
			}
			n++
		}
	}
	if n != 5000 || s.contains(dedupDigest("acme/hot", pipeline.NewCommandID())) {
		t.Fatalf("walked %d ids, or found one never restored", n)
	}
}

// The same command id on two aggregates, or in two tenants, is two
// commands.
func TestDigestIsScopedByAggregate(t *testing.T) {
	t.Parallel()
	id := pipeline.NewCommandID()
	a := dedupDigest("acme/acc-1", id)
	for _, other := range []string{"acme/acc-2", "other/acc-1", "acme/acc-1\x00"} {
		if dedupDigest(other, id) == a {
			t.Errorf("%q and acme/acc-1 share the digest of one command id", other)
		}
	}
	if dedupDigest("acme/acc-1", id) != a {
		t.Error("the same command gave two digests")
	}
}

func TestDedupRecordRoundTrip(t *testing.T) {
	t.Parallel()
	ds := []digest{dedupDigest("a/b", pipeline.NewCommandID()), dedupDigest("a/c", pipeline.NewCommandID())}
	got, err := appendDedupRecord(nil, dedupRecordValue(ds))
	if err != nil || len(got) != 2 || got[0] != ds[0] || got[1] != ds[1] {
		t.Fatalf("got %v, %v; want %v", got, err, ds)
	}
	for _, bad := range [][]byte{nil, {2}, {1, 0}, append(dedupRecordValue(ds), 0)} {
		if _, err := appendDedupRecord(nil, bad); err == nil {
			t.Errorf("%x: want an error", bad)
		}
	}
}
