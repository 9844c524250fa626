package projector

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/onceflow/onceflow/pipeline/kafka"
)

// LagSource is a projector consumer for lag measurement: its offsets are
// the ones stored in Postgres (those in Kafka are a copy for monitoring and
// may trail them after a crash).
func LagSource(pool *pgxpool.Pool, consumer, topic string) kafka.LagSource {
	return kafka.LagSource{
		Group:  consumer,
		Topics: []string{topic},
		Offsets: func(ctx context.Context) (map[string]map[int32]int64, error) {
			return StoredOffsets(ctx, pool, consumer)
		},
		Elsewhere: func(ctx context.Context) (map[string]map[int32]bool, error) {
			return foreignOffsets(ctx, pool, consumer)
		},
	}
}

// foreignOffsets are the partitions of a consumer parked because their
// stored offset counts another log (topic-changed).
func foreignOffsets(ctx context.Context, pool *pgxpool.Pool, consumer string) (map[string]map[int32]bool, error) {
	rows, err := pool.Query(ctx, `SELECT topic, partition FROM projector_parked WHERE consumer = $1 AND reason = $2`, consumer, reasonTopicChanged)
	if err != nil {
		return nil, fmt.Errorf("read parked partitions: %w", err)
	}
	out := map[string]map[int32]bool{}
	var topic string
	var part int32
	_, err = pgx.ForEachRow(rows, []any{&topic, &part}, func() error {
		if out[topic] == nil {
			out[topic] = map[int32]bool{}
		}
		out[topic][part] = true
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("read parked partitions: %w", err)
	}
	return out, nil
}

// StoredOffsets returns a consumer's offsets by topic and partition.
func StoredOffsets(ctx context.Context, pool *pgxpool.Pool, consumer string) (map[string]map[int32]int64, error) {
	rows, err := pool.Query(ctx, `SELECT topic, partition, next_offset FROM consumer_offsets WHERE consumer = $1`, consumer)
	if err != nil {
		return nil, fmt.Errorf("read stored offsets: %w", err)
	}
	out := map[string]map[int32]int64{}
	var topic string
	var part int32
	var off int64
	_, err = pgx.ForEachRow(rows, []any{&topic, &part, &off}, func() error {
		if out[topic] == nil {
			out[topic] = map[int32]int64{}
		}
		out[topic][part] = off
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("read stored offsets: %w", err)
	}
	return out, nil
}

// Consumers returns the consumers that store offsets for topic (projectors
// and rebuilds).
func Consumers(ctx context.Context, pool *pgxpool.Pool, topic string) ([]string, error) {
	rows, err := pool.Query(ctx, `SELECT DISTINCT consumer FROM consumer_offsets WHERE topic = $1 ORDER BY consumer`, topic)
	if err != nil {
		return nil, fmt.Errorf("list consumers: %w", err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("list consumers: %w", err)
	}
	return out, nil
}

// ParkedPartition is a partition a projector stopped on.
type ParkedPartition struct {
	Consumer  string    `json:"consumer"`
	Topic     string    `json:"topic"`
	Partition int32     `json:"partition"`
	Offset    int64     `json:"offset"` // of the record it stopped on
	Reason    string    `json:"reason"`
	Detail    string    `json:"detail"`
	Since     time.Time `json:"since"`
}

// Parked lists the parked partitions of every consumer.
func Parked(ctx context.Context, pool *pgxpool.Pool) ([]ParkedPartition, error) {
	return list(ctx, pool, "list parked partitions", `SELECT consumer, topic, partition, next_offset, reason, detail, parked_at
		FROM projector_parked ORDER BY consumer, topic, partition`,
		func(p *ParkedPartition) []any {
			return []any{&p.Consumer, &p.Topic, &p.Partition, &p.Offset, &p.Reason, &p.Detail, &p.Since}
		})
}

// RetryingPartition is a partition whose batch a projector is retrying
// on a transient error (projector_retrying).
type RetryingPartition struct {
	Consumer  string    `json:"consumer"`
	Topic     string    `json:"topic"`
	Partition int32     `json:"partition"`
	Class     string    `json:"class"` // connection, serialization, deadlock, schema, ... (docs/projector.md)
	Error     string    `json:"error"` // the last one logged
	Attempts  int64     `json:"attempts"`
	Since     time.Time `json:"since"`
	LastAt    time.Time `json:"last_at"`
}

// Retrying lists the partitions every consumer is retrying.
func Retrying(ctx context.Context, pool *pgxpool.Pool) ([]RetryingPartition, error) {
	return list(ctx, pool, "list retrying partitions", `SELECT consumer, topic, partition, class, error, attempts, since, last_at
		FROM projector_retrying ORDER BY consumer, topic, partition`,
		func(r *RetryingPartition) []any {
			return []any{&r.Consumer, &r.Topic, &r.Partition, &r.Class, &r.Error, &r.Attempts, &r.Since, &r.LastAt}
		})
}

// list reads the rows of query, each into a T through the pointers to its
// fields that fields gives (nil when there are none); what names the list
// in its errors.
func list[T any](ctx context.Context, pool *pgxpool.Pool, what, query string, fields func(*T) []any) ([]T, error) {
	rows, err := pool.Query(ctx, query)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	var out []T
	var v T
	_, err = pgx.ForEachRow(rows, fields(&v), func() error {
		out = append(out, v)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	return out, nil
}

// Unpark removes a consumer's parked-partition rows (all of its partitions
// when partitions is empty) and returns how many it removed. The projector
// that owns a partition notices within ParkCheckInterval and tries its
// record again. A partition parked for its stored offset (topic-changed,
// offset-out-of-range) stays parked: trying again would read that offset
// of another log; Reset is the answer.
func Unpark(ctx context.Context, pool *pgxpool.Pool, consumer, topic string, partitions []int32) (int64, error) {
	if partitions == nil {
		partitions = []int32{} // NULL would match nothing
	}
	tag, err := pool.Exec(ctx, `DELETE FROM projector_parked WHERE consumer = $1 AND topic = $2
		AND (cardinality($3::int[]) = 0 OR partition = ANY ($3::int[]))
		AND reason NOT IN ('topic-changed', 'offset-out-of-range')`, consumer, topic, partitions)
	if err != nil {
		return 0, fmt.Errorf("unpark: %w", err)
	}
	return tag.RowsAffected(), nil
}

// LagSource is this projector's lag source (offsets stored in Postgres).
func (p *Projector) LagSource() kafka.LagSource {
	return LagSource(p.pool, p.cfg.Consumer, p.cfg.Topic)
}
