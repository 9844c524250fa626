package ingest

import (
	"bytes"
	"context"
	"encoding/json"
	"maps"
	"math/big"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/onceflow/onceflow/examples/ledger"
	"github.com/onceflow/onceflow/pipeline"
	"github.com/onceflow/onceflow/pipeline/kafka"
)

// fuzzRoutes are routes of the ledger's commands (examples/ledger) of
// both kinds of id: in the path and in the body.
var fuzzRoutes = func() []*Route {
	routes := []*Route{
		{Pattern: "POST /v1/accounts", Command: ledger.OpenAccount{}, BodyID: "account_id"},
		{Pattern: "POST /v1/accounts/{id}/deposits", Command: ledger.Deposit{}, PathID: "id"},
		{Pattern: "POST /v1/accounts/{id}/withdrawals", Command: ledger.Withdraw{}, PathID: "id"},
		{Pattern: "POST /v1/accounts/{id}/close", Command: ledger.CloseAccount{}, PathID: "id"},
		{Pattern: "POST /v1/transfers", Command: ledger.RequestTransfer{}, BodyID: "from",
			Check: func(from string, cmd pipeline.Message) []pipeline.FieldError {
				if cmd.(ledger.RequestTransfer).To == from {
					return []pipeline.FieldError{{Field: "to", Message: "must differ from from"}}
				}
				return nil
			}},
	}
	for _, r := range routes {
		r.Topic, r.Encoder = "ledger.commands", nopEncoder{}
		if err := r.prepare(); err != nil {
			panic(err)
		}
	}
	return routes
}()

type nopEncoder struct{}

func (nopEncoder) Encode(context.Context, any) ([]byte, error) { return nil, nil }

// FuzzParse feeds arbitrary bodies and path ids to every route's parser.
// None may panic; whatever one accepts must be valid (ids, amounts,
// currency), and its normalized form must not depend on how the body was
// spelled: the same members re-encoded with other whitespace, key order
// and number spelling give the same request hash and command.
func FuzzParse(f *testing.F) {
	for _, seed := range []string{
		`{"account_id":"acc-1","currency":"EUR"}`,
		`{"amount":100}`, `{"amount":1e2}`, `{"amount":100.00}`, `{"amount":"1"}`, `{"amount":-0}`,
		`{"transfer_id":"t","from":"a","to":"b","amount":9223372036854775807}`,
		`{}`, ``, `[]`, `{"a":1,"a":2}`, `{"amount":1}{}`, "{\"amount\":1\u2028}",
	} {
		for i := range fuzzRoutes {
			f.Add(uint8(i), "acc-1", []byte(seed))
		}
	}
	f.Fuzz(func(t *testing.T, which uint8, id string, body []byte) {
		route := fuzzRoutes[int(which)%len(fuzzRoutes)]
		parse := func(r *http.Request, body []byte) (command, *Problem) {
			return route.parse(r, body, pipeline.DefaultMaxStringBytes)
		}
		r := &http.Request{}
		r.SetPathValue("id", id)
		cmd, p := parse(r, body)
		if p != nil {
			if p.Status != http.StatusUnprocessableEntity {
				t.Fatalf("parser answered %d; parsers only refuse with 422", p.Status)
			}
			return
		}
		checkCommand(t, cmd)

		// Re-spell the accepted body: members in reverse order, other
		// whitespace, integers in exponent form.
		var obj map[string]json.RawMessage
		if len(bytes.TrimSpace(body)) > 0 {
			if err := json.Unmarshal(body, &obj); err != nil {
				t.Fatalf("accepted a body encoding/json rejects: %v", err)
			}
		}
		var b bytes.Buffer
		b.WriteString("{\n")
		names := make([]string, 0, len(obj))
		for k := range obj {
			names = append(names, k)
		}
		for i := len(names) - 1; i >= 0; i-- {
			v := obj[names[i]]
			if n, err := exactInt64(string(v)); err == nil && len(v) > 0 && v[0] != '"' {
				v = json.RawMessage(respellInt(n))
			}
			k, _ := json.Marshal(names[i])
			b.Write(k)
			b.WriteString(" :\t")
			b.Write(v)
			if i > 0 {
				b.WriteString(" ,\r\n")
			}
		}
		b.WriteString("\n}")
		again, p := parse(r, b.Bytes())
		if p != nil {
			t.Fatalf("re-spelled body %q refused: %v", b.Bytes(), p.Errors)
		}
		if !bytes.Equal(requestHash(again), requestHash(cmd)) || again.payload != cmd.payload || again.localID != cmd.localID {
			t.Fatalf("re-spelling %q as %q changed the request: %s vs %s", body, b.Bytes(), cmd.canonical, again.canonical)
		}
	})
}

// respellInt writes n as digits times a power of ten with a fraction
// (1500 -> 15.00e2).
func respellInt(n int64) string {
	s := big.NewInt(n).String()
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	exp := 0
	for len(s) > 1 && strings.HasSuffix(s, "0") {
		s = s[:len(s)-1]
		exp++
	}
	out := s + ".00e" + big.NewInt(int64(exp)).String()
	if neg {
		out = "-" + out
	}
	return out
}

var currencyRe = regexp.MustCompile(`^[A-Z]{3}$`)

