package processor

import (
	"context"
	"fmt"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// sessionAtLeastOnce runs the same batches without transactions: records
// are produced by an idempotent producer, flushed, and only then are the
// input offsets committed. A crash between the two repeats a batch (and
// its events) downstream. It exists as the baseline of the throughput
// benchmark, so the price of exactly-once is measured against the same
// deciders, serdes and snapshots; it is not offered as a mode.
func (p *Processor[S]) sessionAtLeastOnce(ctx context.Context, restoreCl *kgo.Client) (committed bool, err error) {
	opts, err := p.consumerOpts(restoreCl)
	if err != nil {
		return false, err
	}
	cl, err := kgo.NewClient(append(opts, kgo.DisableAutoCommit())...)
	if err != nil {
		return false, fmt.Errorf("processor client: %w", err)
	}
	defer cl.Close()
	for {
		fetches := cl.PollRecords(ctx, p.cfg.MaxPollRecords)
		if ctx.Err() != nil || fetches.IsClientClosed() {
			cl.AllowRebalance()
			return committed, nil
		}
		p.logFetchErrors(fetches)
		if fetches.NumRecords() == 0 {
			cl.AllowRebalance()
			continue
		}
		start := time.Now()
		b := newBatch(p, context.WithoutCancel(ctx), cl, &kgo.FirstErrPromise{})
		for _, r := range fetches.Records() {
			b.handle(r)
		}
		if b.failed == nil {
			b.snapshot()
		}
		if err := b.promise.Err(); err != nil {
			cl.AllowRebalance()
			return committed, fmt.Errorf("produce: %w", err)
		}
		commitStart := time.Now()
		err := cl.CommitUncommittedOffsets(context.WithoutCancel(ctx))
		p.metrics.commit.Observe(time.Since(commitStart).Seconds())
		if err != nil {
			cl.AllowRebalance()
			return committed, fmt.Errorf("commit offsets: %w", err)
		}
		p.metrics.batch.Observe(time.Since(start).Seconds())
		b.commit()
		committed = true
		cl.AllowRebalance()
	}
}
