package pipeline

import (
	"crypto/rand"
	"crypto/sha1" // #nosec G505 -- UUIDv5 (see EventID)
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"sync"
	"time"
)

// ID is a UUID (RFC 9562). Command ids are version 7, event ids version 5.
type ID [16]byte

// Nil is the zero ID.
var Nil ID

// eventNamespace is the UUIDv5 namespace of event ids. Changing it changes
// every event id ever derived, so it is fixed forever.
var eventNamespace = MustParseID("6f6e6365-666c-4f77-8065-76656e747321")

// v7 keeps command ids minted by one process strictly increasing even when
// the clock stands still or steps back (RFC 9562 §6.2, method 3: the
// sub-millisecond field is used as a counter).
var v7 struct {
	sync.Mutex
	lastMS  int64
	counter uint16 // 12 bits
}

// NewCommandID returns a new UUIDv7: 48 bits of Unix milliseconds, then a
// 12-bit counter, then 62 random bits. Ids from one process sort in the
// order they were minted.
func NewCommandID() ID {
	var id ID
	if _, err := rand.Read(id[:]); err != nil {
		panic(fmt.Sprintf("pipeline: read random bytes: %v", err)) // crypto/rand never fails on Linux
	}
	ms := time.Now().UnixMilli()
	v7.Lock()
	if ms <= v7.lastMS {
		v7.counter++
		if v7.counter > 0x0fff { // counter exhausted within one millisecond: borrow the next one
			v7.lastMS++
			v7.counter = 0
		}
		ms = v7.lastMS
	} else {
		v7.lastMS = ms
		v7.counter = 0
	}
	counter := v7.counter
	v7.Unlock()

	id[0] = byte(ms >> 40)
	id[1] = byte(ms >> 32)
	id[2] = byte(ms >> 24)
	id[3] = byte(ms >> 16)
	id[4] = byte(ms >> 8)
	id[5] = byte(ms)
	id[6] = 0x70 | byte(counter>>8)
	id[7] = byte(counter)
	id[8] = id[8]&0x3f | 0x80
	return id
}

// EventID returns the id of the index-th event of the decision on command
// commandID for aggregate aggregateID: the UUIDv5 of the aggregate id, the
// command id and the index. It is the same every time the command is
// decided again. The aggregate id (which starts with the tenant) is part
// of the name because a command id is only unique within its aggregate: a
// direct Kafka producer may send the same command id to two aggregates, or
// two tenants may pick the same one, and those are two commands whose
// events must not share ids (docs/decisions/0001-commands-scoped-by-aggregate.md).
func EventID(aggregateID string, commandID ID, index int) ID {
	name := make([]byte, 0, len(aggregateID)+1+16+8)
	name = append(name, aggregateID...)
	name = append(name, 0)
	name = append(name, commandID[:]...)
	name = binary.BigEndian.AppendUint64(name, uint64(index))
	return NameID(eventNamespace, name)
}

// FailureEventID returns the id of the CommandFailed event the processor
// emits when the command record at (partition, offset) of the commands
// topic goes to the DLQ. It differs from every EventID of the command (a
// redriven command that then succeeds keeps its own event ids) and from the
// failure of another delivery of it (a redrive that fails again records
// its own failure), and is the same when the batch is decided again.
func FailureEventID(aggregateID string, commandID ID, partition int32, offset int64) ID {
	name := make([]byte, 0, len(aggregateID)+1+16+1+4+8)
	name = append(name, aggregateID...)
	name = append(name, 0)
	name = append(name, commandID[:]...)
	name = append(name, 'F')
	name = binary.BigEndian.AppendUint32(name, uint32(partition))
	name = binary.BigEndian.AppendUint64(name, uint64(offset))
	return NameID(eventNamespace, name)
}

// NameID returns the UUIDv5 (SHA-1, name-based) of name within namespace.
// Use it for every id that must be derived rather than minted: a transfer's
// credit command id, a job key.
func NameID(namespace ID, name []byte) ID {
	h := sha1.New() // #nosec G401 -- UUIDv5 is SHA-1 by definition (RFC 9562); event ids need stability, not secrecy
	h.Write(namespace[:])
	h.Write(name)
	var id ID
	copy(id[:], h.Sum(nil))
	id[6] = id[6]&0x0f | 0x50
	id[8] = id[8]&0x3f | 0x80
	return id
}

// Version returns the UUID version (7 for command ids, 5 for event ids).
func (id ID) Version() int { return int(id[6] >> 4) }

// Time returns the millisecond timestamp of a version 7 id, and the zero
// time for any other version.
func (id ID) Time() time.Time {
	if id.Version() != 7 {
		return time.Time{}
	}
	ms := int64(id[0])<<40 | int64(id[1])<<32 | int64(id[2])<<24 | int64(id[3])<<16 | int64(id[4])<<8 | int64(id[5])
	return time.UnixMilli(ms)
}

// IsZero reports whether id is the zero id.
func (id ID) IsZero() bool { return id == Nil }

// String returns the canonical 36-character form.
func (id ID) String() string {
	var b [36]byte
	hex.Encode(b[0:8], id[0:4])
	b[8] = '-'
	hex.Encode(b[9:13], id[4:6])
	b[13] = '-'
	hex.Encode(b[14:18], id[6:8])
	b[18] = '-'
	hex.Encode(b[19:23], id[8:10])
	b[23] = '-'
	hex.Encode(b[24:], id[10:])
	return string(b[:])
}

// MarshalText implements encoding.TextMarshaler.
func (id ID) MarshalText() ([]byte, error) { return []byte(id.String()), nil }

// UnmarshalText implements encoding.TextUnmarshaler.
func (id *ID) UnmarshalText(b []byte) error {
	p, err := ParseID(string(b))
	if err != nil {
		return err
	}
	*id = p
	return nil
}

// ErrInvalidID is returned by ParseID for anything but the canonical form.
var ErrInvalidID = errors.New("invalid id: want a UUID like 01890a5d-ac96-774b-bcce-b302099a8057")

// ParseID parses the canonical 36-character form, in either case.
func ParseID(s string) (ID, error) {
	var id ID
	if len(s) != 36 || s[8] != '-' || s[13] != '-' || s[18] != '-' || s[23] != '-' {
		return id, ErrInvalidID
	}
	// Decode the five groups where they stand: removing every dash first
	// would let dashes elsewhere through ("00-0000--0000-…" decoded to 15
	// bytes and a zero).
	var hx [32]byte
	copy(hx[0:8], s[0:8])
	copy(hx[8:12], s[9:13])
	copy(hx[12:16], s[14:18])
	copy(hx[16:20], s[19:23])
	copy(hx[20:32], s[24:36])
	if _, err := hex.Decode(id[:], hx[:]); err != nil {
		return Nil, ErrInvalidID
	}
	return id, nil
}

// MustParseID is ParseID for constants; it panics on a malformed id.
func MustParseID(s string) ID {
	id, err := ParseID(s)
	if err != nil {
		panic(err)
	}
	return id
}
