package pipeline

import (
	"errors"
	"fmt"
	"strings"
	"time"
)

// Kafka header names (docs/architecture.md#topics-keys-and-headers). Commands
// carry command-id, tenant and command-type, and accepted-by when the pipeline
// accepted them; events carry event-id, event-type, command-id (causation),
// aggregate-version and tenant, and one derived-command for each command
// their decision sent; DLQ records add the dlq-* headers.
const (
	HeaderCommandID          = "command-id"
	HeaderTenant             = "tenant"
	HeaderCommandType        = "command-type"
	HeaderEventID            = "event-id"
	HeaderEventType          = "event-type"
	HeaderAggregateVersion   = "aggregate-version"
	HeaderTraceparent        = "traceparent"
	HeaderDerivedCommand     = "derived-command"
	HeaderDLQReason          = "dlq-reason"
	HeaderDLQSourceTopic     = "dlq-source-topic"
	HeaderDLQSourcePartition = "dlq-source-partition"
	HeaderDLQSourceOffset    = "dlq-source-offset"
	// HeaderAcceptedBy marks a command the pipeline itself accepted
	// before it reached the commands topic: "relay" on an outbox row
	// ingest accepted, "processor" on a command a decision sent. Its
	// record time is when it was accepted, however long the pipeline then
	// took to ship and decide it, so the processor holds it to the Unix
	// epoch only and not to the age bound a producer's record meets.
	// Anyone who may write the commands topic can set it too: what that
	// buys is an old date, never one before 1970 (docs/security.md).
	HeaderAcceptedBy = "accepted-by"
)

// The values of the accepted-by header (HeaderAcceptedBy).
const (
	AcceptedByRelay     = "relay"
	AcceptedByProcessor = "processor"
)

// Message is a typed command or event payload. Its type name is the
// command-type or event-type header and the Avro record name.
type Message interface {
	MessageType() string
}

// Command is one command as a decider sees it: its identity from the
// headers, its aggregate from the record key, its time from the record
// timestamp (decisions never read the clock), and its decoded payload.
type Command struct {
	ID          ID
	Tenant      string
	AggregateID string
	Time        time.Time
	Traceparent string
	Payload     Message
}

// Type returns the command type (the command-type header).
func (c Command) Type() string { return c.Payload.MessageType() }

// Event is one event: its deterministic id, the command that caused it, the
// aggregate version it produced (1 for the first event of an aggregate), and
// its decoded payload.
type Event struct {
	ID        ID
	CommandID ID
	// CommandType is the type of the command whose decision the event is
	// part of (the command-type header); empty in events written before
	// the processor recorded it.
	CommandType string
	Tenant      string
	AggregateID string
	Version     int64
	Time        time.Time
	Traceparent string
	// Derived are the commands the decision the event is part of sent to
	// other aggregates (Decision.Commands), each in a derived-command
	// header of every event of the decision: what a reader needs to follow
	// a command to the commands it led to (a transfer's credit, a refund)
	// and to know which of them it still waits for.
	Derived []CommandRef
	Payload Message
}

// CommandRef names a command: its id within its aggregate, and its type.
type CommandRef struct {
	ID          ID
	AggregateID string
	Type        string
}

// String is the value of a derived-command header: the command id, its
// type and its aggregate id, separated by spaces (an id and a type have
// none; the aggregate id is the rest).
func (r CommandRef) String() string { return r.ID.String() + " " + r.Type + " " + r.AggregateID }

// ParseCommandRef reads a derived-command header's value (CommandRef.String).
func ParseCommandRef(s string) (CommandRef, error) {
	id, rest, ok1 := strings.Cut(s, " ")
	typ, agg, ok2 := strings.Cut(rest, " ")
	if !ok1 || !ok2 || typ == "" {
		return CommandRef{}, fmt.Errorf("%q: want command-id, command type and aggregate id separated by spaces", s)
	}
	parsed, err := ParseID(id)
	if err != nil {
		return CommandRef{}, fmt.Errorf("%q: %w", s, err)
	}
	if _, _, err := SplitAggregateID(agg); err != nil {
		return CommandRef{}, fmt.Errorf("%q: %w", s, err)
	}
	return CommandRef{ID: parsed, AggregateID: agg, Type: typ}, nil
}

// Type returns the event type (the event-type header).
func (e Event) Type() string { return e.Payload.MessageType() }

// MaxLocalIDLen bounds the local part of an aggregate id.
const MaxLocalIDLen = 128

// AggregateID joins a tenant and a tenant-local id into the aggregate id
// used as the Kafka record key: "tenant/local-id".
func AggregateID(tenant, localID string) string { return tenant + "/" + localID }

// SplitAggregateID splits "tenant/local-id" into its parts.
func SplitAggregateID(aggregateID string) (tenant, localID string, err error) {
	tenant, localID, ok := strings.Cut(aggregateID, "/")
	if !ok || tenant == "" || localID == "" {
		return "", "", fmt.Errorf("aggregate id %q: want tenant/local-id", aggregateID)
	}
	return tenant, localID, nil
}

// ErrInvalidLocalID is returned by ValidateLocalID.
var ErrInvalidLocalID = errors.New("must be 1 to 128 characters of letters, digits, '-', '_', '.' or ':'")

// ValidateLocalID checks a tenant-local id (an account id, a transfer id):
// it becomes part of a Kafka key, a URL path and a database key, so it is
// kept to a small, unambiguous alphabet.
func ValidateLocalID(s string) error {
	if len(s) == 0 || len(s) > MaxLocalIDLen {
		return ErrInvalidLocalID
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9',
			c == '-', c == '_', c == '.', c == ':':
		default:
			return ErrInvalidLocalID
		}
	}
	return nil
}

// DefaultOutboxShards is the number of outbox shards when
// ONCEFLOW_OUTBOX_SHARDS is not set. Ingest (which computes a row's shard)
// and the relay (which leases shards) must use the same count: a relay
// refuses to start against an outbox leased with another count.
const DefaultOutboxShards = 16

// MaxOutboxShards is the most outbox shards there may be: the relay runs a
// transactional producer for each shard it leases.
const MaxOutboxShards = 4096

// CheckOutboxShards says whether n is an outbox shard count: the one
// bound ingest, the relay, reconcile and ONCEFLOW_OUTBOX_SHARDS check, so
// that a count one of them takes the others take too.
func CheckOutboxShards(n int) error {
	if n < 1 || n > MaxOutboxShards {
		return fmt.Errorf("the outbox's shard count (ONCEFLOW_OUTBOX_SHARDS) must be between 1 and %d, got %d", MaxOutboxShards, n)
	}
	return nil
}

// DefaultIdempotencyRetention is how long ingest remembers an
// Idempotency-Key unless configured otherwise, and after how long the
// relay's janitor drops its partition: both ends of the outbox use it.
const DefaultIdempotencyRetention = 24 * time.Hour

// OutboxShard returns the outbox shard of an aggregate: FNV-1a of the
// aggregate id modulo shards. A shard is shipped by one relay at a time, so
// one aggregate's commands leave the outbox in the order they entered it.
func OutboxShard(aggregateID string, shards int) int {
	const offset32, prime32 = 2166136261, 16777619
	h := uint32(offset32)
	for i := 0; i < len(aggregateID); i++ {
		h ^= uint32(aggregateID[i])
		h *= prime32
	}
	return int(h % uint32(shards))
}
