package ingest

import (
	"encoding/json"
	"net/http"
	"strconv"
	"time"
)

// problemBase prefixes every problem type URI.
const problemBase = "https://onceflow.dev/problems/"

// Problem is an RFC 9457 problem detail.
type Problem struct {
	Type   string       `json:"type"`
	Title  string       `json:"title"`
	Status int          `json:"status"`
	Detail string       `json:"detail,omitempty"`
	Errors []FieldError `json:"errors,omitempty"`

	retryAfter time.Duration
}

// FieldError names one invalid field of a request.
type FieldError struct {
	Field   string `json:"field"`
	Message string `json:"message"`
}

func (p *Problem) Error() string { return p.Title + ": " + p.Detail }

func problem(status int, slug, title, detail string) *Problem {
	return &Problem{Type: problemBase + slug, Title: title, Status: status, Detail: detail}
}

func writeProblem(w http.ResponseWriter, p *Problem) {
	if p.retryAfter > 0 {
		w.Header().Set("Retry-After", strconv.Itoa(int((p.retryAfter+time.Second-1)/time.Second)))
	}
	if p.Status == http.StatusUnauthorized {
		w.Header().Set("WWW-Authenticate", `Bearer realm="onceflow"`)
	}
	w.Header().Set("Content-Type", "application/problem+json")
	w.WriteHeader(p.Status)
	json.NewEncoder(w).Encode(p)
}

var (
	errUnauthorized = problem(http.StatusUnauthorized, "unauthorized", "Unauthorized",
		"send Authorization: Bearer <api key>")
	errNotFound = problem(http.StatusNotFound, "not-found", "Not found", "")
)

func errUnavailable(detail string) *Problem {
	p := problem(http.StatusServiceUnavailable, "unavailable", "Service unavailable", detail)
	p.retryAfter = time.Second
	return p
}

var errKeyReused = problem(http.StatusConflict, "idempotency-key-reused", "Idempotency-Key reused",
	"this Idempotency-Key was already used with a different request; use a new key for a new operation")

func errRateLimited(retry time.Duration) *Problem {
	p := problem(http.StatusTooManyRequests, "rate-limited", "Too many requests",
		"this tenant sends more requests than its rate limit; retry after the time in Retry-After")
	p.retryAfter = retry
	return p
}

func errAuthThrottled(retry time.Duration) *Problem {
	p := problem(http.StatusTooManyRequests, "auth-throttled", "Too many failed authentications",
		"this address sent too many requests with missing, unknown or revoked API keys; retry after the time in Retry-After")
	p.retryAfter = max(retry, time.Second)
	return p
}

// invalid is a 422 listing the fields at fault.
func invalid(errs ...FieldError) *Problem {
	p := problem(http.StatusUnprocessableEntity, "invalid-request", "Invalid request", "the request has invalid fields")
	p.Errors = errs
	return p
}