func checkCommand(t *testing.T, c command) {
	t.Helper()
	if err := pipeline.ValidateLocalID(c.localID); err != nil {
		t.Fatalf("accepted aggregate id %q: %v", c.localID, err)
	}
	switch m := c.payload.(type) {
	case ledger.OpenAccount:
		if !currencyRe.MatchString(m.Currency) {
			t.Fatalf("accepted currency %q", m.Currency)
		}
	case ledger.Deposit:
		positive(t, m.Amount)
	case ledger.Withdraw:
		positive(t, m.Amount)
	case ledger.RequestTransfer:
		positive(t, m.Amount)
		if pipeline.ValidateLocalID(m.TransferID) != nil || pipeline.ValidateLocalID(m.To) != nil || m.To == c.localID {
			t.Fatalf("accepted transfer %+v from %q", m, c.localID)
		}
	case ledger.CloseAccount:
	default:
		t.Fatalf("unexpected payload %T", m)
	}
}

func positive(t *testing.T, v int64) {
	t.Helper()
	if v <= 0 {
		t.Fatalf("accepted amount %d", v)
	}
}

// FuzzExactInt64 checks the number reader against math/big on every JSON
// number whose exponent is small enough for big.Rat to handle.
func FuzzExactInt64(f *testing.F) {
	for _, s := range []string{"0", "-0", "1", "100", "1e2", "1E+2", "100.0", "1.5", "1e-1", "10e-1", "0.000e5",
		"9223372036854775807", "9223372036854775808", "-9223372036854775808", "-9223372036854775809",
		"92233720368547758070e-1", "1e18", "1e19", "0.1e20", "12345678901234567.0", "1e999999999999999999999"} {
		f.Add(s)
	}
	numRe := regexp.MustCompile(`^-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?([0-9]+))?$`)
	f.Fuzz(func(t *testing.T, s string) {
		got, err := exactInt64(s)
		m := numRe.FindStringSubmatch(s)
		if m == nil {
			return // not a JSON number: the JSON decoder never passes one
		}
		if len(m[4]) > 4 {
			return // an exponent big.Rat would take forever on; handled by the digit logic
		}
		r, ok := new(big.Rat).SetString(s)
		if !ok {
			t.Fatalf("big.Rat cannot read %q", s)
		}
		switch {
		case !r.IsInt():
			if err != errNotInteger {
				t.Fatalf("%q is not an integer: got %d, %v", s, got, err)
			}
		case !r.Num().IsInt64():
			if err != errTooLarge {
				t.Fatalf("%q does not fit: got %d, %v", s, got, err)
			}
		default:
			if err != nil || got != r.Num().Int64() {
				t.Fatalf("%q: got %d, %v; want %s", s, got, err, r.Num())
			}
		}
	})
}

// FuzzHeadersJSON checks the outbox's headers column, written out by hand,
// against encoding/json: whatever the tenant, command type and traceparent
// (as UTF-8 strings, which is all Postgres takes), it is a JSON object
// whose members are exactly the command record's headers.
func FuzzHeadersJSON(f *testing.F) {
	for _, s := range [][3]string{
		{"acme", "Deposit", ""},
		{"acme", "Deposit", "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"},
		{`a"b\c`, "tab\there\nnew\x00\x1f\x7f", "é ✓ \u2028 <&>"},
	} {
		f.Add(s[0], s[1], s[2])
	}
	f.Fuzz(func(t *testing.T, tenant, commandType, traceparent string) {
		if !utf8.ValidString(tenant) || !utf8.ValidString(commandType) || !utf8.ValidString(traceparent) {
			return
		}
		headers := kafka.CommandHeaders(pipeline.NewCommandID(), tenant, commandType, traceparent)
		var got map[string]string
		if err := json.Unmarshal([]byte(headersJSON(headers)), &got); err != nil {
			t.Fatalf("headersJSON(%q) = %s: %v", headers, headersJSON(headers), err)
		}
		want := map[string]string{}
		for _, h := range headers {
			want[h.Key] = string(h.Value)
		}
		if !maps.Equal(got, want) {
			t.Fatalf("headersJSON: got %q, want %q", got, want)
		}
	})
}

// The 202's body and its stored headers, written out by hand, read as the
// JSON they stand for.
func TestAcceptedResponse(t *testing.T) {
	id := pipeline.NewCommandID()
	resp, headers := acceptedResponse(id)
	var body struct {
		CommandID string `json:"command_id"`
		Status    string `json:"status"`
	}
	if err := json.Unmarshal(resp.Body, &body); err != nil || body.CommandID != id.String() || body.Status != "pending" {
		t.Fatalf("body %s: got %+v (%v), want command_id %s, status pending", resp.Body, body, err, id)
	}
	var stored map[string]string
	if err := json.Unmarshal([]byte(headers), &stored); err != nil || !maps.Equal(stored, resp.Headers) {
		t.Fatalf("stored headers %s: got %v (%v), want %v", headers, stored, err, resp.Headers)
	}
	if want := "/v1/commands/" + id.String(); resp.Headers["Location"] != want || resp.Status != http.StatusAccepted {
		t.Fatalf("got %d, Location %q; want 202, %q", resp.Status, resp.Headers["Location"], want)
	}
}
