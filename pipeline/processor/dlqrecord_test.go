package processor

import (
	"bytes"
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
		_, err := got.Redrive("ledger.commands")
		if (err != nil) != (tc.wantOmitted != "") {
			t.Errorf("%s: Redrive error %v, want one only when something was omitted", tc.name, err)
		}
		if tc.wantOmitted == "" && (!bytes.Equal(got.Value, tc.value) || !bytes.Equal(got.Key, tc.key) || len(got.Headers) != len(tc.headers)) {
			t.Errorf("%s: the copy is not the record as it came", tc.name)
		}
	}
}
