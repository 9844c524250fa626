package pipeline_test

import (
	"bytes"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/onceflow/onceflow/pipeline"
)

func TestNewCommandIDIsV7AndOrdered(t *testing.T) {
	t.Parallel()
	before := time.Now().Truncate(time.Millisecond)
	prev := pipeline.NewCommandID()
	for i := 0; i < 100_000; i++ {
		id := pipeline.NewCommandID()
		if bytes.Compare(id[:], prev[:]) <= 0 {
			t.Fatalf("id %d: %s does not sort after %s", i, id, prev)
		}
		prev = id
	}
	u, err := uuid.Parse(prev.String())
	if err != nil {
		t.Fatalf("google/uuid cannot parse %s: %v", prev, err)
	}
	if got := u.Version(); got != 7 {
		t.Fatalf("version: got %d, want 7", got)
	}
	if got := u.Variant(); got != uuid.RFC4122 {
		t.Fatalf("variant: got %v, want RFC4122", got)
	}
	sec, nsec := u.Time().UnixTime()
	if got := time.Unix(sec, nsec); got.Before(before) || got.After(time.Now().Add(time.Second)) {
		t.Fatalf("embedded time %v is not around now", got)
	}
	if got := prev.Time(); !got.Equal(time.Unix(sec, nsec).Truncate(time.Millisecond)) {
		t.Fatalf("ID.Time: got %v, google/uuid says %v", got, time.Unix(sec, nsec))
	}
}

func TestEventIDIsDeterministicUUIDv5(t *testing.T) {
	t.Parallel()
	cmd := pipeline.MustParseID("01890a5d-ac96-774b-bcce-b302099a8057")
	const agg = "acme/acc-1"
	a, b := pipeline.EventID(agg, cmd, 0), pipeline.EventID(agg, cmd, 0)
	if a != b {
		t.Fatalf("same command and index gave %s and %s", a, b)
	}
	if pipeline.EventID(agg, cmd, 1) == a {
		t.Fatal("index 0 and 1 gave the same id")
	}
	if pipeline.EventID(agg, pipeline.NewCommandID(), 0) == a {
		t.Fatal("different commands gave the same id")
	}
	// The same command id is another command on another aggregate, or
	// in another tenant.
	if pipeline.EventID("acme/acc-2", cmd, 0) == a {
		t.Fatal("the same command id on two aggregates gave the same id")
	}
	if pipeline.EventID("other/acc-1", cmd, 0) == a {
		t.Fatal("the same command id in two tenants gave the same id")
	}
	// Cross-check against an independent implementation.
	ns := uuid.MustParse("6f6e6365-666c-4f77-8065-76656e747321")
	name := append(append([]byte(agg), 0), cmd[:]...)
	name = append(name, 0, 0, 0, 0, 0, 0, 0, 1)
	want := uuid.NewSHA1(ns, name)
	if got := pipeline.EventID(agg, cmd, 1).String(); got != want.String() {
		t.Fatalf("got %s, want %s", got, want)
	}
	if v := a.Version(); v != 5 {
		t.Fatalf("version: got %d, want 5", v)
	}
}

func TestFailureEventIDIsApartFromEventIDs(t *testing.T) {
	t.Parallel()
	cmd := pipeline.MustParseID("01890a5d-ac96-774b-bcce-b302099a8057")
	const agg = "acme/acc-1"
	f := pipeline.FailureEventID(agg, cmd, 3, 42)
	if f != pipeline.FailureEventID(agg, cmd, 3, 42) {
		t.Fatal("the same delivery gave two failure ids")
	}
	for i := range 4 {
		if f == pipeline.EventID(agg, cmd, i) {
			t.Fatalf("failure id equals event %d's id", i)
		}
	}
	if f == pipeline.FailureEventID(agg, cmd, 3, 43) || f == pipeline.FailureEventID(agg, cmd, 4, 42) {
		t.Fatal("two deliveries of a command gave the same failure id")
	}
	if f == pipeline.FailureEventID("acme/acc-2", cmd, 3, 42) {
		t.Fatal("the same command id on two aggregates gave the same failure id")
	}
}

func TestParseID(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		in string
		ok bool
	}{
		{"01890a5d-ac96-774b-bcce-b302099a8057", true},
		{"01890A5D-AC96-774B-BCCE-B302099A8057", true},
		{"01890a5dac96774bbcceb302099a8057", false},
		{"01890a5d-ac96-774b-bcce-b302099a805", false},
		{"01890a5d-ac96-774b-bcce-b302099a805g", false},
		{"01890a5d-ac96-774b-bcce+b302099a8057", false},
		{"00-0000--0000-0000-0000-000000000000", false}, // dashes out of place, found by FuzzParseID
		{"", false},
	} {
		id, err := pipeline.ParseID(tc.in)
		if (err == nil) != tc.ok {
			t.Errorf("ParseID(%q): err = %v, want ok = %v", tc.in, err, tc.ok)
			continue
		}
		if tc.ok {
			if got, want := id.String(), uuid.MustParse(tc.in).String(); got != want {
				t.Errorf("ParseID(%q).String() = %s, want %s", tc.in, got, want)
			}
		}
	}
}

func FuzzParseID(f *testing.F) {
	f.Add("01890a5d-ac96-774b-bcce-b302099a8057")
	f.Add("zz890a5d-ac96-774b-bcce-b302099a8057")
	f.Fuzz(func(t *testing.T, s string) {
		id, err := pipeline.ParseID(s)
		if err != nil {
			return
		}
		if _, uerr := uuid.Parse(s); uerr != nil {
			t.Fatalf("we accept %q, google/uuid rejects it: %v", s, uerr)
		}
		again, err := pipeline.ParseID(id.String())
		if err != nil || again != id {
			t.Fatalf("round trip of %q: got %v, %v", s, again, err)
		}
	})
}

func TestValidateLocalID(t *testing.T) {
	t.Parallel()
	long := string(bytes.Repeat([]byte("a"), pipeline.MaxLocalIDLen))
	for _, tc := range []struct {
		in string
		ok bool
	}{
		{"acc-1", true}, {"A_b.c:d", true}, {long, true},
		{"", false}, {long + "a", false}, {"a/b", false}, {"a b", false}, {"é", false}, {"a\x00", false},
	} {
		if err := pipeline.ValidateLocalID(tc.in); (err == nil) != tc.ok {
			t.Errorf("ValidateLocalID(%q) = %v, want ok = %v", tc.in, err, tc.ok)
		}
	}
}
