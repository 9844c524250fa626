// Package apiclient is a small Go client of onceflow's HTTP API
// (docs/ingest.md): any command route (Post), a command's status and the
// outcome of all it led to (Command, WaitCommand, WaitOutcome), any other
// route (Do). The demo, the end-to-end
// tests and the chaos harness use it; a domain adds its own routes'
// helpers on top (the ledger's are in examples/ledger/ledgerapp).
//
// Post and Do send once. Send sends one Intention until it has a definite
// answer, retrying network errors, timeouts, 5xx and 429 with the same
// Idempotency-Key (after the server's Retry-After, or with backoff and
// full jitter; Retry), and never a 409 or another 4xx: a new operation
// takes a new key (NewKey).
package apiclient

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"
)

// Client calls one ingest endpoint as one tenant.
type Client struct {
	BaseURL string // e.g. http://127.0.0.1:8080
	APIKey  string
	HTTP    *http.Client // nil uses a client with a 10s timeout
}

// Response is a raw answer.
type Response struct {
	Status int
	Header http.Header
	Body   []byte
}

// Replayed reports whether the response is a stored one sent again.
func (r *Response) Replayed() bool { return r.Header.Get("Idempotent-Replayed") == "true" }

// Problem is an RFC 9457 problem body.
type Problem struct {
	Type   string `json:"type"`
	Title  string `json:"title"`
	Status int    `json:"status"`
	Detail string `json:"detail"`
	Errors []struct {
		Field   string `json:"field"`
		Message string `json:"message"`
	} `json:"errors"`
}

// Error is a non-2xx answer.
type Error struct {
	Response *Response
	Problem  Problem
}

func (e *Error) Error() string {
	return fmt.Sprintf("%d %s: %s", e.Response.Status, e.Problem.Title, e.Problem.Detail)
}

// Accepted is the body of a 202.
type Accepted struct {
	CommandID string `json:"command_id"`
	Status    string `json:"status"`
}

// Get reads a query, GET path, and decodes its 200 into v, or returns an
// *Error.
func (c *Client) Get(ctx context.Context, path string, v any) error {
	resp, err := c.Do(ctx, http.MethodGet, path, "", nil)
	if err != nil {
		return err
	}
	return Decode(resp, http.StatusOK, v)
}

// Command is GET /v1/commands/{id}: the command's own status (Status,
// Reason, Detail, EventIDs), the Outcome of the command with every
// command it led to, and those commands (docs/ingest.md#outcome).
type Command struct {
	CommandID   string    `json:"command_id"`
	Status      string    `json:"status"`
	CommandType string    `json:"command_type"`
	AggregateID string    `json:"aggregate_id"`
	Reason      string    `json:"reason"`
	Detail      string    `json:"detail"`
	EventIDs    []string  `json:"event_ids"`
	Outcome     Outcome   `json:"outcome"`
	Derived     []Derived `json:"derived"`
}

// Outcome is the outcome of a command with every command it led to:
// Status is pending, completed, rejected, failed or compensated; a
// rejected, failed or compensated outcome names the refusal that decided
// it (the command's own, or the first command it led to that was
// refused: a transfer's credit its target refused).
type Outcome struct {
	Status      string `json:"status"`
	Reason      string `json:"reason"`
	Detail      string `json:"detail"`
	CommandID   string `json:"command_id"`
	AggregateID string `json:"aggregate_id"`
	CommandType string `json:"command_type"`
}

// Derived is a command another command's decision sent, with its own
// status and that command (its cause).
type Derived struct {
	CommandID        string   `json:"command_id"`
	Status           string   `json:"status"`
	CommandType      string   `json:"command_type"`
	AggregateID      string   `json:"aggregate_id"`
	Reason           string   `json:"reason"`
	Detail           string   `json:"detail"`
	EventIDs         []string `json:"event_ids"`
	CauseCommandID   string   `json:"cause_command_id"`
	CauseAggregateID string   `json:"cause_aggregate_id"`
}

func (c *Client) http() *http.Client {
	if c.HTTP != nil {
		return c.HTTP
	}
	return &http.Client{Timeout: 10 * time.Second}
}

// Do sends a request and returns the raw response (any status).
func (c *Client) Do(ctx context.Context, method, path, idemKey string, body []byte) (*Response, error) {
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, strings.TrimRight(c.BaseURL, "/")+path, rd)
	if err != nil {
		return nil, err
	}
	if c.APIKey != "" {
		req.Header.Set("Authorization", "Bearer "+c.APIKey)
	}
	if idemKey != "" {
		req.Header.Set("Idempotency-Key", idemKey)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.http().Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	return &Response{Status: resp.StatusCode, Header: resp.Header, Body: b}, nil
}

