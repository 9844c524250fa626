package processor

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

// checkTopics compares the dedup window with the topics' configuration.
//
// The dedup changelog must keep records at least as long as the window,
// and take records as large as the processor writes: otherwise a restore
// forgets ids inside the window (a duplicate is then handled twice) or
// every transaction fails. Either refuses the start.
//
// A commands topic that keeps records longer than the window only draws a
// warning: a command re-delivered after its id was forgotten (a consumer
// rewound, a relay re-publish of an old row) is handled twice, but the
// operator may know that nothing re-delivers that late.
func (p *Processor[S]) checkTopics(ctx context.Context, cl *kgo.Client) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	commands, dedup := p.cfg.Topics.Commands(), p.cfg.Topics.Dedup()
	rcs, err := kadm.NewClient(cl).DescribeTopicConfigs(ctx, commands, dedup)
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
	if ms, ok := configs(commands)["retention.ms"]; ok && (ms < 0 || time.Duration(ms)*time.Millisecond > window) {
		p.logger.Warn("the dedup window is shorter than the commands topic's retention: a command re-delivered after the window is handled again",
			"dedup_window", window, "topic", commands, "retention_ms", ms)
	}
	dc := configs(dedup)
	if ms, ok := dc["retention.ms"]; ok && ms >= 0 && time.Duration(ms)*time.Millisecond < window {
		return fmt.Errorf("topic %s keeps records %s, less than the dedup window (%s): a restore would forget command ids inside the window; raise its retention.ms",
			dedup, time.Duration(ms)*time.Millisecond, window)
	}
	if max, ok := dc["max.message.bytes"]; ok && max < dedupRecordMaxBytes {
		return fmt.Errorf("topic %s takes records of at most %d bytes, the processor writes up to %d: raise its max.message.bytes",
			dedup, max, dedupRecordMaxBytes)
	}
	return nil
}

// dedupRecordMaxBytes is the largest dedup changelog record batch the
// processor writes, with room for Kafka's record and batch overhead.
const dedupRecordMaxBytes = 1 + 16*maxDigestsPerRecord + 1024
