// Package problem writes onceflow's HTTP errors as RFC 9457 problem
// details (application/problem+json): the tenants' API (pipeline/ingest)
// and the admin routes that act (pipeline/admin) answer every refusal in
// this one shape, so a client reads one kind of error whatever it called.
package problem

import (
	"encoding/json"
	"net/http"
	"strconv"
	"time"
)

// Base prefixes every problem type URI.
const Base = "https://onceflow.dev/problems/"

// Details is an RFC 9457 problem detail.
type Details struct {
	Type   string       `json:"type"`
	Title  string       `json:"title"`
	Status int          `json:"status"`
	Detail string       `json:"detail,omitempty"`
	Errors []FieldError `json:"errors,omitempty"`

	// RetryAfter, if positive, goes in a Retry-After header (whole
	// seconds, rounded up).
	RetryAfter time.Duration `json:"-"`
}

// FieldError names one invalid field of a request.
type FieldError struct {
	Field   string `json:"field"`
	Message string `json:"message"`
}

func (p *Details) Error() string { return p.Title + ": " + p.Detail }

// New is a problem of type Base+slug.
func New(status int, slug, title, detail string) *Details {
	return &Details{Type: Base + slug, Title: title, Status: status, Detail: detail}
}

// Write answers p.
func Write(w http.ResponseWriter, p *Details) {
	if p.RetryAfter > 0 {
		w.Header().Set("Retry-After", strconv.Itoa(int((p.RetryAfter+time.Second-1)/time.Second)))
	}
	w.Header().Set("Content-Type", "application/problem+json")
	w.WriteHeader(p.Status)
	json.NewEncoder(w).Encode(p)
}
