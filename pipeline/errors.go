package pipeline

import (
	"errors"
	"fmt"
	"time"
)

// Rejection is a decision's refusal of a command for a domain reason
// (overdraft, unknown account, closed account). It is not a failure: the
// processor turns it into a CommandRejected event so the outcome is recorded.
type Rejection struct {
	Reason string // stable, machine-readable: "insufficient_funds", "unknown_account"
	Detail string // human-readable
}

func (r *Rejection) Error() string {
	if r.Detail == "" {
		return "rejected: " + r.Reason
	}
	return "rejected: " + r.Reason + ": " + r.Detail
}

// Reject returns a *Rejection.
func Reject(reason, format string, args ...any) error {
	return &Rejection{Reason: reason, Detail: fmt.Sprintf(format, args...)}
}

// AsRejection returns the rejection in err's chain, if any.
func AsRejection(err error) (*Rejection, bool) {
	var r *Rejection
	ok := errors.As(err, &r)
	return r, ok
}

// permanentError marks an error that retrying cannot fix.
type permanentError struct{ err error }

func (e *permanentError) Error() string { return e.err.Error() }
func (e *permanentError) Unwrap() error { return e.err }

// Permanent marks err as one that retrying cannot fix: a poison command goes
// to the DLQ, a job is dead, a request is answered with a client error.
func Permanent(err error) error {
	if err == nil {
		return nil
	}
	return &permanentError{err}
}

// IsPermanent reports whether err was marked with Permanent.
func IsPermanent(err error) bool {
	var p *permanentError
	return errors.As(err, &p)
}

// RetryAfterError asks the caller to retry no sooner than After.
type RetryAfterError struct {
	After time.Duration
	Err   error
}

func (e *RetryAfterError) Error() string {
	if e.Err == nil {
		return fmt.Sprintf("retry after %s", e.After)
	}
	return fmt.Sprintf("retry after %s: %v", e.After, e.Err)
}

func (e *RetryAfterError) Unwrap() error { return e.Err }

// RetryAfter returns an error asking the caller to retry after d.
func RetryAfter(d time.Duration, err error) error { return &RetryAfterError{After: d, Err: err} }

// AsRetryAfter returns the retry delay requested in err's chain, if any.
func AsRetryAfter(err error) (time.Duration, bool) {
	var r *RetryAfterError
	if errors.As(err, &r) {
		return r.After, true
	}
	return 0, false
}

// ErrDuplicate is returned by a Projection for an event its read model
// already reflects (the stored version is at or above the event's). The
// runtime counts it and moves on.
var ErrDuplicate = errors.New("duplicate event")

// VersionGapError is returned by a Projection for an event that is ahead of
// its read model (stored version + 1 < event version): an earlier event is
// missing. The runtime parks the partition; it never skips the gap.
type VersionGapError struct {
	AggregateID string
	Stored      int64
	Got         int64
}

func (e *VersionGapError) Error() string {
	return fmt.Sprintf("version gap on %s: stored version %d, event version %d", e.AggregateID, e.Stored, e.Got)
}

// CheckVersion classifies an event whose version-guarded update matched no
// row, given the version the read model holds (0 when it has no row): nil
// never, ErrDuplicate when the event is at or below stored, a
// *VersionGapError when it is ahead by more than one.
func CheckVersion(aggregateID string, stored, got int64) error {
	if got <= stored {
		return ErrDuplicate
	}
	return &VersionGapError{AggregateID: aggregateID, Stored: stored, Got: got}
}

// CommandRejected is the event the processor emits, in place of a
// decision's events, when Decide returns a *Rejection. It does not change
// the aggregate: it carries the aggregate's current version, and
// command_status projects it. Every domain's events schema has a
// CommandRejected record with these fields.
type CommandRejected struct {
	CommandType string `avro:"command_type"`
	Reason      string `avro:"reason"`
	Detail      string `avro:"detail"`
}

// MessageType implements Message.
func (CommandRejected) MessageType() string { return "CommandRejected" }

// CommandFailed is the event the processor emits when a command goes to
// the DLQ ({prefix}.commands.dlq) rather than being decided: the record is
// poison (invalid fields, undecodable, a type nobody handles), the decider
// failed, or the broker refused its decision for good. Like CommandRejected
// it does not change the aggregate (it carries the aggregate's current
// version) and command_status projects it, so a command is never pending
// forever; a redrive of the DLQ record that then succeeds emits the
// command's events, which supersede the failure. Reason is the DLQ reason
// (the dlq-reason header). It is emitted only for a record whose key is an
// aggregate id of the tenant its tenant header names and whose command-id
// is valid: anything else belongs to no aggregate. Every domain's events
// schema has a CommandFailed record with these fields.
type CommandFailed struct {
	CommandType string `avro:"command_type"`
	Reason      string `avro:"reason"`
	Detail      string `avro:"detail"`
}

// MessageType implements Message.
func (CommandFailed) MessageType() string { return "CommandFailed" }

// Decoding errors that serdes wrap, so a consumer can name the reason a
// record is poison without knowing the serde.
var (
	// ErrUnknownSchema: the record names a schema id the registry does not have.
	ErrUnknownSchema = errors.New("unknown schema")
	// ErrUndecodable: the bytes are not a valid encoding (bad header,
	// truncated or trailing data, invalid Avro).
	ErrUndecodable = errors.New("undecodable")
	// ErrIncompatible: the writer's schema cannot be read as this reader's
	// types (a type the reader does not know, a field without a default).
	ErrIncompatible = errors.New("writer schema incompatible with reader schema")
)
