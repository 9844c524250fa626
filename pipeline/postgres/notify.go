package postgres

import (
	"context"
	"encoding/hex"
	"errors"
	"log/slog"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/onceflow/onceflow/pipeline"
)

// The channels the components wake each other on
// (docs/decisions/0012-waking-up-without-polling.md). A notification is a
// hint, never the data: a listener reads the tables it cares about when
// woken, and polls as well, slowly, for the notifications a lost connection
// missed.
const (
	// OutboxChannel: ingest committed outbox rows; relays read the heads
	// of the shards the payload names (OutboxPayload's; empty: every
	// shard).
	OutboxChannel = "onceflow_outbox"
	// OutcomesChannel: the projector committed command outcomes; ingest
	// wakes the GET /v1/commands/{id}?wait= of those commands. The payload
	// is OutcomePayloads'.
	OutcomesChannel = "onceflow_outcomes"
)

// maxPayload bounds a notification's payload below Postgres's 8000 bytes.
const maxPayload = 7900

// Notify sends one notification on channel per payload, in one statement
// on its own (not inside the caller's transaction: a transaction that
// notifies takes a lock at commit that serializes every notifying commit
// of the cluster, so the notification follows the commit instead). Its
// transaction commits without waiting for the WAL flush: the lock is held
// until the commit returns, and a notification is a hint that a crash may
// lose anyway.
func Notify(ctx context.Context, pool *pgxpool.Pool, channel string, payloads ...string) error {
	if len(payloads) == 0 {
		payloads = []string{""}
	}
	_, err := pool.Exec(ctx, notifyAloneSQL, channel, payloads)
	return err
}

// NotifySQL notifies channel ($1) once per payload ($2, text[]); in a
// transaction, at its commit.
const NotifySQL = `SELECT pg_notify($1, p) FROM unnest($2::text[]) AS p`

// notifyAloneSQL is NotifySQL as a transaction of its own, committed
// asynchronously.
const notifyAloneSQL = `WITH async AS (
		SELECT set_config('synchronous_commit', 'off', true)
	)
	SELECT pg_notify($1, p) FROM async, unnest($2::text[]) AS p`

// Listen holds one connection that LISTENs on channel and calls notified
// with each notification's payload until ctx ends. It reconnects, backing
// off up to 5 s, whenever the connection is lost, and calls notified("")
// after each (re)connect as well, since notifications sent meanwhile were
// missed. It returns nil when ctx ends.
func Listen(ctx context.Context, pool *pgxpool.Pool, channel string, logger *slog.Logger, notified func(payload string)) error {
	backoff := 50 * time.Millisecond
	for ctx.Err() == nil {
		err := listenOnce(ctx, pool, channel, notified)
		if ctx.Err() != nil {
			return nil
		}
		if logger != nil {
			logger.Warn("notification connection lost; listening again", "channel", channel, "err", err, "backoff", backoff)
		}
		select {
		case <-ctx.Done():
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 5*time.Second)
	}
	return nil
}

func listenOnce(ctx context.Context, pool *pgxpool.Pool, channel string, notified func(string)) error {
	conn, err := pgx.ConnectConfig(ctx, pool.Config().ConnConfig.Copy())
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if _, err := conn.Exec(ctx, "LISTEN "+pgx.Identifier{channel}.Sanitize()); err != nil {
		return err
	}
	notified("")
	for {
		n, err := conn.WaitForNotification(ctx)
		if err != nil {
			return err
		}
		notified(n.Payload)
	}
}

// OutboxPayload is the payload that names the shards a commit wrote
// outbox rows to on OutboxChannel: their numbers in decimal, comma
// separated. Shards that do not fit in one payload make it empty: every
// shard.
func OutboxPayload(shards []int) string {
	var b strings.Builder
	for _, s := range shards {
		if b.Len()+12 > maxPayload {
			return ""
		}
		if b.Len() > 0 {
			b.WriteByte(',')
		}
		b.WriteString(strconv.Itoa(s))
	}
	return b.String()
}

// ParseOutboxPayload reads a payload of OutboxChannel. It returns nil,
// every shard, for an empty payload (a listener that just connected, a
// writer that names no shard) and for one it cannot read whole: a shard
// left out of a wake-up would wait for the relays' next poll.
func ParseOutboxPayload(p string) []int {
	if p == "" {
		return nil
	}
	var shards []int
	for s := range strings.SplitSeq(p, ",") {
		n, err := strconv.Atoi(s)
		if err != nil || n < 0 {
			return nil
		}
		shards = append(shards, n)
	}
	return shards
}

// OutcomePayloads are the payloads that name ids on OutcomesChannel: ids
// in 32 hexadecimal digits, comma separated, as many as fit in a payload.
// Beyond maxPayloads payloads it is one "*": every waiter looks again.
func OutcomePayloads(ids []pipeline.ID) []string {
	const maxPayloads = 16
	var out []string
	var b strings.Builder
	for _, id := range ids {
		if b.Len()+33 > maxPayload {
			out = append(out, b.String())
			b.Reset()
		}
		if b.Len() > 0 {
			b.WriteByte(',')
		}
		b.WriteString(hex.EncodeToString(id[:]))
	}
	if b.Len() > 0 {
		out = append(out, b.String())
	}
	if len(out) > maxPayloads {
		return []string{"*"}
	}
	return out
}

// ErrAllOutcomes is ParseOutcomePayload's answer for a payload that names
// no command in particular ("*", or empty: a listener that just
// connected): every waiter looks again.
var ErrAllOutcomes = errors.New("every outcome")

// ParseOutcomePayload reads a payload of OutcomesChannel; ids it cannot
// read are skipped (a payload is only a hint).
func ParseOutcomePayload(p string) ([]pipeline.ID, error) {
	if p == "" || p == "*" {
		return nil, ErrAllOutcomes
	}
	var ids []pipeline.ID
	for s := range strings.SplitSeq(p, ",") {
		var id pipeline.ID
		if len(s) == 32 {
			if _, err := hex.Decode(id[:], []byte(s)); err == nil {
				ids = append(ids, id)
			}
		}
	}
	return ids, nil
}