// Post sends a command and decodes the 202, or returns an *Error.
func (c *Client) Post(ctx context.Context, path, idemKey string, body any) (Accepted, *Response, error) {
	b, err := json.Marshal(body)
	if err != nil {
		return Accepted{}, nil, err
	}
	resp, err := c.Do(ctx, http.MethodPost, path, idemKey, b)
	if err != nil {
		return Accepted{}, nil, err
	}
	var a Accepted
	if err := Decode(resp, http.StatusAccepted, &a); err != nil {
		return Accepted{}, resp, err
	}
	return a, resp, nil
}

// Command is GET /v1/commands/{id}.
func (c *Client) Command(ctx context.Context, id string) (Command, error) {
	return c.CommandWait(ctx, id, 0)
}

// CommandWait is GET /v1/commands/{id}?wait=: the server answers as soon
// as the command's outcome is known, or with its pending status after
// wait (at most 30s; keep it below the HTTP client's timeout).
func (c *Client) CommandWait(ctx context.Context, id string, wait time.Duration) (Command, error) {
	return c.commandWait(ctx, id, wait, false)
}

// OutcomeWait is GET /v1/commands/{id}?wait=&for=outcome: the server
// answers as soon as the outcome of the command with every command it led
// to is known, or with it pending after wait (at most 30s).
func (c *Client) OutcomeWait(ctx context.Context, id string, wait time.Duration) (Command, error) {
	return c.commandWait(ctx, id, wait, true)
}

func (c *Client) commandWait(ctx context.Context, id string, wait time.Duration, outcome bool) (Command, error) {
	var cmd Command
	path := "/v1/commands/" + url.PathEscape(id)
	if wait > 0 {
		path += "?wait=" + url.QueryEscape(wait.String())
		if outcome {
			path += "&for=outcome"
		}
	}
	err := c.Get(ctx, path, &cmd)
	return cmd, err
}

// WaitCommand long-polls a command until its outcome is known or ctx
// ends. It asks again after network errors, 5xx, 408, 429 and 404 (a
// command produced straight to Kafka is unknown to the API until its
// outcome is projected), and returns any other refusal at once: 401 (the
// key is wrong or revoked), 400 and the other 4xx never turn into an
// outcome by asking again. When ctx ends first, the error says what the
// last answer was.
func (c *Client) WaitCommand(ctx context.Context, id string) (Command, error) {
	return c.waitCommand(ctx, id, false)
}

// WaitOutcome is WaitCommand until the outcome of the command with every
// command it led to is known (Command.Outcome: completed, rejected,
// failed or compensated): a transfer until its credit, or its refund, is
// applied; an order until its reservation's answer is.
func (c *Client) WaitOutcome(ctx context.Context, id string) (Command, error) {
	return c.waitCommand(ctx, id, true)
}

func (c *Client) waitCommand(ctx context.Context, id string, outcome bool) (Command, error) {
	var last error // the last answer that was not ctx ending
	for {
		cmd, err := c.commandWait(ctx, id, 5*time.Second, outcome)
		status := cmd.Status
		if outcome {
			status = cmd.Outcome.Status
		}
		if err == nil && status != "pending" {
			return cmd, nil
		}
		var e *Error
		if errors.As(err, &e) && e.Response.Status >= 400 && e.Response.Status < 500 &&
			e.Response.Status != http.StatusNotFound && e.Response.Status != http.StatusTooManyRequests &&
			e.Response.Status != http.StatusRequestTimeout {
			return cmd, err
		}
		switch {
		case err == nil && outcome:
			last = fmt.Errorf("command %s: its outcome still pending", id)
		case err == nil:
			last = fmt.Errorf("command %s still %s", id, cmd.Status)
		case ctx.Err() == nil:
			last = err
		}
		select {
		case <-ctx.Done():
			if last == nil {
				last = err
			}
			return cmd, fmt.Errorf("%w: the last answer: %v", ctx.Err(), last)
		default:
		}
		if err != nil { // not a long poll's answer: do not spin
			select {
			case <-ctx.Done():
			case <-time.After(50 * time.Millisecond):
			}
		}
	}
}

// Decode decodes resp's body into v when its status is want, else returns
// an *Error with the problem it carries.
func Decode(resp *Response, want int, v any) error {
	if resp.Status != want {
		e := &Error{Response: resp}
		json.Unmarshal(resp.Body, &e.Problem)
		return e
	}
	if err := json.Unmarshal(resp.Body, v); err != nil {
		return fmt.Errorf("decode %d response: %w", resp.Status, err)
	}
	return nil
}

// IsStatus reports whether err is an *Error with the given status.
func IsStatus(err error, status int) bool {
	var e *Error
	return errors.As(err, &e) && e.Response.Status == status
}
