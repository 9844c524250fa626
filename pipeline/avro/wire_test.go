package avro_test

import (
	"bytes"
	"errors"
	"math"
	"testing"

	"github.com/twmb/franz-go/pkg/sr"

	"github.com/onceflow/onceflow/pipeline/avro"
)

func TestHeaderRoundTrip(t *testing.T) {
	t.Parallel()
	for _, id := range []int{0, 1, 255, 256, 1 << 24, math.MaxInt32, math.MaxUint32} {
		b := avro.AppendHeader([]byte{}, id)
		b = append(b, 0xAA, 0xBB)
		gotID, payload, err := avro.ParseHeader(b)
		if err != nil {
			t.Fatalf("ParseHeader(AppendHeader(%d)): %v", id, err)
		}
		if gotID != id || !bytes.Equal(payload, []byte{0xAA, 0xBB}) {
			t.Errorf("id %d: got (%d, %x), want (%d, aabb)", id, gotID, payload, id)
		}
		// franz-go's Confluent header agrees byte for byte.
		want, _ := new(sr.ConfluentHeader).AppendEncode(nil, id, nil)
		if got := avro.AppendHeader(nil, id); !bytes.Equal(got, want) {
			t.Errorf("id %d: got header %x, sr.ConfluentHeader writes %x", id, got, want)
		}
	}
}

func TestAppendHeaderAppends(t *testing.T) {
	t.Parallel()
	got := avro.AppendHeader([]byte("key"), 0x01020304)
	if want := []byte{'k', 'e', 'y', 0, 1, 2, 3, 4}; !bytes.Equal(got, want) {
		t.Fatalf("got %x, want %x", got, want)
	}
}

func TestParseHeaderErrors(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		in   []byte
		want string
	}{
		{"nil", nil, "0 bytes is too short"},
		{"four bytes", []byte{0, 0, 0, 1}, "4 bytes is too short"},
		{"bad magic", []byte{1, 0, 0, 0, 1}, "bad magic byte 0x01"},
		{"json", []byte(`{"amount":1}`), "bad magic byte 0x7b"},
	} {
		_, _, err := avro.ParseHeader(tc.in)
		if !errors.Is(err, avro.ErrMalformed) {
			t.Errorf("%s: got error %v, want one wrapping ErrMalformed", tc.name, err)
			continue
		}
		if !bytes.Contains([]byte(err.Error()), []byte(tc.want)) {
			t.Errorf("%s: got %q, want it to say %q", tc.name, err, tc.want)
		}
	}
	id, payload, err := avro.ParseHeader([]byte{0, 0, 0, 0, 7})
	if err != nil || id != 7 || len(payload) != 0 {
		t.Errorf("header alone: got (%d, %x, %v), want (7, empty, nil)", id, payload, err)
	}
}

func FuzzParseHeader(f *testing.F) {
	f.Add([]byte{0, 0, 0, 0, 1, 2})
	f.Add([]byte{1, 0, 0, 0, 1})
	f.Add([]byte{0, 0xff, 0xff, 0xff, 0xff})
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		id, payload, err := avro.ParseHeader(b)
		if err != nil {
			if !errors.Is(err, avro.ErrMalformed) {
				t.Fatalf("error %v does not wrap ErrMalformed", err)
			}
			if len(b) >= avro.HeaderSize && b[0] == 0 {
				t.Fatalf("rejected a well-formed header %x: %v", b, err)
			}
			return
		}
		if again := append(avro.AppendHeader(nil, id), payload...); !bytes.Equal(again, b) {
			t.Fatalf("re-framed %x as %x", b, again)
		}
	})
}
