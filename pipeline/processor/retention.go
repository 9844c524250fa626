package processor

import (
	"context"
	"fmt"
	"math"
	"slices"
	"strconv"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

// checkTopics compares the processor's settings with the configuration of
// the topics it reads and writes, and sizes what it produces to fit them.
//
// The dedup changelog must keep records at least as long as the window:
// otherwise a restore forgets ids inside the window and a duplicate is
// handled twice. That refuses the start.
//
// The producer's batches are kept within the smallest max.message.bytes
// of the topics the processor writes (Kafka's default is 1 MiB). A broker
// refuses a record batch as a whole; with batches that fit every topic, a
// record is refused for its size only when it alone is too large, which
// the client finds before sending, so the command it belongs to is the one
// blamed (learnRefused) and never a neighbour in its batch. Dedup
// changelog records are sized to fit too.
//
// A producer's command dated further back than the commands topic's
// retention and a day is refused (past-timestamp) unless MaxCommandAge
// says otherwise; one the pipeline accepted (accepted-by) is not.
//
// A commands topic that keeps records longer than the window only draws a
// warning: a command re-delivered after its id was forgotten (a consumer
// rewound, a relay re-publish of an old row) is handled twice, but the
// operator may know that nothing re-delivers that late.
func (p *Processor[S]) checkTopics(ctx context.Context, cl *kgo.Client) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	t := p.cfg.Topics
	written := []string{t.Events(), t.State(), t.DLQ(), t.Dedup(), t.Commands()}
	for _, target := range p.serdes.Targets {
		if !slices.Contains(written, target.Topic) {
			written = append(written, target.Topic)
		}
	}
	rcs, err := kadm.NewClient(cl).DescribeTopicConfigs(ctx, written...)
	if err != nil {
		// The session's own errors will say more; the topics were
		// checked by the component's start (kafka.Provision).
		p.logger.Warn("cannot read the topics' configuration to check them", "err", err)
		return nil
	}
	configs := func(topic string) map[string]int64 {
		out := map[string]int64{}
		rc, err := rcs.On(topic, nil)
		if err != nil || rc.Err != nil {
			return out
		}
		for _, c := range rc.Configs {
			if c.Value == nil {
				continue
			}
			if v, err := strconv.ParseInt(*c.Value, 10, 64); err == nil {
				out[c.Key] = v
			}
		}
		return out
	}
	window := p.cfg.DedupWindow
	retention, ok := configs(t.Commands())["retention.ms"]
	if ok && (retention < 0 || time.Duration(retention)*time.Millisecond > window) {
		p.logger.Warn("the dedup window is shorter than the commands topic's retention: a command re-delivered after the window is handled again",
			"dedup_window", window, "topic", t.Commands(), "retention_ms", retention)
	}
	if p.cfg.MaxCommandAge == 0 && ok {
		p.maxCommandAge = commandAge(retention)
	}
	if ms, ok := configs(t.Dedup())["retention.ms"]; ok && ms >= 0 && time.Duration(ms)*time.Millisecond < window {
		return fmt.Errorf("topic %s keeps records %s, less than the dedup window (%s): a restore would forget command ids inside the window; raise its retention.ms",
			t.Dedup(), time.Duration(ms)*time.Millisecond, window)
	}
	limit, smallest := int64(defaultBatchMaxBytes), ""
	for _, topic := range written {
		if max, ok := configs(topic)["max.message.bytes"]; ok && max < limit {
			limit, smallest = max, topic
		}
	}
	if limit < minBatchMaxBytes {
		return fmt.Errorf("topic %s takes records of at most %d bytes; the processor needs at least %d: raise its max.message.bytes",
			smallest, limit, minBatchMaxBytes)
	}
	p.batchMaxBytes = int32(limit)
	p.digestsPerRecord = min(maxDigestsPerRecord, int(limit-batchOverhead)/16)
	return nil
}

// commandAge is the MaxCommandAge a commands topic that keeps records
// retentionMs (-1: forever) makes: its retention and a day, at least
// MinMaxCommandAge; a topic that keeps records forever bounds them at
// the Unix epoch only.
func commandAge(retentionMs int64) time.Duration {
	if retentionMs < 0 || retentionMs > math.MaxInt64/int64(time.Millisecond)-int64(24*time.Hour/time.Millisecond) {
		return math.MaxInt64
	}
	return max(time.Duration(retentionMs)*time.Millisecond+24*time.Hour, MinMaxCommandAge)
}

const (
	// defaultBatchMaxBytes is franz-go's default producer batch limit,
	// which matches Kafka's default message.max.bytes.
	defaultBatchMaxBytes = 1 << 20
	// minBatchMaxBytes is the smallest topic limit the processor runs
	// with: an event, a snapshot or a command of an ordinary domain.
	minBatchMaxBytes = 16 << 10
	// batchOverhead is room for Kafka's record and batch headers around
	// a dedup changelog record.
	batchOverhead = 1024
)
