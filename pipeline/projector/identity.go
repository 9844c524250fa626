package projector

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/onceflow/onceflow/pipeline/kafka"
	"github.com/onceflow/onceflow/pipeline/postgres"
)

// A stored offset counts one log: the topic of that name on the cluster it
// was read from, as they were then (docs/projector.md#a-topic-that-changed).
// consumer_offsets keeps that identity (cluster id, topic id) beside each
// offset. The projector compares it with the topic's when it is assigned
// partitions, and again whenever a fetch says the log is not what the
// offset expects (offset out of range, unknown topic id): an offset of
// another log is never read from, nor waited at.

// Park reasons of a stored offset that does not fit the log it is about to
// read (docs/projector.md#a-topic-that-changed).
const (
	// reasonTopicChanged: the offset was stored against another cluster or
	// another topic of the same name (deleted and created again, restored,
	// another broker): it counts another log.
	reasonTopicChanged = "topic-changed"
	// reasonOutOfRange: the offset, stored against this very topic, is past
	// its log's end (the log lost records: a truncated or restored log) or
	// before its start (retention deleted records not yet applied).
	reasonOutOfRange = "offset-out-of-range"
)

// resettable are the reasons an operator answers with `onceflow
// projections reset`, not unpark or skip: the stored offset itself is
// what is wrong.
func resettable(reason string) bool {
	return reason == reasonTopicChanged || reason == reasonOutOfRange
}

// storedOffset is a partition's row of consumer_offsets.
type storedOffset struct {
	offset int64
	// identity it was stored against; nil when none was recorded (a row
	// written before the identity was kept).
	identity *kafka.TopicIdentity
}

// identityArgs are an identity as consumer_offsets' cluster_id and
// topic_id (NULL for a topic id the brokers did not report).
func identityArgs(id kafka.TopicIdentity) (string, pgtype.UUID) {
	return id.ClusterID, pgtype.UUID{Bytes: id.TopicID, Valid: id.TopicID != [16]byte{}}
}

// scanIdentity is the identity of a row's cluster_id and topic_id, nil
// when none was recorded.
func scanIdentity(cluster *string, topicID pgtype.UUID) *kafka.TopicIdentity {
	if cluster == nil {
		return nil
	}
	id := &kafka.TopicIdentity{ClusterID: *cluster}
	if topicID.Valid {
		id.TopicID = topicID.Bytes
	}
	return id
}

// judge says whether a partition's stored offset may be read from on the
// topic as it is now (cur, and the partition's log): nil when it may; a
// park when it counts another log (another cluster or topic id) or lies
// outside this one. adopt: the offset recorded no identity and lies within
// the log, so it is taken to be this log's (a row written before the
// identity was kept, at its first start).
func judge(topic string, part int32, s storedOffset, cur kafka.TopicIdentity, log kafka.LogRange) (pk *park, adopt bool) {
	switch {
	case s.identity != nil && s.identity.Differs(cur):
		return &park{partition: part, offset: s.offset, reason: reasonTopicChanged,
			detail: fmt.Sprintf("offset %d was stored against %s; %s is now %s (partition %d's log: %d to %d): the offset counts another log."+
				" Nothing is read until an operator chooses where to start: onceflow projections reset -from start|OFFSET",
				s.offset, *s.identity, topic, cur, part, log.Start, log.End)}, false
	case s.offset > log.End:
		return &park{partition: part, offset: s.offset, reason: reasonOutOfRange,
			detail: fmt.Sprintf("stored offset %d is past the end of partition %d's log (%d to %d) on %s%s: the log lost records (truncated, restored) or the offset is another log's."+
				" Nothing is read until an operator chooses where to start: onceflow projections reset -from start|OFFSET",
				s.offset, part, log.Start, log.End, cur, recordedText(s))}, false
	case s.offset < log.Start:
		return &park{partition: part, offset: s.offset, reason: reasonOutOfRange,
			detail: fmt.Sprintf("stored offset %d is before the start of partition %d's log (%d to %d) on %s%s: records not yet applied were deleted (retention) or the offset is another log's."+
				" Nothing is read until an operator chooses where to start: onceflow projections reset -from start|OFFSET",
				s.offset, part, log.Start, log.End, cur, recordedText(s))}, false
	}
	return nil, s.identity == nil
}

func recordedText(s storedOffset) string {
	if s.identity == nil {
		return " (the offset recorded no identity: stored before onceflow kept it)"
	}
	return ""
}

// identityHolder is the identity of the topic an applier's offsets count:
// new offset rows record it. Unset, they record none (and are judged at
// the next start as rows written before identities were kept).
type identityHolder struct {
	mu sync.Mutex
	id *kafka.TopicIdentity
}

