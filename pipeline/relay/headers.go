package relay

import (
	"bytes"
	"cmp"
	"fmt"
	"slices"
	"strings"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/valyala/fastjson"

	"github.com/onceflow/onceflow/pipeline"
)

// headerParsers decode the outbox's headers when canonicalHeaders cannot.
// (fastjson, not encoding/json: decoding every row's headers into a map by
// reflection was a third of the relay's CPU while it drained a backlog.)
var headerParsers fastjson.ParserPool

// recordHeaders turns an outbox row's headers column, a JSON object of
// strings, into Kafka record headers sorted by key, so a row shipped twice
// carries the same headers in the same order. Anything else is an error:
// the row cannot be shipped as written.
func recordHeaders(raw []byte) ([]kgo.RecordHeader, error) {
	if out, ok := canonicalHeaders(raw); ok {
		return out, nil
	}
	return parseHeaders(raw)
}

// parseHeaders is recordHeaders for any text, with a JSON parser.
func parseHeaders(raw []byte) ([]kgo.RecordHeader, error) {
	p := headerParsers.Get()
	defer headerParsers.Put(p)
	v, err := p.ParseBytes(raw)
	if err != nil {
		return nil, fmt.Errorf("headers are not JSON: %w", err)
	}
	obj, err := v.Object()
	if err != nil {
		return nil, fmt.Errorf("headers are %s, not an object", v.Type())
	}
	out := make([]kgo.RecordHeader, 0, obj.Len())
	// The values, unescaped, are no longer than raw: one allocation holds
	// them all.
	values := make([]byte, 0, len(raw))
	obj.Visit(func(k []byte, v *fastjson.Value) {
		s, serr := v.StringBytes()
		if serr != nil {
			err = cmp.Or(err, fmt.Errorf("header %q is %s, not a string", k, v.Type()))
			return
		}
		at := len(values)
		values = append(values, s...)
		out = append(out, kgo.RecordHeader{Key: headerKey(k), Value: values[at:len(values):len(values)]})
	})
	if err != nil {
		return nil, err
	}
	sortHeaders(out)
	return out, nil
}

// canonicalHeaders decodes, without a JSON parser, the headers of nearly
// every row: Postgres prints a jsonb object as {"k": "v", "k2": "v2"}, and
// when no string in it has an escape, every '"' opens or closes one. It
// reports false for anything else (escapes, values that are not strings,
// text not in that form), which recordHeaders then parses in full. The
// values are copied into one allocation, as parseHeaders does.
func canonicalHeaders(raw []byte) ([]kgo.RecordHeader, bool) {
	if len(raw) < 2 || raw[0] != '{' || raw[len(raw)-1] != '}' || bytes.IndexByte(raw, '\\') >= 0 {
		return nil, false
	}
	if len(raw) == 2 {
		return []kgo.RecordHeader{}, true
	}
	// Without escapes, every pair has four '"'.
	out := make([]kgo.RecordHeader, 0, bytes.Count(raw, []byte{'"'})/4)
	values := make([]byte, 0, len(raw))
	rest := raw[1:]
	for {
		// "key": "value" followed by ", " or the closing brace.
		if len(rest) == 0 || rest[0] != '"' {
			return nil, false
		}
		i := bytes.IndexByte(rest[1:], '"')
		if i < 0 {
			return nil, false
		}
		k := rest[1 : 1+i]
		rest = rest[2+i:]
		if !bytes.HasPrefix(rest, []byte(`: "`)) {
			return nil, false
		}
		rest = rest[3:]
		j := bytes.IndexByte(rest, '"')
		if j < 0 {
			return nil, false
		}
		at := len(values)
		values = append(values, rest[:j]...)
		out = append(out, kgo.RecordHeader{Key: headerKey(k), Value: values[at:len(values):len(values)]})
		rest = rest[j+1:]
		switch {
		case len(rest) == 1: // the closing brace
			sortHeaders(out)
			return out, true
		case bytes.HasPrefix(rest, []byte(", ")):
			rest = rest[2:]
		default:
			return nil, false
		}
	}
}

func sortHeaders(hs []kgo.RecordHeader) {
	slices.SortFunc(hs, func(a, b kgo.RecordHeader) int { return strings.Compare(a.Key, b.Key) })
}

// headerKey returns k as a string, without allocating for the headers
// ingest writes on every row.
func headerKey(k []byte) string {
	switch string(k) {
	case pipeline.HeaderCommandID:
		return pipeline.HeaderCommandID
	case pipeline.HeaderTenant:
		return pipeline.HeaderTenant
	case pipeline.HeaderCommandType:
		return pipeline.HeaderCommandType
	case pipeline.HeaderTraceparent:
		return pipeline.HeaderTraceparent
	}
	return string(k)
}

// headerOf is the value of the header key in hs, or "".
func headerOf(hs []kgo.RecordHeader, key string) string {
	for _, h := range hs {
		if h.Key == key {
			return string(h.Value)
		}
	}
	return ""
}
