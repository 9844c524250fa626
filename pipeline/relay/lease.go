package relay

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// Lease SQL. Every statement that changes a shard names the token the
// relay acquired; expiry is always the database's clock.
const (
	// seedShardsSQL creates the lease rows once, under a lock so relays
	// starting together agree, and returns how many rows exist.
	lockShardsSQL  = `SELECT pg_advisory_xact_lock(hashtextextended('onceflow_outbox_leases', 0))`
	countShardsSQL = `SELECT count(*), COALESCE(max(shard), -1) FROM outbox_leases`
	seedShardsSQL  = `INSERT INTO outbox_leases (shard) SELECT generate_series(0, $1::int - 1)`

	// heartbeatSQL records this relay as live and lists the other live
	// relays (its own row may not be visible to this statement's snapshot
	// yet). It also forgets relays silent for an hour.
	heartbeatSQL = `WITH hb AS (
		INSERT INTO outbox_relays (owner, instance, lease_ms) VALUES ($1, $2, $3)
		ON CONFLICT (owner) DO UPDATE SET heartbeat_at = now(), lease_ms = EXCLUDED.lease_ms
		RETURNING owner
	), gone AS (
		DELETE FROM outbox_relays WHERE heartbeat_at < now() - interval '1 hour' AND owner <> $1
	)
	SELECT COALESCE(array_agg(owner), '{}') FROM outbox_relays
	WHERE owner <> $1 AND heartbeat_at > now() - make_interval(secs => lease_ms / 1000.0)`

	// renewSQL extends the leases this relay still holds and returns them;
	// a shard missing from the result was lost. It commits without waiting
	// for the WAL flush: the lease rows stay locked until the commit, and
	// every worker's delete share-locks its row, so an fsync here would
	// stall all shards at once. A renewal lost in a database crash is
	// harmless: another relay may take the shard a little early, and its
	// producer fences this one in Kafka.
	renewSQL = `WITH async AS (
			SELECT set_config('synchronous_commit', 'off', true)
		)
		UPDATE outbox_leases l SET expires_at = now() + make_interval(secs => $4), renewed_at = now()
		FROM unnest($2::int[], $3::bigint[]) AS h(shard, token), async
		WHERE l.shard = h.shard AND l.token = h.token AND l.owner = $1
		RETURNING l.shard`

	// acquireFreeSQL takes up to $4 shards that are free (released) or
	// whose lease expired, and returns them with their new tokens.
	acquireFreeSQL = `UPDATE outbox_leases l
		SET owner = $1, instance = $2, token = l.token + 1, expires_at = now() + make_interval(secs => $3),
		    acquired_at = now(), renewed_at = now()
		FROM (
			SELECT shard FROM outbox_leases
			WHERE shard < $5 AND (owner IS NULL OR expires_at <= now())
			ORDER BY shard LIMIT $4
			FOR UPDATE SKIP LOCKED
		) c
		WHERE l.shard = c.shard
		RETURNING l.shard, l.token`

	// acquireOrphansSQL takes, whatever this relay's fair share, the shards
	// that have been free or expired for a whole lease period (so a shard
	// never stays without a holder because of a stale count of live
	// relays) and, at start ($4), those this instance's previous
	// incarnation held (it is gone or about to be fenced).
	acquireOrphansSQL = `UPDATE outbox_leases l
		SET owner = $1, instance = $2, token = l.token + 1, expires_at = now() + make_interval(secs => $3),
		    acquired_at = now(), renewed_at = now()
		FROM (
			SELECT shard FROM outbox_leases
			WHERE shard < $5 AND (
				(expires_at > '-infinity' AND expires_at <= now() - make_interval(secs => $3))
				OR ($4 AND instance = $2 AND owner IS DISTINCT FROM $1))
			ORDER BY shard
			FOR UPDATE SKIP LOCKED
		) c
		WHERE l.shard = c.shard
		RETURNING l.shard, l.token`

	// releaseSQL gives a shard back (graceful stop, rebalancing). The
	// token stays: the next holder increments it. expires_at = now() marks
	// when it became free.
	releaseSQL = `UPDATE outbox_leases SET owner = NULL, instance = NULL, expires_at = now()
		WHERE shard = $1 AND token = $2 AND owner = $3`

	// nextExpirySQL is how long until a shard held by another relay
	// expires, or until a free one becomes free for anyone: when the
	// keeper should look again to take over promptly.
	nextExpirySQL = `SELECT EXTRACT(EPOCH FROM min(t) - now())::float8 FROM (
		SELECT CASE WHEN expires_at > now() THEN expires_at
		            ELSE expires_at + make_interval(secs => $2) END AS t
		FROM outbox_leases WHERE owner IS DISTINCT FROM $1) x
		WHERE t > now()`

	leaveSQL = `DELETE FROM outbox_relays WHERE owner = $1`
)

// ErrShardCount is returned by Run when the outbox's leases were created
// with another shard count than the relay's.
var ErrShardCount = errors.New("outbox shard count mismatch")

// ensureShards creates the lease rows on first start and checks that the
// deployment's shard count is the relay's.
func (r *Relay) ensureShards(ctx context.Context) error {
	return pgx.BeginFunc(ctx, r.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, lockShardsSQL); err != nil {
			return err
		}
		var n, maxShard int
		if err := tx.QueryRow(ctx, countShardsSQL).Scan(&n, &maxShard); err != nil {
			return err
		}
		switch {
		case n == 0:
			_, err := tx.Exec(ctx, seedShardsSQL, r.cfg.Shards)
			return err
		case n != r.cfg.Shards || maxShard != r.cfg.Shards-1:
			return fmt.Errorf("%w: the outbox has %d shards, this relay is configured with %d; "+
				"every ingest and relay must use the same ONCEFLOW_OUTBOX_SHARDS (see docs/relay.md to change it)",
				ErrShardCount, n, r.cfg.Shards)
		}
		return nil
	})
}