func (h *identityHolder) set(id kafka.TopicIdentity) {
	h.mu.Lock()
	h.id = &id
	h.mu.Unlock()
}

// args are the identity as lockOffsetsSQL's cluster_id and topic_id.
func (h *identityHolder) args() (*string, pgtype.UUID) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.id == nil {
		return nil, pgtype.UUID{}
	}
	c, t := identityArgs(*h.id)
	return &c, t
}

const (
	loadStoredSQL = `SELECT partition, next_offset, cluster_id, topic_id FROM consumer_offsets WHERE consumer = $1 AND topic = $2`
	// adoptIdentitySQL records the identity of offsets that had none.
	adoptIdentitySQL = `UPDATE consumer_offsets SET cluster_id = $4, topic_id = $5
		WHERE consumer = $1 AND topic = $2 AND partition = ANY ($3::int[]) AND cluster_id IS NULL`
	// parkStoredSQL parks a partition at its stored offset (whatever it
	// is now) for a reason of the offset itself; a partition parked for
	// the same reason keeps its time.
	parkStoredSQL = `INSERT INTO projector_parked AS p (consumer, topic, partition, next_offset, reason, detail)
		SELECT consumer, topic, partition, next_offset, $4, $5 FROM consumer_offsets
		WHERE consumer = $1 AND topic = $2 AND partition = $3
		ON CONFLICT (consumer, topic, partition) DO UPDATE SET
			next_offset = EXCLUDED.next_offset, reason = EXCLUDED.reason, detail = EXCLUDED.detail, skip_to = NULL,
			parked_at = CASE WHEN p.reason = EXCLUDED.reason THEN p.parked_at ELSE now() END`
)

// loadStored reads a consumer's stored offsets of topic, with the identity
// each was stored against.
func loadStored(ctx context.Context, pool *pgxpool.Pool, consumer, topic string) (map[int32]storedOffset, error) {
	rows, err := pool.Query(ctx, loadStoredSQL, consumer, topic)
	if err != nil {
		return nil, err
	}
	return scanStored(rows)
}

// scanStored reads rows of partition, next_offset, cluster_id, topic_id.
func scanStored(rows pgx.Rows) (map[int32]storedOffset, error) {
	out := map[int32]storedOffset{}
	var part int32
	var off int64
	var cluster *string
	var topicID pgtype.UUID
	_, err := pgx.ForEachRow(rows, []any{&part, &off, &cluster, &topicID}, func() error {
		out[part] = storedOffset{offset: off, identity: scanIdentity(cluster, topicID)}
		return nil
	})
	return out, err
}

// settle records what judging the stored offsets found: the identity of
// the offsets that had none and lie within their log (adopt), and the
// parks of those that do not fit the log.
func settle(ctx context.Context, pool *pgxpool.Pool, consumer, topic string, cur kafka.TopicIdentity, adopt []int32, parks []park) error {
	return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if len(adopt) > 0 {
			c, t := identityArgs(cur)
			if _, err := tx.Exec(ctx, adoptIdentitySQL, consumer, topic, adopt, c, t); err != nil {
				return fmt.Errorf("record the identity of stored offsets: %w", err)
			}
		}
		for _, pk := range parks {
			if _, err := tx.Exec(ctx, parkStoredSQL, consumer, topic, pk.partition, pk.reason, cleanText(pk.detail)); err != nil {
				return fmt.Errorf("park partition %d: %w", pk.partition, err)
			}
		}
		return nil
	})
}

// describeTopic is the topic's identity and logs, asked of the cluster
// until it answers or ctx ends: nothing is read before the stored offsets
// are compared with them.
func (p *Projector) describeTopic(ctx context.Context, cl *kgo.Client) (kafka.TopicIdentity, map[int32]kafka.LogRange, error) {
	wait := 50 * time.Millisecond
	for {
		id, logs, err := kafka.DescribeTopic(ctx, cl, p.cfg.Topic)
		if err == nil {
			return id, logs, nil
		}
		if ctx.Err() != nil {
			return id, nil, ctx.Err()
		}
		p.logger.Warn("describe the events topic to check the stored offsets: retrying", "err", err)
		select {
		case <-ctx.Done():
			return id, nil, ctx.Err()
		case <-time.After(wait):
		}
		wait = backoff(wait, p.cfg.MaxBackoff)
	}
}

