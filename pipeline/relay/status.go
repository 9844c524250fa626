package relay

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Status is the outbox as an operator sees it (`onceflow outbox status`).
type Status struct {
	// Shards lists every shard with a lease row, plus any shard that has
	// rows but no lease row (Leased false: ingest and relay disagree on
	// the shard count, and nobody ships those rows).
	Shards []ShardStatus
	// Relays lists the relay processes that heartbeated in the last hour.
	Relays []RelayStatus
	// DeadRows counts the rows in outbox_dead; Dead holds the newest.
	DeadRows int64
	Dead     []DeadRow
}

// ShardStatus is one shard: its backlog and its lease.
type ShardStatus struct {
	Shard     int
	Backlog   int64
	OldestAge time.Duration // age of the row at the head of the shard; 0 when empty
	Leased    bool          // the shard has a lease row
	Owner     string        // holder ("instance#nonce"); "" when free
	Instance  string
	Token     int64
	ExpiresIn time.Duration // negative once expired
}

// RelayStatus is one relay process.
type RelayStatus struct {
	Owner     string
	Instance  string
	StartedAt time.Time
	SilentFor time.Duration // since its last heartbeat
	Live      bool          // heartbeat within its lease period
	Shards    int           // leases it holds (unexpired)
}

// DeadRow is a row the broker refused for good.
type DeadRow struct {
	ID        int64
	Shard     int
	Topic     string
	Key       string
	CommandID string
	Bytes     int
	CreatedAt time.Time
	DeadAt    time.Time
	Reason    string
	Detail    string
}

const (
	// backlogSQL counts each shard's rows (a scan of the outbox, paid at
	// scrape time) and reads the age of the row at each shard's head
	// through the (shard, xid, id) index: the row the relay ships next.
	backlogSQL = `WITH counts AS (SELECT shard, count(*) AS n FROM outbox GROUP BY shard),
		shards AS (SELECT shard FROM outbox_leases UNION SELECT shard FROM counts)
		SELECT s.shard, COALESCE(c.n, 0), COALESCE(EXTRACT(EPOCH FROM now() - o.created_at), 0)::float8
		FROM shards s
		LEFT JOIN counts c ON c.shard = s.shard
		LEFT JOIN LATERAL (SELECT created_at FROM outbox WHERE shard = s.shard ORDER BY xid, id LIMIT 1) o ON true
		ORDER BY s.shard`

	leasesSQL = `SELECT shard, COALESCE(owner, ''), COALESCE(instance, ''), token,
			CASE WHEN expires_at = '-infinity' THEN NULL ELSE EXTRACT(EPOCH FROM expires_at - now())::float8 END
		FROM outbox_leases ORDER BY shard`

	relaysSQL = `SELECT r.owner, r.instance, r.started_at, EXTRACT(EPOCH FROM now() - r.heartbeat_at)::float8,
			r.heartbeat_at > now() - make_interval(secs => r.lease_ms / 1000.0),
			(SELECT count(*) FROM outbox_leases l WHERE l.owner = r.owner AND l.expires_at > now())
		FROM outbox_relays r WHERE r.heartbeat_at > now() - interval '1 hour'
		ORDER BY r.instance, r.started_at`

	countDeadSQL = `SELECT count(*) FROM outbox_dead`

	deadSQL = `SELECT id, shard, topic, key, COALESCE(headers->>'command-id', ''), length(value),
			created_at, dead_at, reason, detail
		FROM outbox_dead ORDER BY dead_at DESC, id DESC LIMIT $1`
)

func readBacklog(ctx context.Context, pool *pgxpool.Pool) ([]ShardStatus, error) {
	rows, err := pool.Query(ctx, backlogSQL)
	if err != nil {
		return nil, fmt.Errorf("read outbox backlog: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (ShardStatus, error) {
		var s ShardStatus
		var age float64
		err := row.Scan(&s.Shard, &s.Backlog, &age)
		s.OldestAge = seconds(age)
		return s, err
	})
	if err != nil {
		return nil, fmt.Errorf("read outbox backlog: %w", err)
	}
	return out, nil
}

// ReadStatus reads the outbox's shards, leases, relays and the newest
// deadLimit dead rows.
func ReadStatus(ctx context.Context, pool *pgxpool.Pool, deadLimit int) (Status, error) {
	var st Status
	shards, err := readBacklog(ctx, pool)
	if err != nil {
		return st, err
	}
	byShard := make(map[int]int, len(shards))
	for i, s := range shards {
		byShard[s.Shard] = i
	}
	rows, err := pool.Query(ctx, leasesSQL)
	if err != nil {
		return st, fmt.Errorf("read leases: %w", err)
	}
	type lease struct {
		shard           int
		owner, instance string
		token           int64
		expires         *float64
	}
	leases, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (lease, error) {
		var l lease
		return l, row.Scan(&l.shard, &l.owner, &l.instance, &l.token, &l.expires)
	})
	if err != nil {
		return st, fmt.Errorf("read leases: %w", err)
	}
	for _, l := range leases {
		i, ok := byShard[l.shard]
		if !ok {
			continue
		}
		s := &shards[i]
		s.Leased = true
		s.Owner, s.Instance, s.Token = l.owner, l.instance, l.token
		if l.expires != nil {
			s.ExpiresIn = seconds(*l.expires)
		} else {
			s.ExpiresIn = -time.Duration(1<<63 - 1)
		}
	}
	st.Shards = shards

	rows, err = pool.Query(ctx, relaysSQL)
	if err != nil {
		return st, fmt.Errorf("read relays: %w", err)
	}
	st.Relays, err = pgx.CollectRows(rows, func(row pgx.CollectableRow) (RelayStatus, error) {
		var r RelayStatus
		var silent float64
		err := row.Scan(&r.Owner, &r.Instance, &r.StartedAt, &silent, &r.Live, &r.Shards)
		r.SilentFor = seconds(silent)
		return r, err
	})
	if err != nil {
		return st, fmt.Errorf("read relays: %w", err)
	}

	if err := pool.QueryRow(ctx, countDeadSQL).Scan(&st.DeadRows); err != nil {
		return st, fmt.Errorf("count dead rows: %w", err)
	}
	if deadLimit > 0 {
		rows, err = pool.Query(ctx, deadSQL, deadLimit)
		if err != nil {
			return st, fmt.Errorf("read dead rows: %w", err)
		}
		st.Dead, err = pgx.CollectRows(rows, func(row pgx.CollectableRow) (DeadRow, error) {
			var d DeadRow
			var key []byte
			err := row.Scan(&d.ID, &d.Shard, &d.Topic, &key, &d.CommandID, &d.Bytes, &d.CreatedAt, &d.DeadAt, &d.Reason, &d.Detail)
			d.Key = string(key)
			return d, err
		})
		if err != nil {
			return st, fmt.Errorf("read dead rows: %w", err)
		}
	}
	return st, nil
}

// Free reports whether nobody holds the shard's lease.
func (s ShardStatus) Free() bool { return s.Owner == "" || s.ExpiresIn <= 0 }

func seconds(f float64) time.Duration { return time.Duration(f * float64(time.Second)) }
