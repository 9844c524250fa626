package processor

import (
	"context"
	"strconv"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

// checkRetention warns when the dedup window is shorter than the commands
// topic keeps records: a command re-delivered (a consumer rewound, a relay
// re-publish of an old row) after its id was forgotten is handled twice.
// It only warns: the operator may know that nothing re-delivers that late.
func (p *Processor[S]) checkRetention(ctx context.Context, cl *kgo.Client) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	topic := p.cfg.Topics.Commands()
	rcs, err := kadm.NewClient(cl).DescribeTopicConfigs(ctx, topic)
	if err != nil {
		return
	}
	rc, err := rcs.On(topic, nil)
	if err != nil || rc.Err != nil {
		return
	}
	for _, c := range rc.Configs {
		if c.Key != "retention.ms" || c.Value == nil {
			continue
		}
		ms, err := strconv.ParseInt(*c.Value, 10, 64)
		if err != nil {
			return
		}
		if ms < 0 || time.Duration(ms)*time.Millisecond > p.cfg.DedupWindow {
			p.logger.Warn("the dedup window is shorter than the commands topic's retention: a command re-delivered after the window is handled again",
				"dedup_window", p.cfg.DedupWindow, "topic", topic, "retention_ms", ms)
		}
	}
}
