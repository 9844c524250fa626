package projector

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// A batch's transaction starts by locking its partitions' offsets
// (lockOffsetsSQL): writers of a partition are serialized, and a zombie
// finds the offsets moved past its records.

// begin begins a batch's transaction, locks the stored offsets of parts
// and returns them, all in one round trip (pgx's Batch.BeginTx): at a
// batch of one event each round trip is a sizeable part of the batch's
// time (docs/benchmarks.md#the-bill-cpu-per-command). On any error the
// transaction is rolled back.
func (a *applier) begin(ctx context.Context, parts []int32) (_ pgx.Tx, _ map[int32]int64, err error) {
	b := &pgx.Batch{}
	b.BeginTx(pgx.TxOptions{})
	stored := a.queueLock(b, parts)
	br := a.pool.SendBatch(ctx, b)
	tx := br.Tx()
	defer func() {
		if err != nil {
			tx.Rollback(context.WithoutCancel(ctx)) // releases the connection; closed already if the begin failed
		}
	}()
	if err := br.Close(); err != nil {
		return nil, nil, fmt.Errorf("begin and lock offsets: %w", err)
	}
	if err := a.rewound(parts, stored); err != nil {
		return nil, nil, err
	}
	return tx, stored, nil
}

// lockOffsets is begin's lock in tx, a transaction begun already (the
// rebuild's swap applies its last records in one).
func (a *applier) lockOffsets(ctx context.Context, tx pgx.Tx, parts []int32) (map[int32]int64, error) {
	b := &pgx.Batch{}
	stored := a.queueLock(b, parts)
	if err := tx.SendBatch(ctx, b).Close(); err != nil {
		return nil, fmt.Errorf("lock offsets: %w", err)
	}
	return stored, a.rewound(parts, stored)
}

// queueLock queues on b the lock of parts' stored offsets (with
// asynchronous commit, its setting first) and returns the map b fills
// with them when it runs.
func (a *applier) queueLock(b *pgx.Batch, parts []int32) map[int32]int64 {
	stored := make(map[int32]int64, len(parts))
	if a.asyncCommit {
		b.Queue(asyncCommitSQL)
	}
	cluster, topicID := a.identity.args()
	b.Queue(lockOffsetsSQL, a.consumer, a.topic, parts, cluster, topicID).Query(func(rows pgx.Rows) error {
		var part int32
		var off int64
		_, err := pgx.ForEachRow(rows, []any{&part, &off}, func() error { stored[part] = off; return nil })
		return err
	})
	return stored
}

// rewound is a rewindError when a stored offset is below one this process
// committed (lost commits), nil otherwise.
func (a *applier) rewound(parts []int32, stored map[int32]int64) error {
	if a.remembered == nil {
		return nil
	}
	var back map[int32]int64
	for _, part := range parts {
		if last, ok := a.remembered.get(part); ok && stored[part] < last {
			if back == nil {
				back = make(map[int32]int64)
			}
			back[part] = stored[part]
		}
	}
	if back != nil {
		return &rewindError{to: back}
	}
	return nil
}
