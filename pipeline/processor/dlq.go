package processor

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/onceflow/onceflow/pipeline"
	"github.com/onceflow/onceflow/pipeline/kafka"
)

// DeadLetter is one record of {prefix}.commands.dlq: the poison command as
// it arrived (key, value, headers, timestamp) and why it was set aside.
type DeadLetter struct {
	Partition int32     // in the DLQ
	Offset    int64     // in the DLQ
	Time      time.Time // the command's record timestamp
	Key       []byte
	Value     []byte
	Headers   []kgo.RecordHeader // the command's own headers, without the dlq-* ones

	Reason          string
	Detail          string
	SourceTopic     string
	SourcePartition int32
	SourceOffset    int64
	// Omitted lists what the DLQ copy left out because it did not fit in
	// a record the DLQ topic takes ("value", "headers", "key"); the
	// original is at the source coordinates while the commands topic
	// keeps it.
	Omitted []string
}

// Coordinates names the record as `onceflow dlq` does: "partition:offset".
func (d DeadLetter) Coordinates() string { return fmt.Sprintf("%d:%d", d.Partition, d.Offset) }

// Header returns one of the command's headers.
func (d DeadLetter) Header(key string) string {
	for _, h := range d.Headers {
		if h.Key == key {
			return string(h.Value)
		}
	}
	return ""
}

// ReadDLQ reads every committed record of the DLQ topic, from the start of
// each partition to its end, in partition and offset order.
func ReadDLQ(ctx context.Context, cl *kgo.Client, topic string) ([]DeadLetter, error) {
	recs, err := kafka.ReadTopic(ctx, cl, topic, true)
	if err != nil {
		return nil, err
	}
	out := make([]DeadLetter, len(recs))
	for i, r := range recs {
		out[i] = DeadLetterOf(r)
	}
	return out, nil
}

// DeadLetterOf reads a record of the DLQ topic.
func DeadLetterOf(r *kgo.Record) DeadLetter {
	d := DeadLetter{Partition: r.Partition, Offset: r.Offset, Time: r.Timestamp, Key: r.Key, Value: r.Value}
	for _, h := range r.Headers {
		switch h.Key {
		case pipeline.HeaderDLQReason:
			d.Reason = string(h.Value)
		case HeaderDLQDetail:
			d.Detail = string(h.Value)
		case pipeline.HeaderDLQSourceTopic:
			d.SourceTopic = string(h.Value)
		case pipeline.HeaderDLQSourcePartition:
			p, _ := strconv.ParseInt(string(h.Value), 10, 32)
			d.SourcePartition = int32(p)
		case pipeline.HeaderDLQSourceOffset:
			d.SourceOffset, _ = strconv.ParseInt(string(h.Value), 10, 64)
		case HeaderDLQOmitted:
			d.Omitted = strings.Split(string(h.Value), ",")
		default:
			if !strings.HasPrefix(h.Key, "dlq-") {
				d.Headers = append(d.Headers, h)
			}
		}
	}
	return d
}

// ErrIncomplete is Redrive's error for a dead letter whose copy left a
// part of the command out (Omitted).
var ErrIncomplete = errors.New("the DLQ copy left part of the command out")

// RedriveRedateAge is the age beyond which a redriven dead letter is dated
// when it is redriven rather than with its own time: the processor refuses
// commands older than MaxCommandAge (past-timestamp), at least twice this.
const RedriveRedateAge = 24 * time.Hour

// Redrive returns the record that republishes the dead letter to the
// commands topic: the original key, value, headers (its command id among
// them, so a command that was in fact handled meanwhile is recognized) and
// timestamp (the command's time), unless that time is more than
// RedriveRedateAge before now: then it is dated now, the operator's
// decision to run it now, which the processor's MaxCommandAge lets
// through. It is produced with the default key partitioner, so it lands
// on its aggregate's partition. A dead letter whose copy omitted a part
// cannot be redriven: the error says where the original was.
func (d DeadLetter) Redrive(commandsTopic string, now time.Time) (*kgo.Record, error) {
	if len(d.Omitted) > 0 {
		return nil, fmt.Errorf("%w (%s): the original is at %s/%d@%d while that topic keeps it", ErrIncomplete,
			strings.Join(d.Omitted, ", "), d.SourceTopic, d.SourcePartition, d.SourceOffset)
	}
	at := d.Time
	if now.Sub(at) > RedriveRedateAge {
		at = now
	}
	return &kgo.Record{
		Topic: commandsTopic, Key: d.Key, Value: d.Value, Timestamp: at,
		Headers: append([]kgo.RecordHeader(nil), d.Headers...),
	}, nil
}

// deadLetterRecord is r as it goes to the DLQ: key, value and headers as
// they came, plus the reason headers, at time at (r's, unless that was
// ahead of the processor's clock).
//
// The copy fits in limit bytes (the producer's batch limit, less room for
// Kafka's own headers). Brokers check a batch's size compressed, so a
// producer's record can be far larger than the topic's limit; the
// processor's producer refuses a record larger than its batch limit
// before sending, and a refused DLQ record would abort the transaction
// it is in, every time it is tried. What does not fit is left out, in this order: the
// value, the command's headers, the key; the dlq-omitted header lists
// what was, and the source coordinates still name the original while the
// commands topic keeps it.
func deadLetterRecord(topic string, r *kgo.Record, reason, detail string, at time.Time, limit int) *kgo.Record {
	key, value, own := r.Key, r.Value, r.Headers
	headers := []kgo.RecordHeader{
		{Key: pipeline.HeaderDLQReason, Value: []byte(reason)},
		{Key: HeaderDLQDetail, Value: []byte(detail)},
		{Key: pipeline.HeaderDLQSourceTopic, Value: []byte(r.Topic)},
		{Key: pipeline.HeaderDLQSourcePartition, Value: []byte(strconv.Itoa(int(r.Partition)))},
		{Key: pipeline.HeaderDLQSourceOffset, Value: []byte(strconv.FormatInt(r.Offset, 10))},
	}
	size := len(key) + len(value) + headersSize(own) + headersSize(headers) + len(HeaderDLQOmitted) + len("value,headers,key")
	var omitted []string
	if size > limit {
		size -= len(value)
		value = nil
		omitted = append(omitted, "value")
	}
	if size > limit {
		size -= headersSize(own)
		own = nil
		omitted = append(omitted, "headers")
	}
	if size > limit {
		key = nil
		omitted = append(omitted, "key")
	}
	if len(omitted) > 0 {
		headers = append(headers, kgo.RecordHeader{Key: HeaderDLQOmitted, Value: []byte(strings.Join(omitted, ","))})
	}
	return &kgo.Record{Topic: topic, Key: key, Value: value, Headers: append(append([]kgo.RecordHeader(nil), own...), headers...), Timestamp: at}
}

// HeaderDLQOmitted lists the parts of a poison record its DLQ copy leaves
// out because they do not fit in a record the DLQ topic takes: value,
// headers, key (deadLetterRecord).
const HeaderDLQOmitted = "dlq-omitted"

func headersSize(hs []kgo.RecordHeader) int {
	n := 0
	for _, h := range hs {
		n += len(h.Key) + len(h.Value)
	}
	return n
}
