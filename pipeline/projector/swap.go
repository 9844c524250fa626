package projector

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/onceflow/onceflow/pipeline/postgres"
)

// errNotCaughtUp: the swap found the shadow short of the live offsets
// (the live projector moved on faster than the delta could be fetched).
var errNotCaughtUp = errors.New("the shadow is not at the live offsets yet")

// retrySwap reports whether a failed swap should be tried again later.
func retrySwap(err error) bool {
	var pgErr *pgconn.PgError
	lockTimeout := errors.As(err, &pgErr) && pgErr.Code == "55P03" // lock_not_available
	return lockTimeout || postgres.IsSerialization(err) || errors.Is(err, errNotCaughtUp)
}

const liveOffsetsForUpdateSQL = lockOffsetsSQL

// swap brings the shadow to exactly the live projector's offsets and swaps
// the tables, in one transaction: it locks the live projector's offset rows
// first (every projector transaction starts by locking them, so the live
// projector waits and nothing moves), applies the few records between the
// two, checks the offsets are equal, copies what only the live tables hold
// (SwapHook), then drops each live table and moves its shadow into the
// live table's schema under the same name.
func (b *builder) swap(ctx context.Context, res *RebuildResult) error {
	tx, err := b.pool.Begin(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	live, err := b.lockLive(ctx, tx)
	if err != nil {
		return err
	}
	if err := b.fetchDelta(ctx, live); err != nil {
		return err
	}
	delta, err := b.applyDelta(ctx, tx, live)
	if err != nil {
		return err
	}
	if err := b.swapTables(ctx, tx, res); err != nil {
		return err
	}
	liveParked, err := b.finishSwap(ctx, tx, live)
	if err != nil {
		return err
	}
	if err := tx.Commit(ctx); err != nil {
		return err
	}
	b.applied += int64(delta.applied)
	res.Offsets = live
	res.LiveParked = liveParked
	b.logger.Info("rebuilt tables swapped in", "offsets", live, "applied", b.applied)
	return nil
}

// lockLive bounds the swap's waits for a lock (LockTimeout), then locks
// the live projector's offset rows and returns them.
func (b *builder) lockLive(ctx context.Context, tx pgx.Tx) (map[int32]int64, error) {
	if _, err := tx.Exec(ctx, `SELECT set_config('lock_timeout', $1, true)`, strconv.FormatInt(b.cfg.LockTimeout.Milliseconds(), 10)); err != nil {
		return nil, err
	}
	live := map[int32]int64{}
	cluster, topicID := b.app.identity.args()
	rows, err := tx.Query(ctx, liveOffsetsForUpdateSQL, b.cfg.Consumer, b.cfg.Topic, b.parts, cluster, topicID)
	if err != nil {
		return nil, err
	}
	var part int32
	var off int64
	if _, err := pgx.ForEachRow(rows, []any{&part, &off}, func() error { live[part] = off; return nil }); err != nil {
		return nil, err
	}
	return live, nil
}

// fetchDelta fetches until every partition has reached the live offset,
// or gives up after 5 s (errNotCaughtUp: the swap is tried again).
func (b *builder) fetchDelta(ctx context.Context, live map[int32]int64) error {
	deadline := time.Now().Add(5 * time.Second)
	for !b.fetchedUpTo(live) {
		if time.Now().After(deadline) {
			return errNotCaughtUp
		}
		for _, p := range b.parts {
			if b.paused[p] && b.seen[p] < live[p]-1 {
				b.cl.ResumeFetchPartitions(map[string][]int32{b.cfg.Topic: {p}})
				b.paused[p] = false
			}
		}
		b.poll(ctx, 100*time.Millisecond)
	}
	return nil
}

// applyDelta applies the records between the shadow's offsets and the
// live ones in the swap's transaction, under a savepoint (parks and data
// errors as in applier.apply), and checks that the shadow is then exactly
// at the live offsets.
func (b *builder) applyDelta(ctx context.Context, tx pgx.Tx, live map[int32]int64) (result, error) {
	evs, parks, err := decodeAll(ctx, b.dec, b.eligible(live, false))
	if err != nil {
		return result{}, fmt.Errorf("decode: %w", err)
	}
	var delta result
	careful := false // as in applier.apply
	for {
		sp, err := tx.Begin(ctx)
		if err != nil {
			return result{}, err
		}
		parts := batchPartitions(evs, parks)
		stored, err := b.app.lockOffsets(ctx, sp, parts)
		if err != nil {
			return result{}, err
		}
		r, more, err := b.app.applyInTx(ctx, sp, evs, parks, parts, stored, careful, 0)
		if err != nil && !careful && isProjectionDataError(err) {
			if err := sp.Rollback(ctx); err != nil {
				return result{}, err
			}
			careful = true
			continue
		}
		if err != nil {
			return result{}, err
		}
		if len(more) == 0 {
			if err := sp.Commit(ctx); err != nil {
				return result{}, err
			}
			delta = r
			break
		}
		if err := sp.Rollback(ctx); err != nil {
			return result{}, err
		}
		parks = mergeParks(parks, more)
		evs = stopAtParks(evs, parks)
	}
	shadow, err := offsetsIn(ctx, tx, b.st.shadowConsumer, b.cfg.Topic)
	if err != nil {
		return result{}, err
	}
	for _, p := range b.parts {
		if shadow[p] != live[p] {
			return result{}, fmt.Errorf("%w: partition %d: shadow at %d, live at %d", errNotCaughtUp, p, shadow[p], live[p])
		}
	}
	return delta, nil
}

// swapTables is the swap proper: it locks each live table, runs the
// projection's SwapHook, checksums both sides if asked (res.Tables), then
// moves each shadow table in place of its live one and drops the shadow
// schema.
func (b *builder) swapTables(ctx context.Context, tx pgx.Tx, res *RebuildResult) error {
	res.Tables = res.Tables[:0]
	for _, t := range b.tables {
		if _, err := tx.Exec(ctx, `LOCK TABLE `+b.st.live(t)+` IN EXCLUSIVE MODE`); err != nil {
			return err
		}
		if hook, ok := b.cfg.Projection.(SwapHook); ok {
			if err := hook.BeforeSwap(ctx, tx, t, b.st.live(t), b.st.shadow(t)); err != nil {
				return err
			}
		}
		sw := SwappedTable{Name: t}
		if b.cfg.Verify {
			var err error
			if sw.LiveRows, sw.LiveChecksum, err = checksum(ctx, tx, b.st.live(t)); err != nil {
				return err
			}
			if sw.RebuiltRows, sw.RebuiltChecksum, err = checksum(ctx, tx, b.st.shadow(t)); err != nil {
				return err
			}
		}
		res.Tables = append(res.Tables, sw)
	}
	for _, t := range b.tables {
		// The copy has the live table's columns, constraints and indexes
		// (LIKE ... INCLUDING ALL) but not its owner, row-level security
		// policies or grants: without them the runtime role would lose the
		// table and tenants' reads their policy (sql/00036_runtime_role.sql).
		if _, err := tx.Exec(ctx, `SELECT onceflow_copy_table_access($1::regclass, $2::regclass)`, b.st.live(t), b.st.shadow(t)); err != nil {
			return fmt.Errorf("copy the access of %s: %w", t, err)
		}
		if _, err := tx.Exec(ctx, `DROP TABLE `+b.st.live(t)); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `ALTER TABLE `+b.st.shadow(t)+` SET SCHEMA `+pgx.Identifier{b.st.liveSchema[t]}.Sanitize()); err != nil {
			return err
		}
	}
	_, err := tx.Exec(ctx, `DROP SCHEMA `+pgx.Identifier{b.st.schema}.Sanitize())
	return err
}

