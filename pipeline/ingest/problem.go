package ingest

import (
	"net/http"
	"time"

	httpproblem "github.com/onceflow/onceflow/pipeline/problem"
)

// Problem is an RFC 9457 problem detail (pipeline/problem, which the
// admin routes answer too).
type Problem = httpproblem.Details

// FieldError names one invalid field of a request (problem.FieldError;
// a type of ingest's own, so its literals stay short).
type FieldError struct {
	Field   string `json:"field"`
	Message string `json:"message"`
}

func problem(status int, slug, title, detail string) *Problem {
	return httpproblem.New(status, slug, title, detail)
}

func writeProblem(w http.ResponseWriter, p *Problem) {
	if p.Status == http.StatusUnauthorized {
		w.Header().Set("WWW-Authenticate", `Bearer realm="onceflow"`)
	}
	httpproblem.Write(w, p)
}

var (
	errUnauthorized = problem(http.StatusUnauthorized, "unauthorized", "Unauthorized",
		"send Authorization: Bearer <api key>")
	errNotFound = problem(http.StatusNotFound, "not-found", "Not found", "")
)

func errUnavailable(detail string) *Problem {
	p := problem(http.StatusServiceUnavailable, "unavailable", "Service unavailable", detail)
	p.RetryAfter = time.Second
	return p
}

var errKeyReused = problem(http.StatusConflict, "idempotency-key-reused", "Idempotency-Key reused",
	"this Idempotency-Key was already used with a different request; use a new key for a new operation")

func errRateLimited(retry time.Duration) *Problem {
	p := problem(http.StatusTooManyRequests, "rate-limited", "Too many requests",
		"this tenant sends more requests than its rate limit; retry after the time in Retry-After")
	p.RetryAfter = retry
	return p
}

func errAuthThrottled(retry time.Duration) *Problem {
	p := problem(http.StatusTooManyRequests, "auth-throttled", "Too many failed authentications",
		"this address sent too many requests with missing, unknown or revoked API keys; retry after the time in Retry-After")
	p.RetryAfter = max(retry, time.Second)
	return p
}

// invalid is a 422 listing the fields at fault.
func invalid(errs ...FieldError) *Problem {
	p := problem(http.StatusUnprocessableEntity, "invalid-request", "Invalid request", "the request has invalid fields")
	for _, e := range errs {
		p.Errors = append(p.Errors, httpproblem.FieldError(e))
	}
	return p
}
