package jobs

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"go.opentelemetry.io/otel/propagation"

	"github.com/onceflow/onceflow/pipeline"
	"github.com/onceflow/onceflow/pipeline/tracing"
)

// IdempotencyKeyHeader carries a job's key on every call it makes.
const IdempotencyKeyHeader = "Idempotency-Key"

// CallError is a call that did not succeed: the answer's status (0 when
// there was none: a network error, a timeout) and the start of its body.
type CallError struct {
	Status int
	Body   string
	Err    error // the transport's error when Status is 0
}

// Error is made printable (pipeline.Printable): a transport's error can
// quote what the receiver sent, and it ends up in river_job.errors, the
// attempt's note and logs.
func (e *CallError) Error() string {
	if e.Status == 0 {
		return pipeline.Printable(fmt.Sprintf("no answer: %v", e.Err))
	}
	if e.Body == "" {
		return fmt.Sprintf("%d %s", e.Status, http.StatusText(e.Status))
	}
	return fmt.Sprintf("%d %s: %s", e.Status, http.StatusText(e.Status), e.Body)
}

func (e *CallError) Unwrap() error { return e.Err }

// AsCallError returns the CallError in err's chain.
func AsCallError(err error) (*CallError, bool) {
	var c *CallError
	ok := errors.As(err, &c)
	return c, ok
}

// maxErrorBody is how much of a refusal's body a CallError keeps (it ends
// up in river_job.errors and the delivery log).
const maxErrorBody = 256

// Call makes one attempt of a job's outbound call: req, sent by client
// with Idempotency-Key: key, so that the receiver applies the call once
// however many attempts (or late attempts of a fenced job) reach it. The
// answer is classified for the job's retries:
//
//   - 2xx: nil, with the response (its body is the caller's to close).
//   - 429 and 503: retried after the answer's Retry-After (seconds or an
//     HTTP date; pipeline.RetryAfter), else after the backoff.
//   - 408, 425 and other 5xx, and no answer at all (network error,
//     timeout): retried after the backoff — the call may have been applied,
//     and the same key finds out.
//   - any other 4xx (and 3xx: redirects are not followed): permanent
//     (pipeline.Permanent), the job ends at once.
//
// The request carries the job's trace (ctx's, from the job's metadata) as
// its traceparent; a client instrumented by otelhttp replaces it with its
// own span's, a child of it.
//
// Every failure is a *CallError wrapped as above.
func Call(ctx context.Context, client *http.Client, req *http.Request, key string) (*http.Response, error) {
	req = req.WithContext(ctx)
	req.Header.Set(IdempotencyKeyHeader, key)
	tracing.Propagator.Inject(ctx, propagation.HeaderCarrier(req.Header))
	resp, err := client.Do(req) // #nosec G704 -- the URL is a subscriber's by design; webhooks.Guard checks the address dialled
	if err != nil {
		return nil, &CallError{Err: err}
	}
	if resp.StatusCode >= 200 && resp.StatusCode < 300 {
		return resp, nil
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, maxErrorBody))
	io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<20)) // let the connection be reused
	cerr := &CallError{Status: resp.StatusCode, Body: printable(b)}
	return resp, Classify(cerr, resp.Header.Get("Retry-After"), time.Now())
}

// Classify wraps a failed call's error for the job's retries by its
// status, as Call documents; retryAfter is the answer's Retry-After.
func Classify(err *CallError, retryAfter string, now time.Time) error {
	switch s := err.Status; {
	case s == 0:
		return err
	case s == http.StatusTooManyRequests || s == http.StatusServiceUnavailable:
		if d, ok := pipeline.ParseRetryAfter(retryAfter, now); ok {
			return pipeline.RetryAfter(d, err)
		}
		return err
	case s == http.StatusRequestTimeout || s == http.StatusTooEarly || s >= 500:
		return err
	default:
		return pipeline.Permanent(err)
	}
}

// printable keeps a body's first line for an error message, without the
// control characters a receiver may send (pipeline.Printable).
func printable(b []byte) string {
	s := string(b)
	if i := strings.IndexAny(s, "\r\n"); i >= 0 {
		s = s[:i]
	}
	return strings.TrimSpace(pipeline.Printable(s))
}
