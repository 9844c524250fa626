package projector

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Skipping is an operator's request to skip the record a partition is
// parked on (`onceflow projections skip`).
type Skipping struct {
	Consumer, Topic string
	Partition       int32
	// Offset is the parked record's: the skip is refused unless the
	// partition is parked exactly there, so an operator skips the record
	// they looked at and no other.
	Offset int64
	// Note says why (required), Operator who (required); both are kept in
	// projector_skips.
	Note, Operator string
}

// Skipped is a skip done: from the parked offset to the partition's new
// one, and the park it ended.
type Skipped struct {
	From, To       int64
	Reason, Detail string
	At             time.Time
}

// ErrNotParked is Skip's error when the partition is not parked at the
// offset given.
var ErrNotParked = errors.New("projector: the partition is not parked at that offset")

const (
	lockOffsetSQL = `SELECT next_offset FROM consumer_offsets WHERE consumer = $1 AND topic = $2 AND partition = $3 FOR UPDATE`
	lockParkedSQL = `SELECT next_offset, reason, detail, coalesce(skip_to, next_offset + 1) FROM projector_parked
		WHERE consumer = $1 AND topic = $2 AND partition = $3 FOR UPDATE`
	skipOffsetSQL = `UPDATE consumer_offsets SET next_offset = $4, updated_at = now() WHERE consumer = $1 AND topic = $2 AND partition = $3`
	dropParkedSQL = `DELETE FROM projector_parked WHERE consumer = $1 AND topic = $2 AND partition = $3`
	auditSkipSQL  = `INSERT INTO projector_skips (consumer, topic, partition, from_offset, to_offset, reason, detail, note, operator)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9) RETURNING skipped_at`
)

// Skip moves a parked partition past the record it is parked on (past its
// whole batch when the batch could not be read), ends the park, and
// records the skip in projector_skips, in one transaction that first
// locks the partition's offset row as every projector transaction does.
// The projector that owns the partition notices the park gone within
// ParkCheckInterval and reads on from the new offset; the skipped record
// is never applied (a rebuild from the topic applies it, unless it parks
// there again). It returns ErrNotParked unless the partition is parked at
// s.Offset.
func Skip(ctx context.Context, pool *pgxpool.Pool, s Skipping) (Skipped, error) {
	if s.Note == "" || s.Operator == "" {
		return Skipped{}, errors.New("projector: a skip needs a note (why) and an operator (who)")
	}
	out := Skipped{From: s.Offset}
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		var stored, parkedAt int64
		err := tx.QueryRow(ctx, lockOffsetSQL, s.Consumer, s.Topic, s.Partition).Scan(&stored)
		if err != nil && !errors.Is(err, pgx.ErrNoRows) {
			return fmt.Errorf("lock the offset: %w", err)
		}
		err = tx.QueryRow(ctx, lockParkedSQL, s.Consumer, s.Topic, s.Partition).Scan(&parkedAt, &out.Reason, &out.Detail, &out.To)
		switch {
		case errors.Is(err, pgx.ErrNoRows):
			return fmt.Errorf("%w: partition %d of %s is not parked", ErrNotParked, s.Partition, s.Consumer)
		case err != nil:
			return fmt.Errorf("read the park: %w", err)
		case resettable(out.Reason):
			return fmt.Errorf("%w: partition %d of %s is parked for its stored offset (%s): onceflow projections reset", ErrNotParked, s.Partition, s.Consumer, out.Reason)
		case parkedAt != s.Offset || stored != s.Offset:
			return fmt.Errorf("%w: partition %d of %s is parked at %d (stored offset %d), not %d", ErrNotParked, s.Partition, s.Consumer, parkedAt, stored, s.Offset)
		}
		if _, err := tx.Exec(ctx, skipOffsetSQL, s.Consumer, s.Topic, s.Partition, out.To); err != nil {
			return fmt.Errorf("move the offset: %w", err)
		}
		if _, err := tx.Exec(ctx, dropParkedSQL, s.Consumer, s.Topic, s.Partition); err != nil {
			return fmt.Errorf("end the park: %w", err)
		}
		if err := tx.QueryRow(ctx, auditSkipSQL, s.Consumer, s.Topic, s.Partition, s.Offset, out.To, out.Reason, out.Detail,
			cleanText(s.Note), cleanText(s.Operator)).Scan(&out.At); err != nil {
			return fmt.Errorf("record the skip: %w", err)
		}
		return nil
	})
	if err != nil {
		return Skipped{}, err
	}
	return out, nil
}
