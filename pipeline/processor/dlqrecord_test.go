package processor

import (
	"bytes"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/onceflow/onceflow/pipeline"
)

// A poison's DLQ copy always fits the limit: what does not fit is left
// out, value first, then the command's headers, then the key, and
// dlq-omitted says which.
func TestDeadLetterRecordFitsTheLimit(t *testing.T) {
	big := func(n int) []byte { return bytes.Repeat([]byte("x"), n) }
	hdrs := func(n int) []kgo.RecordHeader {
		return []kgo.RecordHeader{{Key: pipeline.HeaderCommandID, Value: []byte("42")}, {Key: "junk", Value: big(n)}}
	}
	const limit = 4096
	for _, tc := range []struct {
		name        string
		key, value  []byte
		headers     []kgo.RecordHeader
		wantOmitted string
	}{
		{"small", []byte("acme/acc-1"), big(100), hdrs(10), ""},
		{"large value", []byte("acme/acc-1"), big(limit), hdrs(10), "value"},
		{"large headers", []byte("acme/acc-1"), big(100), hdrs(limit), "value,headers"},
		{"large key", big(limit), big(100), hdrs(10), "value,headers,key"},
	} {
		r := &kgo.Record{Topic: "ledger.commands", Partition: 3, Offset: 77, Key: tc.key, Value: tc.value, Headers: tc.headers}
		d := deadLetterRecord("ledger.commands.dlq", r, ReasonTooLarge, strings.Repeat("d", maxDetailBytes), time.Now(), limit)
		size := len(d.Key) + len(d.Value) + headersSize(d.Headers)
		got := DeadLetterOf(d)
		if size > limit || strings.Join(got.Omitted, ",") != tc.wantOmitted {
			t.Errorf("%s: DLQ record of %d bytes omitting %v; want at most %d omitting %q", tc.name, size, got.Omitted, limit, tc.wantOmitted)
		}
		if got.SourcePartition != 3 || got.SourceOffset != 77 || got.Reason != ReasonTooLarge {
			t.Errorf("%s: source %d@%d reason %s; want 3@77 %s", tc.name, got.SourcePartition, got.SourceOffset, got.Reason, ReasonTooLarge)
		}
		_, err := got.Redrive("ledger.commands", time.Now())
		if (err != nil) != (tc.wantOmitted != "") {
			t.Errorf("%s: Redrive error %v, want one only when something was omitted", tc.name, err)
		}
		if tc.wantOmitted == "" && (!bytes.Equal(got.Value, tc.value) || !bytes.Equal(got.Key, tc.key) || len(got.Headers) != len(tc.headers)) {
			t.Errorf("%s: the copy is not the record as it came", tc.name)
		}
	}
}

// A redrive keeps a dead letter's time unless it is more than
// RedriveRedateAge old: then the record is dated when it is redriven, so
// the processor's MaxCommandAge (at least twice that) takes it.
func TestRedriveDatesOldDeadLettersAnew(t *testing.T) {
	now := time.Now()
	for _, tc := range []struct {
		name    string
		at      time.Time
		redated bool
	}{
		{"an hour old", now.Add(-time.Hour), false},
		{"a day and a minute old", now.Add(-RedriveRedateAge - time.Minute), true},
		{"twenty days old, within the DLQ's retention", now.Add(-20 * 24 * time.Hour), true},
		{"before year 0", time.Date(-1, 1, 1, 0, 0, 0, 0, time.UTC), true},
	} {
		r := &kgo.Record{Topic: "ledger.commands", Key: []byte("acme/acc-1"), Value: []byte("v"), Timestamp: tc.at}
		d := DeadLetterOf(deadLetterRecord("ledger.commands.dlq", r, ReasonPastTimestamp, "old", tc.at, 1<<20))
		rec, err := d.Redrive("ledger.commands", now)
		if err != nil {
			t.Fatal(err)
		}
		want := tc.at
		if tc.redated {
			want = now
		}
		if !rec.Timestamp.Equal(want) {
			t.Errorf("%s: redriven dated %s, want %s", tc.name, rec.Timestamp, want)
		}
	}
	if MinMaxCommandAge < 2*RedriveRedateAge || DefaultMaxCommandAge < MinMaxCommandAge {
		t.Errorf("MinMaxCommandAge %s, DefaultMaxCommandAge %s: want both at least twice RedriveRedateAge (%s)", MinMaxCommandAge, DefaultMaxCommandAge, RedriveRedateAge)
	}
}

// The commands topic's retention and a day bounds a command's age, never
// below MinMaxCommandAge; a topic that keeps records forever bounds
// nothing but the epoch.
func TestCommandAge(t *testing.T) {
	day := 24 * time.Hour
	for ms, want := range map[int64]time.Duration{
		(7 * day).Milliseconds():  8 * day,
		(30 * day).Milliseconds(): 31 * day,
		time.Hour.Milliseconds():  MinMaxCommandAge,
		-1:                        math.MaxInt64,
		math.MaxInt64:             math.MaxInt64,
	} {
		if got := commandAge(ms); got != want {
			t.Errorf("commandAge(%d ms) = %s, want %s", ms, got, want)
		}
	}
}
