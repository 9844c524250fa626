package ingest

import (
	"bytes"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"strings"
	"unicode/utf8"

	"github.com/onceflow/onceflow/pipeline"
)

// MaxIdempotencyKeyLen bounds the Idempotency-Key header, in characters
// (Stripe's limit).
const MaxIdempotencyKeyLen = 255

// command is a validated request, ready to be accepted.
type command struct {
	localID string // the aggregate's tenant-local id
	payload pipeline.Message
	// canonical is the normalized request the idempotency hash covers: the
	// route's name, the aggregate's local id and the validated fields
	// re-encoded in a fixed order, so key order, whitespace and number
	// spelling do not change it and any changed value does.
	canonical []byte
	route     *Route
}

// requestHash is what a retry with the same Idempotency-Key must match.
func requestHash(c command) []byte {
	h := sha256.Sum256(c.canonical)
	return h[:]
}

// idempotencyKey returns the request's Idempotency-Key, or a 400.
func idempotencyKey(r *http.Request) (string, *Problem) {
	vals := r.Header.Values("Idempotency-Key")
	if len(vals) == 0 || vals[0] == "" {
		return "", problem(http.StatusBadRequest, "idempotency-key-missing", "Idempotency-Key missing",
			"every POST needs an Idempotency-Key header; use a new random value per operation and resend it on retries")
	}
	if len(vals) > 1 {
		return "", problem(http.StatusBadRequest, "idempotency-key-invalid", "Idempotency-Key invalid",
			"send exactly one Idempotency-Key header")
	}
	key := vals[0]
	if !utf8.ValidString(key) || strings.ContainsFunc(key, func(c rune) bool { return c < 0x20 || c == 0x7f }) {
		return "", problem(http.StatusBadRequest, "idempotency-key-invalid", "Idempotency-Key invalid",
			"the key must be UTF-8 text without control characters")
	}
	if n := utf8.RuneCountInString(key); n > MaxIdempotencyKeyLen {
		return "", problem(http.StatusBadRequest, "idempotency-key-invalid", "Idempotency-Key too long",
			fmt.Sprintf("the key must be at most %d characters; it has %d", MaxIdempotencyKeyLen, n))
	}
	return key, nil
}

// keyedBody reads a POST that writes under an Idempotency-Key: the key,
// then the body, at most maxBytes; the first that is wrong is the 400
// (or 413, 415) the client gets.
func keyedBody(r *http.Request, maxBytes int64) (key string, body []byte, p *Problem) {
	if key, p = idempotencyKey(r); p != nil {
		return "", nil, p
	}
	if body, p = readBody(r, maxBytes); p != nil {
		return "", nil, p
	}
	return key, body, nil
}

// readBody checks the content type and reads the body, at most maxBytes.
// A request without a body (close) may omit the content type.
func readBody(r *http.Request, maxBytes int64) ([]byte, *Problem) {
	tooLarge := problem(http.StatusRequestEntityTooLarge, "body-too-large", "Request body too large",
		fmt.Sprintf("the body must be at most %d bytes", maxBytes))
	if r.ContentLength > maxBytes {
		return nil, tooLarge // refuse before reading a byte of it
	}
	if ct := r.Header.Get("Content-Type"); ct != "" || r.ContentLength > 0 {
		mt, _, err := mime.ParseMediaType(ct)
		if err != nil || (mt != "application/json" && !strings.HasSuffix(mt, "+json")) {
			return nil, problem(http.StatusUnsupportedMediaType, "unsupported-media-type", "Unsupported media type",
				"send Content-Type: application/json")
		}
	}
	body, err := io.ReadAll(http.MaxBytesReader(nil, r.Body, maxBytes))
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return nil, tooLarge
		}
		return nil, problem(http.StatusBadRequest, "bad-request", "Bad request", "could not read the body")
	}
	return body, nil
}

// object is a decoded top-level JSON object: its members, still encoded.
type object map[string]json.RawMessage

// decodeObject decodes body as one JSON object whose member names are all
// in allowed. Unknown and repeated members are field errors (a repeated
// member is ambiguous: parsers disagree on which value wins, so a proxy
// could check one value while we accept the other). An empty body is an
// empty object.
func decodeObject(body []byte, allowed ...string) (object, []FieldError, *Problem) {
	obj := object{}
	if len(bytes.TrimSpace(body)) == 0 {
		return obj, nil, nil
	}
	malformed := func(err error) *Problem {
		msg := strings.TrimPrefix(err.Error(), "json: ")
		var syn *json.SyntaxError
		if errors.As(err, &syn) {
			msg = fmt.Sprintf("%s (at byte %d)", msg, syn.Offset)
		}
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			msg = "unexpected end of the body"
		}
		return invalid(FieldError{Field: "", Message: "malformed JSON: " + msg})
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	tok, err := dec.Token()
	if err != nil {
		return nil, nil, malformed(err)
	}
	if d, ok := tok.(json.Delim); !ok || d != '{' {
		return nil, nil, invalid(FieldError{Field: "", Message: "the body must be a JSON object"})
	}
	var errs []FieldError
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, nil, malformed(err)
		}
		name, _ := tok.(string) // inside an object the decoder only yields string keys
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			return nil, nil, malformed(err)
		}
		switch _, seen := obj[name]; {
		case seen:
			errs = append(errs, FieldError{Field: name, Message: "appears more than once"})
		case !contains(allowed, name):
			errs = append(errs, FieldError{Field: name, Message: "unknown field"})
		}
		obj[name] = raw
	}
	if _, err := dec.Token(); err != nil { // the closing brace
		return nil, nil, malformed(err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, nil, invalid(FieldError{Field: "", Message: "unexpected data after the JSON object"})
	}
	return obj, errs, nil
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

// str returns a string member and whether it is one; absent, null and
// non-string values are field errors.
func (o object) str(field string, errs *[]FieldError) (string, bool) {
	raw, ok := o[field]
	if !ok || string(raw) == "null" {
		*errs = append(*errs, FieldError{field, "is required"})
		return "", false
	}
	var s string
	if raw[0] != '"' || json.Unmarshal(raw, &s) != nil {
		*errs = append(*errs, FieldError{field, "must be a string"})
		return "", false
	}
	return s, true
}

// id returns a string member holding a tenant-local id.
func (o object) id(field string, errs *[]FieldError) string {
	v, ok := o.str(field, errs)
	if ok {
		if err := pipeline.ValidateLocalID(v); err != nil {
			*errs = append(*errs, FieldError{field, err.Error()})
		}
	}
	return v
}

// finish returns c, or the 422 listing errs when there are any.
func finish(errs []FieldError, c command) (command, *Problem) {
	if len(errs) > 0 {
		return command{}, invalid(errs...)
	}
	return c, nil
}
