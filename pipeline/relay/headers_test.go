package relay

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"

	"github.com/twmb/franz-go/pkg/kgo"
)

// recordHeaders turns the headers column into record headers: values
// unescaped, sorted by key; anything but an object of strings is an error
// naming what is wrong.
func TestRecordHeaders(t *testing.T) {
	got, err := recordHeaders([]byte(`{"tenant": "acme", "command-id": "0193", "x-note": "a \"b\" \\ \u00fc\u2603"}`))
	if err != nil {
		t.Fatal(err)
	}
	want := []kgo.RecordHeader{{Key: "command-id", Value: []byte("0193")}, {Key: "tenant", Value: []byte("acme")},
		{Key: "x-note", Value: []byte(`a "b" \ ü☃`)}}
	if !slices.EqualFunc(got, want, func(a, b kgo.RecordHeader) bool { return a.Key == b.Key && string(a.Value) == string(b.Value) }) {
		t.Errorf("got %q, want %q", got, want)
	}
	// Appending to one value must not overwrite another (they share one
	// allocation).
	for i := range got {
		_ = append(got[i].Value, "XXXX"...)
	}
	for i := range got {
		if string(got[i].Value) != string(want[i].Value) {
			t.Errorf("values overlap: %s is %q after appending to the others", got[i].Key, got[i].Value)
		}
	}
	// Headers as ingest writes them, as Postgres prints them, take the
	// parser-free path.
	if got, ok := canonicalHeaders([]byte(`{"tenant": "acme", "command-id": "0193", "command-type": "Deposit"}`)); !ok ||
		len(got) != 3 || got[0].Key != "command-id" || string(got[0].Value) != "0193" {
		t.Errorf("ingest's headers without a parser: %q, %v", got, ok)
	}
	if got, err := recordHeaders([]byte(`{}`)); err != nil || len(got) != 0 {
		t.Errorf("{}: %v, %v", got, err)
	}
	for raw, wantErr := range map[string]string{
		`{"command-id": 7}`:  `header "command-id" is number`,
		`{"tenant": null}`:   `header "tenant" is null`,
		`{"a": {"b": "c"}}`:  `header "a" is object`,
		`["command-id"]`:     "headers are array",
		`"x"`:                "headers are string",
		`{"command-id": "x"`: "headers are not JSON",
	} {
		if _, err := recordHeaders([]byte(raw)); err == nil || !strings.Contains(err.Error(), wantErr) {
			t.Errorf("%s: error %v, want one containing %q", raw, err, wantErr)
		}
	}
}

// FuzzCanonicalHeaders checks the parser-free path against the JSON
// parser: whatever text canonicalHeaders decodes, the parser decodes to
// the same headers.
func FuzzCanonicalHeaders(f *testing.F) {
	for _, seed := range []string{
		`{}`, `{"a": "b"}`, `{"": ""}`, `{"a": "}"}`, `{"a": ", \"b\": \"c"}`,
		`{"tenant": "acme", "command-id": "0193", "x-note": "ü☃"}`,
		`{"a": "b", "c": 5}`, `{"a": "b"}}`, `{"a": "b" , "c": "d"}`, `{"a": "b", }`, `{"a": "b": "c"}`,
		"{\"a\n\": \"b\"}", `{"a":"b"}`,
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		fast, ok := canonicalHeaders(raw)
		if !ok {
			return
		}
		full, err := parseHeaders(raw)
		if err != nil {
			t.Fatalf("%q: decoded without a parser, but the parser says %v", raw, err)
		}
		if !slices.EqualFunc(fast, full, func(a, b kgo.RecordHeader) bool { return a.Key == b.Key && string(a.Value) == string(b.Value) }) {
			t.Fatalf("%q: decoded as %q without a parser, %q with one", raw, fast, full)
		}
	})
}

// BenchmarkRecordHeaders decodes one outbox row's headers as ingest writes
// them, next to the baseline of encoding/json into a map then sorted
// record headers (what the relay did before).
func BenchmarkRecordHeaders(b *testing.B) {
	raw := []byte(`{"tenant": "acme", "command-id": "01a22b9b-1d4f-7000-951b-c7ee93ba7aab", "traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "command-type": "Deposit"}`)
	b.Run("relay", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := recordHeaders(raw); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("fastjson", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := parseHeaders(raw); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("encoding-json-baseline", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			var m map[string]string
			if err := json.Unmarshal(raw, &m); err != nil {
				b.Fatal(err)
			}
			keys := make([]string, 0, len(m))
			for k := range m {
				keys = append(keys, k)
			}
			slices.Sort(keys)
			out := make([]kgo.RecordHeader, 0, len(keys))
			for _, k := range keys {
				//lint:ignore SA4010 the baseline builds the headers as the relay does; the benchmark measures that, not their use
				out = append(out, kgo.RecordHeader{Key: k, Value: []byte(m[k])})
			}
		}
	})
}
