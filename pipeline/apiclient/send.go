package apiclient

import (
	"context"
	crand "crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/onceflow/onceflow/pipeline"
)

// Retry is how Send retries one intention. Zero values mean the defaults.
type Retry struct {
	// Deadline bounds the whole of Send: every attempt, every wait between
	// them and the wait for the outcome. Default 30s.
	Deadline time.Duration
	// Attempt bounds one attempt (an attempt that times out may still
	// have been accepted: the next one, with the same key, finds out).
	// Default 10s.
	Attempt time.Duration
	// BaseDelay and MaxDelay bound the wait before each retry: a random
	// duration up to BaseDelay × 2^retry, at most MaxDelay ("full
	// jitter"), unless the server said how long (Retry-After). Defaults
	// 50ms and 5s.
	BaseDelay, MaxDelay time.Duration
	// MaxAttempts, if positive, bounds the attempts; else the deadline
	// alone does.
	MaxAttempts int
}

func (r Retry) withDefaults() Retry {
	if r.Deadline == 0 {
		r.Deadline = 30 * time.Second
	}
	if r.Attempt == 0 {
		r.Attempt = 10 * time.Second
	}
	if r.BaseDelay == 0 {
		r.BaseDelay = 50 * time.Millisecond
	}
	if r.MaxDelay == 0 {
		r.MaxDelay = 5 * time.Second
	}
	return r
}

// Intention is one operation a caller wants done once: a command route,
// its body, and the Idempotency-Key that names the operation on every
// attempt. Make one per operation, never one per attempt; keep Key with
// the operation (in the caller's own database) if a crash of the caller
// must not repeat it.
type Intention struct {
	Path string
	Body any
	// Key is the Idempotency-Key; NewKey makes one.
	Key string
	// Wait, if set, makes Send wait for the command's outcome too.
	Wait bool
}

// NewKey returns a new random Idempotency-Key for one intention.
func NewKey() string {
	var b [16]byte
	if _, err := crand.Read(b[:]); err != nil {
		panic(fmt.Sprintf("apiclient: read random bytes: %v", err)) // crypto/rand never fails on Linux
	}
	return hex.EncodeToString(b[:])
}

// Sent is what Send got.
type Sent struct {
	Accepted Accepted
	// Response is the last answer (the 202, replayed or not).
	Response *Response
	// Attempts is how many requests Send made.
	Attempts int
	// Outcome is the command's outcome, with Intention.Wait.
	Outcome *Command
}

// ErrDeadline is Send's error when its deadline passed before a definite
// answer; the last attempt's error is wrapped too. The operation may have
// been accepted: Send again with the same Key to find out.
var ErrDeadline = errors.New("apiclient: no definite answer before the deadline")

// Send sends the intention until it gets a definite answer, always with
// its Key: a 2xx, or a 4xx other than 429 (a 409 says the key was used for
// another request: a bug of the caller, never retried). Network errors,
// timeouts, 5xx and 429 are retried, after the server's Retry-After when
// it sends one (seconds or an HTTP date), else after a random wait that
// grows exponentially (full jitter), within policy's deadline. A retry
// that reaches a server which already accepted the first attempt gets the
// stored answer, byte for byte (Idempotent-Replayed: true), so every
// attempt names the same command. With Wait, Send then long-polls the
// command's outcome within the same deadline. docs/ingest.md#who-retries-what
// says what the other layers retry.
func (c *Client) Send(ctx context.Context, in Intention, policy Retry) (Sent, error) {
	if in.Key == "" {
		return Sent{}, errors.New("apiclient: an intention needs its Idempotency-Key (NewKey)")
	}
	policy = policy.withDefaults()
	body, err := json.Marshal(in.Body)
	if err != nil {
		return Sent{}, err
	}
	ctx, cancel := context.WithTimeout(ctx, policy.Deadline)
	defer cancel()
	var out Sent
	var last error
	for attempt := 0; policy.MaxAttempts <= 0 || attempt < policy.MaxAttempts; attempt++ {
		if attempt > 0 {
			wait := backoff(policy, attempt)
			if ra, ok := retryAfter(out.Response); ok {
				wait = ra
			}
			select {
			case <-ctx.Done():
				return out, fmt.Errorf("%w (last: %v)", ErrDeadline, last)
			case <-time.After(wait):
			}
		}
		out.Attempts++
		actx, cancelAttempt := context.WithTimeout(ctx, policy.Attempt)
		resp, err := c.Do(actx, http.MethodPost, in.Path, in.Key, body)
		cancelAttempt()
		out.Response = resp
		switch {
		case err != nil:
			last = err
			if ctx.Err() != nil {
				return out, fmt.Errorf("%w (last: %v)", ErrDeadline, last)
			}
			continue // the request may or may not have been accepted: the same key finds out
		case resp.Status == http.StatusTooManyRequests || resp.Status >= 500:
			last = fmt.Errorf("%d %s", resp.Status, http.StatusText(resp.Status))
			continue
		}
		if err := Decode(resp, http.StatusAccepted, &out.Accepted); err != nil {
			return out, err // a definite refusal: 400, 401, 404, 409, 413, 415, 422
		}
		if in.Wait {
			cmd, err := c.WaitCommand(ctx, out.Accepted.CommandID)
			if err != nil {
				return out, fmt.Errorf("%w: accepted as %s, outcome not known yet: %v", ErrDeadline, out.Accepted.CommandID, err)
			}
			out.Outcome = &cmd
		}
		return out, nil
	}
	return out, fmt.Errorf("apiclient: %d attempts without a definite answer (last: %v)", out.Attempts, last)
}

// backoff is the wait before retry number attempt (pipeline.Backoff).
func backoff(p Retry, attempt int) time.Duration {
	return pipeline.Backoff(p.BaseDelay, p.MaxDelay, attempt)
}

// retryAfter reads a response's Retry-After: whole seconds or an HTTP
// date.
func retryAfter(resp *Response) (time.Duration, bool) {
	if resp == nil {
		return 0, false
	}
	return pipeline.ParseRetryAfter(resp.Header.Get("Retry-After"), time.Now())
}
