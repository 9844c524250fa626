package avro

import (
	"encoding/binary"
	"fmt"

	"github.com/onceflow/onceflow/pipeline"
)

// Errors callers branch on. Each error a Decode returns wraps at most one
// of them, so a consumer can route a poison record to its DLQ with a reason:
//
//	switch {
//	case errors.Is(err, avro.ErrMalformed):     // bad header or bytes: the record is broken
//	case errors.Is(err, avro.ErrUnknownSchema): // id the registry does not know
//	case errors.Is(err, avro.ErrIncompatible):  // writer schema or type this binary cannot read
//	default:                                    // registry unreachable, ctx done: retry
//	}
var (
	// ErrMalformed marks a record that is not a valid Confluent-framed Avro
	// datum of its writer schema: short or bad header, undecodable bytes,
	// trailing bytes after the datum, a value out of range for its Go type.
	ErrMalformed = pipeline.ErrUndecodable

	// ErrIncompatible marks a writer schema that cannot be resolved to the
	// reader schema (a reader field without default the writer lacks, a
	// branch or enum symbol the reader does not have, a type mismatch).
	ErrIncompatible = pipeline.ErrIncompatible
)

// HeaderSize is the size of the Confluent wire-format header.
const HeaderSize = 5

// magic is the first byte of the Confluent wire format.
const magic = 0

// AppendHeader appends the Confluent wire-format header to dst: the magic
// byte 0 and the schema id as a big-endian uint32. Registry ids are positive
// int32s; id is truncated to 32 bits.
func AppendHeader(dst []byte, id int) []byte {
	return binary.BigEndian.AppendUint32(append(dst, magic), uint32(id))
}

// ParseHeader splits a Confluent-framed value into its schema id and the
// Avro payload after the header (which aliases b). Errors wrap ErrMalformed.
func ParseHeader(b []byte) (id int, payload []byte, err error) {
	if len(b) < HeaderSize {
		return 0, nil, fmt.Errorf("%w: %d bytes is too short for the %d-byte header", ErrMalformed, len(b), HeaderSize)
	}
	if b[0] != magic {
		return 0, nil, fmt.Errorf("%w: bad magic byte 0x%02x, want 0x00 (not Confluent wire format)", ErrMalformed, b[0])
	}
	return int(binary.BigEndian.Uint32(b[1:HeaderSize])), b[HeaderSize:], nil
}
