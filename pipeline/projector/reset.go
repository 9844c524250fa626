package projector

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/onceflow/onceflow/pipeline/kafka"
)

// FromStart is Resetting.From for each partition's log start: the
// beginning of the topic as it is now.
const FromStart int64 = -1

// Resetting is an operator's answer to partitions parked because their
// stored offset does not fit the topic (topic-changed,
// offset-out-of-range): where to read from now (`onceflow projections
// reset`).
type Resetting struct {
	Consumer, Topic string
	// Partitions to reset; empty, every partition of the consumer parked
	// for one of those reasons.
	Partitions []int32
	// From is the offset each partition reads from next: FromStart (the
	// log start), or an offset within the partition's log.
	From int64
	// Note says why (required), Operator who (required); both are kept in
	// projector_resets.
	Note, Operator string
}

// ResetDone is one partition reset: from its stored offset (of the log it
// was stored against) to the offset it now reads from.
type ResetDone struct {
	Partition      int32
	From, To       int64
	Reason, Detail string
	At             time.Time
}

// ErrNotResettable is Reset's error when a partition is not parked for its
// stored offset (reason topic-changed or offset-out-of-range): the reset
// moves only offsets an operator was asked about.
var ErrNotResettable = errors.New("projector: the partition is not parked for its stored offset (topic-changed, offset-out-of-range)")

const (
	resettableSQL = `SELECT partition FROM projector_parked WHERE consumer = $1 AND topic = $2
		AND reason IN ('topic-changed', 'offset-out-of-range') ORDER BY partition`
	lockStoredSQL = `SELECT partition, next_offset, cluster_id, topic_id FROM consumer_offsets
		WHERE consumer = $1 AND topic = $2 AND partition = ANY ($3::int[]) ORDER BY partition FOR UPDATE`
	lockParksSQL = `SELECT partition, reason, detail FROM projector_parked
		WHERE consumer = $1 AND topic = $2 AND partition = ANY ($3::int[]) ORDER BY partition FOR UPDATE`
	resetOffsetSQL = `UPDATE consumer_offsets SET next_offset = $4, cluster_id = $5, topic_id = $6, updated_at = now()
		WHERE consumer = $1 AND topic = $2 AND partition = $3`
	auditResetSQL = `INSERT INTO projector_resets (consumer, topic, partition, from_offset, to_offset, from_cluster_id, from_topic_id,
			to_cluster_id, to_topic_id, reason, detail, note, operator)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13) RETURNING reset_at`
)

// Reset moves partitions parked for their stored offset to r.From on the
// topic as cl's cluster has it now, records that identity beside the
// offset, ends the park and records the reset in projector_resets, in one
// transaction that first locks the partitions' offset rows as every
// projector transaction does. The projector that owns a partition notices
// the park gone within ParkCheckInterval and reads from the new offset.
// Any partition that is not parked for its stored offset, or an offset
// outside a partition's log, refuses the whole reset (ErrNotResettable).
func Reset(ctx context.Context, pool *pgxpool.Pool, cl *kgo.Client, r Resetting) ([]ResetDone, error) {
	if r.Note == "" || r.Operator == "" {
		return nil, errors.New("projector: a reset needs a note (why) and an operator (who)")
	}
	if r.From < FromStart {
		return nil, fmt.Errorf("projector: reset to offset %d: want an offset or FromStart", r.From)
	}
	cur, logs, err := kafka.DescribeTopic(ctx, cl, r.Topic)
	if err != nil {
		return nil, err
	}
	var out []ResetDone
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		out = nil
		parts := slices.Clone(r.Partitions)
		if len(parts) == 0 {
			rows, err := tx.Query(ctx, resettableSQL, r.Consumer, r.Topic)
			if err != nil {
				return fmt.Errorf("list parked partitions: %w", err)
			}
			if parts, err = pgx.CollectRows(rows, pgx.RowTo[int32]); err != nil {
				return fmt.Errorf("list parked partitions: %w", err)
			}
			if len(parts) == 0 {
				return fmt.Errorf("%w: no partition of %s on %s is", ErrNotResettable, r.Consumer, r.Topic)
			}
		}
		slices.Sort(parts)
		parts = slices.Compact(parts)
		rows, err := tx.Query(ctx, lockStoredSQL, r.Consumer, r.Topic, parts)
		if err != nil {
			return fmt.Errorf("lock the offsets: %w", err)
		}
		stored, err := scanStored(rows)
		if err != nil {
			return fmt.Errorf("lock the offsets: %w", err)
		}
		parked := map[int32][2]string{}
		rows, err = tx.Query(ctx, lockParksSQL, r.Consumer, r.Topic, parts)
		if err != nil {
			return fmt.Errorf("read the parks: %w", err)
		}
		var part int32
		var reason, detail string
		if _, err := pgx.ForEachRow(rows, []any{&part, &reason, &detail}, func() error { parked[part] = [2]string{reason, detail}; return nil }); err != nil {
			return fmt.Errorf("read the parks: %w", err)
		}
		cluster, topicID := identityArgs(cur)
		for _, part := range parts {
			pk, ok := parked[part]
			s, hasOffset := stored[part]
			switch {
			case !ok || !hasOffset:
				return fmt.Errorf("%w: partition %d of %s is not parked", ErrNotResettable, part, r.Consumer)
			case !resettable(pk[0]):
				return fmt.Errorf("%w: partition %d of %s is parked for %s (onceflow projections unpark or skip)", ErrNotResettable, part, r.Consumer, pk[0])
			}
			log, ok := logs[part]
			if !ok {
				return fmt.Errorf("%w: %s has no partition %d now", ErrNotResettable, r.Topic, part)
			}
			to := r.From
			if to == FromStart {
				to = log.Start
			}
			if !log.Contains(to) {
				return fmt.Errorf("%w: offset %d is outside partition %d's log (%d to %d)", ErrNotResettable, to, part, log.Start, log.End)
			}
			var fromCluster *string
			var fromTopic pgtype.UUID
			if s.identity != nil {
				c, t := identityArgs(*s.identity)
				fromCluster, fromTopic = &c, t
			}
			if _, err := tx.Exec(ctx, resetOffsetSQL, r.Consumer, r.Topic, part, to, cluster, topicID); err != nil {
				return fmt.Errorf("move the offset: %w", err)
			}
			if _, err := tx.Exec(ctx, dropParkedSQL, r.Consumer, r.Topic, part); err != nil {
				return fmt.Errorf("end the park: %w", err)
			}
			done := ResetDone{Partition: part, From: s.offset, To: to, Reason: pk[0], Detail: pk[1]}
			if err := tx.QueryRow(ctx, auditResetSQL, r.Consumer, r.Topic, part, s.offset, to, fromCluster, fromTopic, cluster, topicID,
				pk[0], pk[1], cleanText(r.Note), cleanText(r.Operator)).Scan(&done.At); err != nil {
				return fmt.Errorf("record the reset: %w", err)
			}
			out = append(out, done)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}
