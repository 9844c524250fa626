package relay

import (
	"context"
	"errors"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

// The outbox is a queue: rows are inserted at one end and deleted at the
// other, so between autovacuum runs (at most one a minute per database,
// often less on a busy server) its (shard, xid, id) index fills with dead
// entries that every read of a shard's head has to step over; at 500 rows
// a second that is tens of thousands of them, and the relay's latency
// grows with them. The relay holding shard 0 therefore vacuums the outbox
// itself once dead tuples outnumber both vacuumMinDead and the live ones,
// as long as few rows are waiting (vacuumMaxLive): draining a backlog of
// millions, a vacuum of the whole table would cost more than it saves,
// and autovacuum's own thresholds are the right ones.
// Without truncation: giving the emptied tail pages back to the operating
// system takes an exclusive lock that would stall ingest and the relay, and
// a queue table fills those pages again a moment later.
const (
	vacuumInterval = time.Second
	vacuumMinDead  = 2000
	vacuumMaxLive  = 50_000

	deadTuplesSQL = `SELECT n_dead_tup, n_live_tup FROM pg_stat_user_tables WHERE relid = 'outbox'::regclass`
	// ownsOutboxSQL: VACUUM skips, with only a warning, a table whose
	// owner the role is not (a superuser owns everything); the runtime role
	// owns nothing (docs/security.md#database-roles).
	ownsOutboxSQL = `SELECT pg_has_role(relowner, 'USAGE') FROM pg_class WHERE oid = 'outbox'::regclass`
	vacuumSQL     = `VACUUM (SKIP_LOCKED, TRUNCATE false) outbox`
)

func (r *Relay) vacuum(ctx context.Context) error {
	owner := false
	for sleep(ctx, jitter(vacuumInterval)) {
		if !r.holds(0) {
			continue
		}
		if !owner {
			if err := r.pool.QueryRow(ctx, ownsOutboxSQL).Scan(&owner); err != nil {
				if ctx.Err() == nil {
					r.logLimited("check the outbox's owner", "err", err)
				}
				continue
			}
			if !owner {
				r.logger.Info("not the outbox's owner (the runtime role): autovacuum vacuums it, not the relay")
				<-ctx.Done()
				return nil
			}
		}
		var dead, live int64
		if err := r.pool.QueryRow(ctx, deadTuplesSQL).Scan(&dead, &live); err != nil {
			if ctx.Err() == nil {
				r.logLimited("read outbox statistics", "err", err)
			}
			continue
		}
		if dead < max(vacuumMinDead, live) || live > vacuumMaxLive {
			continue
		}
		start := time.Now()
		if _, err := r.pool.Exec(ctx, vacuumSQL); err != nil {
			var pgErr *pgconn.PgError
			if errors.As(err, &pgErr) && pgErr.Code == "42501" { // insufficient_privilege: not the table's owner
				r.logger.Warn("cannot vacuum the outbox (not its owner); relying on autovacuum", "err", err)
				<-ctx.Done()
				return nil
			}
			if ctx.Err() == nil {
				r.logLimited("vacuum outbox", "err", err)
			}
			continue
		}
		r.logger.Debug("vacuumed the outbox", "dead_tuples", dead, "took", time.Since(start))
	}
	return nil
}

// holds reports whether this relay holds the shard's lease.
func (r *Relay) holds(shard int) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	_, ok := r.workers[shard]
	return ok
}