// checkAssigned judges the stored offsets of the partitions just assigned
// (parts) against the topic as it is now, records the identity of those
// that had none, parks those that do not fit their log, and returns the
// parks. Postgres unavailable is retried, as loading the offsets is.
func (p *Projector) checkAssigned(ctx context.Context, stored map[int32]storedOffset, parts []int32) ([]park, error) {
	cur, logs, err := p.describeTopic(ctx, p.admin)
	if err != nil {
		return nil, err
	}
	p.app.identity.set(cur)
	var adopt []int32
	var parks []park
	for _, part := range parts {
		s, ok := stored[part]
		if !ok {
			continue // starts at the log start; its row records cur
		}
		pk, ad := judge(p.cfg.Topic, part, s, cur, logs[part])
		if pk != nil {
			parks = append(parks, *pk)
		} else if ad {
			adopt = append(adopt, part)
		}
	}
	if len(adopt) == 0 && len(parks) == 0 {
		return nil, nil
	}
	wait := 50 * time.Millisecond
	for {
		err := settle(ctx, p.pool, p.cfg.Consumer, p.cfg.Topic, cur, adopt, parks)
		if err == nil {
			break
		}
		if !postgres.IsUnavailable(err) || ctx.Err() != nil {
			return nil, err
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(wait):
		}
		wait = backoff(wait, p.cfg.MaxBackoff)
	}
	if len(adopt) > 0 {
		p.logger.Info("stored offsets recorded no topic identity and lie within their logs: recorded the topic's", "partitions", adopt, "identity", cur.String())
	}
	return parks, nil
}

// errTopicChanged ends a consumer client whose topic changed under it (the
// topic was deleted and created again): the client keeps the old topic id
// and would never read the new log, so the projector joins again with a
// new one, which judges every stored offset against the new topic.
var errTopicChanged = errors.New("projector: the events topic changed under the consumer")

// recheck answers fetch errors that say the log is not what the stored
// offset expects (offset out of range, unknown topic id) on parts: a topic
// that changed (another identity than the one the offsets were judged
// against) ends the client (errTopicChanged); an offset outside its log
// parks the partition; an offset within it (the error was the consumer's
// position's, not the stored offset's) is read from again.
func (p *Projector) recheck(ctx context.Context, cl *kgo.Client, parts []int32) error {
	cur, logs, err := p.describeTopic(ctx, p.admin)
	if err != nil {
		return nil // ctx ended
	}
	if held := p.app.identity.get(); held != nil && held.Differs(cur) {
		p.logger.Error("the events topic changed under the projector (deleted and created again?): joining again to check every stored offset",
			"was", held.String(), "now", cur.String())
		return errTopicChanged
	}
	stored, err := loadStored(ctx, p.pool, p.cfg.Consumer, p.cfg.Topic)
	if err != nil {
		p.logger.Warn("read stored offsets after a fetch error", "err", err)
		return nil // the fetch fails again, and this runs again
	}
	var parks []park
	for _, part := range parts {
		s := stored[part]
		pk, _ := judge(p.cfg.Topic, part, s, cur, logs[part])
		if pk == nil {
			cl.SetOffsets(map[string]map[int32]kgo.EpochOffset{p.cfg.Topic: {part: {Epoch: -1, Offset: s.offset}}})
			continue
		}
		parks = append(parks, *pk)
	}
	if len(parks) == 0 {
		return nil
	}
	if err := settle(ctx, p.pool, p.cfg.Consumer, p.cfg.Topic, cur, nil, parks); err != nil {
		p.logger.Warn("park partitions whose stored offset is out of their log: retrying", "err", err)
		for _, pk := range parks {
			cl.SetOffsets(map[string]map[int32]kgo.EpochOffset{p.cfg.Topic: {pk.partition: {Epoch: -1, Offset: pk.offset}}}) // fails again
		}
		return nil
	}
	for _, pk := range parks {
		p.park(cl, pk)
	}
	return nil
}

func (h *identityHolder) get() *kafka.TopicIdentity {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.id
}

// checkIdentity refuses a rebuild whose stored offsets, or the live
// projector's, count another log than the topic's now (cur, logs): the
// rebuild would resume at another log's offsets, or never reach the live
// ones. The rows it creates record cur.
func (b *builder) checkIdentity(ctx context.Context, cur kafka.TopicIdentity, logs map[int32]kafka.LogRange) error {
	for _, c := range []struct{ consumer, whose, fix string }{
		{b.st.shadowConsumer, "this rebuild's", "run it again with -restart"},
		{b.cfg.Consumer, "the live projector's", "answer its parked partitions first (onceflow lag, onceflow projections reset)"},
	} {
		stored, err := loadStored(ctx, b.Rebuild.live, c.consumer, b.cfg.Topic)
		if err != nil {
			return fmt.Errorf("read %s offsets: %w", c.whose, err)
		}
		for part, s := range stored {
			if pk, _ := judge(b.cfg.Topic, part, s, cur, logs[part]); pk != nil {
				return fmt.Errorf("%s offset of partition %d does not fit the topic (%s: %s): %s", c.whose, part, pk.reason, pk.detail, c.fix)
			}
		}
	}
	b.app.identity.set(cur)
	return nil
}
