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

	"github.com/onceflow/onceflow/pipeline"
	"github.com/onceflow/onceflow/pipeline/ledger"
)

// MaxIdempotencyKeyLen bounds the Idempotency-Key header (Stripe's limit).
const MaxIdempotencyKeyLen = 255

// command is a validated request, ready to be accepted.
type command struct {
	localID string // the aggregate's tenant-local id
	payload pipeline.Message
	// canonical is the normalized request the idempotency hash covers:
	// the validated fields re-encoded in a fixed order, so key order,
	// whitespace and number spelling do not change it.
	canonical []byte
}

// decodeBody reads a JSON object into v, rejecting unknown fields, trailing
// data and the wrong content type.
func decodeBody(r *http.Request, maxBytes int64, v any) *Problem {
	if ct := r.Header.Get("Content-Type"); ct != "" || r.ContentLength != 0 {
		mt, _, err := mime.ParseMediaType(ct)
		if err != nil || (mt != "application/json" && !strings.HasSuffix(mt, "+json")) {
			return problem(http.StatusUnsupportedMediaType, "unsupported-media-type", "Unsupported media type",
				"send Content-Type: application/json")
		}
	}
	body, err := io.ReadAll(http.MaxBytesReader(nil, r.Body, maxBytes))
	if err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			return problem(http.StatusRequestEntityTooLarge, "body-too-large", "Request body too large",
				fmt.Sprintf("the body must be at most %d bytes", maxBytes))
		}
		return problem(http.StatusBadRequest, "bad-request", "Bad request", "could not read the body")
	}
	if len(bytes.TrimSpace(body)) == 0 {
		body = []byte("{}")
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	dec.UseNumber()
	if err := dec.Decode(v); err != nil {
		return invalid(jsonFieldError(err))
	}
	if dec.More() {
		return invalid(FieldError{Field: "", Message: "unexpected data after the JSON object"})
	}
	return nil
}

func jsonFieldError(err error) FieldError {
	var typeErr *json.UnmarshalTypeError
	if errors.As(err, &typeErr) {
		return FieldError{Field: typeErr.Field, Message: "must be a " + typeErr.Type.String()}
	}
	msg := err.Error()
	if f, ok := strings.CutPrefix(msg, "json: unknown field "); ok {
		return FieldError{Field: strings.Trim(f, `"`), Message: "unknown field"}
	}
	return FieldError{Field: "", Message: "malformed JSON: " + strings.TrimPrefix(msg, "json: ")}
}

func invalid(errs ...FieldError) *Problem {
	p := problem(http.StatusUnprocessableEntity, "invalid-request", "Invalid request", "the request has invalid fields")
	p.Errors = errs
	return p
}

// amount parses a positive int64 amount in minor units. JSON numbers are
// accepted in any spelling that denotes an integer (100, 1e2, 100.0).
func amount(field string, n json.Number, errs *[]FieldError) int64 {
	if n == "" {
		*errs = append(*errs, FieldError{field, "is required"})
		return 0
	}
	v, err := n.Int64()
	if err != nil {
		f, ferr := n.Float64()
		if ferr != nil || f != float64(int64(f)) || f >= 1<<63 || f < -(1<<63) {
			*errs = append(*errs, FieldError{field, "must be an integer number of minor units that fits in 64 bits"})
			return 0
		}
		v = int64(f)
	}
	if v <= 0 {
		*errs = append(*errs, FieldError{field, "must be greater than zero"})
	}
	return v
}

func localID(field, v string, errs *[]FieldError) {
	if err := pipeline.ValidateLocalID(v); err != nil {
		*errs = append(*errs, FieldError{field, err.Error()})
	}
}

func canonical(route string, fields ...any) []byte {
	b, _ := json.Marshal(append([]any{route}, fields...))
	return b
}

// openAccountRequest is POST /v1/accounts.
type openAccountRequest struct {
	AccountID string `json:"account_id"`
	Currency  string `json:"currency"`
}

func parseOpenAccount(r *http.Request, maxBytes int64) (command, *Problem) {
	var req openAccountRequest
	if p := decodeBody(r, maxBytes, &req); p != nil {
		return command{}, p
	}
	var errs []FieldError
	localID("account_id", req.AccountID, &errs)
	if !ledger.ValidCurrency(req.Currency) {
		errs = append(errs, FieldError{"currency", "must be a three-letter ISO 4217 code in upper case"})
	}
	if len(errs) > 0 {
		return command{}, invalid(errs...)
	}
	return command{
		localID:   req.AccountID,
		payload:   ledger.OpenAccount{Currency: req.Currency},
		canonical: canonical("open_account", req.AccountID, req.Currency),
	}, nil
}

// depositRequest is POST /v1/accounts/{id}/deposits.
type depositRequest struct {
	Amount json.Number `json:"amount"`
}

func parseDeposit(r *http.Request, maxBytes int64) (command, *Problem) {
	var req depositRequest
	if p := decodeBody(r, maxBytes, &req); p != nil {
		return command{}, p
	}
	var errs []FieldError
	id := r.PathValue("id")
	localID("id", id, &errs)
	amt := amount("amount", req.Amount, &errs)
	if len(errs) > 0 {
		return command{}, invalid(errs...)
	}
	return command{
		localID:   id,
		payload:   ledger.Deposit{Amount: amt},
		canonical: canonical("deposit", id, amt),
	}, nil
}

// requestHash is what a retry with the same Idempotency-Key must match.
func requestHash(c command) []byte {
	h := sha256.Sum256(c.canonical)
	return h[:]
}