// keep runs the lease keeper until ctx ends: heartbeat, renew what this
// relay holds, give back what is above its fair share, take what it lacks.
func (r *Relay) keep(ctx context.Context) error {
	startup := true
	backoff := r.cfg.PollInterval
	for {
		wait, err := r.keepOnce(ctx, startup)
		if ctx.Err() != nil {
			return nil
		}
		if err != nil {
			r.metrics.errors.Inc()
			r.logLimited("lease keeper", "err", err, "backoff", backoff)
			wait = backoff
			backoff = min(backoff*2, r.cfg.MaxBackoff, r.cfg.LeaseDuration/3)
		} else {
			startup = false
			backoff = r.cfg.PollInterval
		}
		select {
		case <-ctx.Done():
			return nil
		case <-r.rebalance:
		case <-time.After(wait):
		}
	}
}

// keepOnce does one round of the keeper and returns when to run again.
func (r *Relay) keepOnce(ctx context.Context, startup bool) (time.Duration, error) {
	if h := r.hooks.beforeKeep; h != nil {
		h()
	}
	lease := r.cfg.LeaseDuration
	secs := lease.Seconds()
	sent := time.Now()
	var others []string
	if err := r.pool.QueryRow(ctx, heartbeatSQL, r.owner, r.cfg.InstanceID, lease.Milliseconds()).Scan(&others); err != nil {
		return 0, fmt.Errorf("heartbeat: %w", err)
	}

	held := r.heldShards()
	if len(held) > 0 {
		shards := make([]int32, 0, len(held))
		tokens := make([]int64, 0, len(held))
		for _, w := range held {
			shards = append(shards, int32(w.shard))
			tokens = append(tokens, w.token)
		}
		rows, err := r.pool.Query(ctx, renewSQL, r.owner, shards, tokens, secs)
		if err != nil {
			return 0, fmt.Errorf("renew leases: %w", err)
		}
		renewed, err := pgx.CollectRows(rows, pgx.RowTo[int32])
		if err != nil {
			return 0, fmt.Errorf("renew leases: %w", err)
		}
		ok := make(map[int]bool, len(renewed))
		for _, s := range renewed {
			ok[int(s)] = true
		}
		for _, w := range held {
			if ok[w.shard] {
				w.extend(sent.Add(lease))
			} else {
				r.lost(w, "renew")
			}
		}
	}

	target := fairShare(r.cfg.Shards, r.owner, others)
	holding := r.holding()
	if excess := len(holding) - target; excess > 0 && !startup {
		// Give back the highest shards; each worker releases its lease
		// after its batch in flight, so the keeper never waits on Kafka.
		for i := len(holding) - excess; i < len(holding); i++ {
			holding[i].release()
		}
	}
	got, err := r.acquire(ctx, acquireOrphansSQL, secs, startup)
	if err != nil {
		return 0, err
	}
	if want := target - len(holding) - len(got); want > 0 {
		free, err := r.acquire(ctx, acquireFreeSQL, secs, want)
		if err != nil {
			return 0, err
		}
		got = append(got, free...)
	}
	for _, a := range got {
		r.start(ctx, a.shard, a.token, sent.Add(lease))
	}

	// Look again at a third of the lease (renewal), or sooner when another
	// relay's lease is about to expire, so a dead relay's shards are taken
	// over right after its lease ends.
	wait := lease / 3
	var next *float64
	if err := r.pool.QueryRow(ctx, nextExpirySQL, r.owner, secs).Scan(&next); err != nil {
		return 0, fmt.Errorf("next expiry: %w", err)
	}
	if next != nil {
		wait = min(wait, seconds(*next)+10*time.Millisecond)
	}
	return max(wait, 10*time.Millisecond), nil
}

// fairShare is how many shards a relay should hold: the live relays,
// sorted by owner, each get shards/live, and the first shards%live of
// them one more. Every relay computes the same split, the targets add up
// to the shard count, and a relay above its target gives shards back to
// one below it.
func fairShare(shards int, self string, others []string) int {
	live := len(others) + 1
	rank := 0
	for _, o := range others {
		if o < self {
			rank++
		}
	}
	target := shards / live
	if rank < shards%live {
		target++
	}
	return target
}

type acquired struct {
	shard int
	token int64
}

func (r *Relay) acquire(ctx context.Context, sql string, secs float64, arg any) ([]acquired, error) {
	rows, err := r.pool.Query(ctx, sql, r.owner, r.cfg.InstanceID, secs, arg, r.cfg.Shards)
	if err != nil {
		return nil, fmt.Errorf("acquire leases: %w", err)
	}
	got, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (acquired, error) {
		var a acquired
		return a, row.Scan(&a.shard, &a.token)
	})
	if err != nil {
		return nil, fmt.Errorf("acquire leases: %w", err)
	}
	for range got {
		r.metrics.leases.WithLabelValues("acquired").Inc()
	}
	return got, nil
}

// releaseLease gives a shard back (best effort: if it fails, the lease
// simply expires).
func (r *Relay) releaseLease(shard int, token int64) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := r.pool.Exec(ctx, releaseSQL, shard, token, r.owner); err != nil {
		r.logger.Warn("release lease", "shard", shard, "err", err)
		return
	}
	r.metrics.leases.WithLabelValues("released").Inc()
}