// finishSwap forgets the shadow consumer, records the rebuild swapped and
// returns the partitions the live projector has parked.
func (b *builder) finishSwap(ctx context.Context, tx pgx.Tx, live map[int32]int64) ([]int32, error) {
	if _, err := tx.Exec(ctx, forgetConsumerSQL, b.st.shadowConsumer); err != nil {
		return nil, err
	}
	detail := "swapped at offsets " + OffsetsText(live) + " (partition:offset)"
	if _, err := tx.Exec(ctx, `UPDATE projection_rebuilds SET state = 'swapped', finished_at = now(), detail = $2
		WHERE shadow_consumer = $1`, b.st.shadowConsumer, detail); err != nil {
		return nil, err
	}
	prow, err := tx.Query(ctx, `SELECT partition FROM projector_parked WHERE consumer = $1 AND topic = $2 ORDER BY partition`, b.cfg.Consumer, b.cfg.Topic)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(prow, pgx.RowTo[int32])
}

// fetchedUpTo reports whether every record below the live offsets has been
// fetched: the last one below each offset, or one at or past it.
func (b *builder) fetchedUpTo(live map[int32]int64) bool {
	for _, p := range b.parts {
		if _, stopped := b.parked[p]; stopped {
			continue
		}
		if b.shadowNext[p] < live[p] && b.seen[p] < live[p]-1 {
			return false
		}
	}
	return true
}

func offsetsIn(ctx context.Context, tx pgx.Tx, consumer, topic string) (map[int32]int64, error) {
	rows, err := tx.Query(ctx, `SELECT partition, next_offset FROM consumer_offsets WHERE consumer = $1 AND topic = $2`, consumer, topic)
	if err != nil {
		return nil, err
	}
	out := map[int32]int64{}
	var p int32
	var o int64
	_, err = pgx.ForEachRow(rows, []any{&p, &o}, func() error { out[p] = o; return nil })
	return out, err
}

// checksum is a table's row count and an order-independent digest of its
// rows' text.
func checksum(ctx context.Context, tx pgx.Tx, table string) (int64, string, error) {
	var n int64
	var sum string
	err := tx.QueryRow(ctx, `SELECT count(*), coalesce(md5(string_agg(h, '' ORDER BY h)), '')
		FROM (SELECT md5(t::text) AS h FROM `+table+` t) s`).Scan(&n, &sum)
	if err != nil {
		return 0, "", fmt.Errorf("checksum %s: %w", table, err)
	}
	return n, sum, nil
}

// OffsetsText is offsets by partition as an operator reads them,
// "0:12 1:7", in partition order.
func OffsetsText(m map[int32]int64) string {
	parts := slices.Sorted(maps.Keys(m))
	var b strings.Builder
	for i, p := range parts {
		if i > 0 {
			b.WriteByte(' ')
		}
		fmt.Fprintf(&b, "%d:%d", p, m[p])
	}
	return b.String()
}
