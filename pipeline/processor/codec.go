package processor

import (
	"context"
	"encoding/binary"
	"fmt"
	"slices"

	"github.com/onceflow/onceflow/pipeline"
)

// AvroState is implemented (on the pointer) by a state type that encodes
// itself in Avro binary, as the snapshot schema's "state" field holds it:
// for a union, the branch index (an Avro long) and then the record's
// fields in schema order. With it the processor reads and writes snapshots
// without reflection or goavro's generic maps, which is what makes restoring
// a million aggregates a matter of a second or two; without it every
// snapshot goes through the state Serde, correct but an order of magnitude
// slower.
//
// The fast path is only taken for snapshots written with the schema this
// binary registered (same schema id); a snapshot written with another
// version of the schema goes through the Serde, which resolves it. A type
// implementing AvroState must produce exactly the bytes the Serde would:
// test it against the Serde (see ledger.Account's tests).
type AvroState interface {
	// AppendAvro appends the state's encoding to dst.
	AppendAvro(dst []byte) []byte
	// ReadAvro decodes the state from the front of src into the receiver
	// and returns the rest. Errors wrap pipeline.ErrUndecodable.
	ReadAvro(src []byte) (rest []byte, err error)
}

// schemaIDer is implemented by serdes that register their reader schema
// (avro.Serde): the id the fast path writes and recognizes.
type schemaIDer interface {
	Register(ctx context.Context) (int, error)
}

// snapshotCodec reads and writes Snapshot[S] values in the Confluent wire
// format: through the fast path when S implements AvroState and the
// serde tells its schema id, through the serde otherwise.
type snapshotCodec[S any] struct {
	serde Serde
	id    uint32 // the reader schema's id; 0 disables the fast path
}

func newSnapshotCodec[S any](ctx context.Context, serde Serde) (*snapshotCodec[S], error) {
	c := &snapshotCodec[S]{serde: serde}
	var zero S
	if _, ok := any(&zero).(AvroState); !ok {
		return c, nil
	}
	r, ok := serde.(schemaIDer)
	if !ok {
		return c, nil
	}
	id, err := r.Register(ctx)
	if err != nil {
		return nil, fmt.Errorf("state schema: %w", err)
	}
	c.id = uint32(id)
	return c, nil
}

// fast reports whether snapshots go through the AvroState fast path.
func (c *snapshotCodec[S]) fast() bool { return c.id != 0 }

// appendEncode appends the framed encoding of snap to dst.
func (c *snapshotCodec[S]) appendEncode(ctx context.Context, dst []byte, snap *Snapshot[S]) ([]byte, error) {
	if !c.fast() {
		b, err := c.serde.Encode(ctx, *snap)
		if err != nil {
			return dst, err
		}
		return append(dst, b...), nil
	}
	dst = append(dst, 0) // Confluent magic byte
	dst = binary.BigEndian.AppendUint32(dst, c.id)
	dst = binary.AppendVarint(dst, snap.Version)
	if n := len(snap.Processed); n > 0 {
		dst = binary.AppendVarint(dst, int64(n))
		for i := range snap.Processed {
			dst = append(dst, snap.Processed[i].CommandID[:]...)
			dst = binary.AppendVarint(dst, snap.Processed[i].AtMs)
		}
	}
	dst = append(dst, 0) // end of the array
	return any(&snap.State).(AvroState).AppendAvro(dst), nil
}

// decode decodes a framed snapshot value.
func (c *snapshotCodec[S]) decode(ctx context.Context, b []byte) (Snapshot[S], error) {
	var snap Snapshot[S]
	if c.isFast(b) {
		err := decodeSnapshot(b[5:], &snap)
		return snap, err
	}
	v, err := c.serde.Decode(ctx, b)
	if err != nil {
		return Snapshot[S]{}, err
	}
	snap, ok := v.(Snapshot[S])
	if !ok {
		return Snapshot[S]{}, fmt.Errorf("%w: state serde decoded a %T, want a snapshot", pipeline.ErrUndecodable, v)
	}
	return snap, nil
}

// isFast reports whether b can be read by the fast path: written with the
// reader schema.
func (c *snapshotCodec[S]) isFast(b []byte) bool {
	return c.fast() && len(b) >= 5 && b[0] == 0 && binary.BigEndian.Uint32(b[1:5]) == c.id
}

// check decodes b into scratch to check it, reusing scratch's memory so a
// restore checks a million snapshots without allocating for each.
func (c *snapshotCodec[S]) check(ctx context.Context, b []byte, scratch *Snapshot[S]) error {
	if c.isFast(b) {
		scratch.Processed = scratch.Processed[:0]
		return decodeSnapshot(b[5:], scratch)
	}
	snap, err := c.decode(ctx, b)
	*scratch = snap
	return err
}

var errTruncated = fmt.Errorf("%w: snapshot truncated", pipeline.ErrUndecodable)

// processedSize is the smallest encoding of one processed command: 16
// bytes of id and at least one byte of time.
const processedSize = 17

// decodeSnapshot decodes the Avro payload of a snapshot (after the header)
// into snap, appending the processed ids to snap.Processed.
func decodeSnapshot[S any](b []byte, snap *Snapshot[S]) error {
	v, n := binary.Varint(b)
	if n <= 0 {
		return errTruncated
	}
	snap.Version, b = v, b[n:]
	for {
		count, n := binary.Varint(b)
		if n <= 0 {
			return errTruncated
		}
		b = b[n:]
		if count == 0 {
			break
		}
		if count < 0 { // a block with its size in bytes after the count
			if count = -count; count < 0 {
				return fmt.Errorf("%w: snapshot array count out of range", pipeline.ErrUndecodable)
			}
			_, n := binary.Varint(b)
			if n <= 0 {
				return errTruncated
			}
			b = b[n:]
		}
		// A count the remaining bytes cannot hold is refused before
		// anything is allocated for it.
		if count > int64(len(b)/processedSize) {
			return fmt.Errorf("%w: snapshot claims %d processed ids in %d bytes", pipeline.ErrUndecodable, count, len(b))
		}
		snap.Processed = slices.Grow(snap.Processed, int(count))
		for range count {
			if len(b) < 16 {
				return errTruncated
			}
			var pc ProcessedCommand
			copy(pc.CommandID[:], b[:16])
			at, n := binary.Varint(b[16:])
			if n <= 0 {
				return errTruncated
			}
			pc.AtMs, b = at, b[16+n:]
			snap.Processed = append(snap.Processed, pc)
		}
	}
	rest, err := any(&snap.State).(AvroState).ReadAvro(b)
	if err != nil {
		return err
	}
	if len(rest) != 0 {
		return fmt.Errorf("%w: %d trailing bytes after the snapshot", pipeline.ErrUndecodable, len(rest))
	}
	return nil
}
