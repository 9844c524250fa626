package processor

import (
	"fmt"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/onceflow/onceflow/pipeline"
)

// CommandRecord returns a command as the processor expects to find it on the
// commands topic (docs/architecture.md#topics-keys-and-headers), for any
// producer of commands: the key is the aggregate id ("tenant/local-id"), the
// value the encoded command (Confluent-framed Avro of the topic's schema), the
// headers command-id, tenant (the aggregate id's tenant), command-type and,
// when given, traceparent. The record timestamp is the command's time, which
// deciders and the dedup window use; a zero at leaves it to the client (now).
// Produce it with the default (murmur2) key partitioner.
func CommandRecord(topic, aggregateID string, id pipeline.ID, commandType string, value []byte, at time.Time, traceparent string) (*kgo.Record, error) {
	tenant, _, err := pipeline.SplitAggregateID(aggregateID)
	if err != nil {
		return nil, err
	}
	if id.IsZero() {
		return nil, fmt.Errorf("command for %s: the command id is required", aggregateID)
	}
	rec := &kgo.Record{
		Topic: topic, Key: []byte(aggregateID), Value: value, Timestamp: at,
		Headers: []kgo.RecordHeader{
			{Key: pipeline.HeaderCommandID, Value: []byte(id.String())},
			{Key: pipeline.HeaderTenant, Value: []byte(tenant)},
			{Key: pipeline.HeaderCommandType, Value: []byte(commandType)},
		},
	}
	if traceparent != "" {
		rec.Headers = append(rec.Headers, kgo.RecordHeader{Key: pipeline.HeaderTraceparent, Value: []byte(traceparent)})
	}
	return rec, nil
}
