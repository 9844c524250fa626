package processor

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/onceflow/onceflow/pipeline/kafka"
)

// A batch on the commands topic that decompresses beyond the consumer's
// bound (kafka.Config.MaxDecompressBatchBytes) cannot be read: its records
// cannot even be told apart, let alone sent to the DLQ one by one. The
// consumer stops the partition there (franz-go fetches it no more). The
// processor reports it — onceflow_processor_blocked_partitions, an error
// in the log, Blocked for the status page, `onceflow lag` finds it too —
// and waits for an operator: either the batch is a legitimate producer's
// and the bound is raised (a restart reads it), or it is skipped on
// purpose (SkipBatch), which moves the partition past it in a transaction
// that also writes a DLQ record naming the batch's offsets, who skipped
// it and why (reason batch-too-large).

// blockedPollInterval is how often a processor with a blocked partition
// looks for an operator's skip.
const blockedPollInterval = time.Second

// ErrNotBlocked is SkipBatch's error for a partition this processor does
// not hold blocked at that offset.
var ErrNotBlocked = errors.New("processor: this processor holds no partition blocked at that offset")

type skipRequest struct {
	topic          string
	partition      int32
	offset         int64
	note, operator string
	done           chan skipResult
}

type skipResult struct {
	to  int64
	err error
}

func (p *Processor[S]) hasBlocked() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.blocked) > 0
}

// block records a partition stopped at a batch too large to decompress,
// and says so once.
func (p *Processor[S]) block(tl *kgo.ErrDecompressTooLarge) {
	p.mu.Lock()
	_, known := p.blocked[tl.Partition]
	p.blocked[tl.Partition] = tl
	p.updateGaugesLocked()
	p.mu.Unlock()
	if !known {
		p.logger.Error("partition blocked: a batch decompresses beyond KAFKA_MAX_DECOMPRESS_BATCH_BYTES; raise it if the batch is a legitimate producer's, or skip it (onceflow commands skip-batch, or POST /status/skip-batch; recorded in the DLQ)",
			"topic", tl.Topic, "partition", tl.Partition, "offset", tl.Offset, "next_offset", tl.NextOffset)
	}
}

// Blocked returns the partitions this processor holds blocked.
func (p *Processor[S]) Blocked() []kafka.BlockedPartition {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]kafka.BlockedPartition, 0, len(p.blocked))
	for _, tl := range p.blocked {
		out = append(out, kafka.BlockedPartition{Group: p.cfg.Group, Topic: tl.Topic, Partition: tl.Partition, Offset: tl.Offset, NextOffset: tl.NextOffset})
	}
	return out
}

// SkipBatch skips, on an operator's say-so, the batch at offset of a
// commands partition this processor holds blocked: the partition moves
// past the batch in a transaction that writes its DLQ record (reason
// batch-too-large, the batch's offsets, operator and note in its detail).
// It returns the offset the partition goes on from, or ErrNotBlocked.
func (p *Processor[S]) SkipBatch(ctx context.Context, topic string, partition int32, offset int64, note, operator string) (int64, error) {
	if note == "" || operator == "" {
		return 0, errors.New("processor: a skip needs a note (why) and an operator (who)")
	}
	if topic != p.commands {
		return 0, fmt.Errorf("%w: %s is not %s", ErrNotBlocked, topic, p.commands)
	}
	// Answered here when nothing is blocked there: the session's loop
	// takes requests only after a poll, which an idle processor with no
	// partition blocked does not cut short. serveSkips checks again.
	p.mu.Lock()
	tl := p.blocked[partition]
	p.mu.Unlock()
	if tl == nil || tl.Offset != offset {
		return 0, fmt.Errorf("%w: partition %d at %d", ErrNotBlocked, partition, offset)
	}
	req := skipRequest{topic: topic, partition: partition, offset: offset, note: note, operator: operator, done: make(chan skipResult, 1)}
	select {
	case p.skips <- req:
	case <-ctx.Done():
		return 0, ctx.Err()
	}
	select {
	case r := <-req.done:
		return r.to, r.err
	case <-ctx.Done():
		return 0, ctx.Err() // it may still be done: Blocked tells
	}
}

// serveSkips runs the skips operators asked for, on the session's
// goroutine after the poll's records were handled (SetOffsets must run
// where the poll does, and a skip's transaction commits the offsets of
// everything polled: none may be left undecided). It reports whether it
// committed one; an error ends the session.
func (p *Processor[S]) serveSkips(ctx context.Context, sess *kgo.GroupTransactSession) (bool, error) {
	committed := false
	for {
		var req skipRequest
		select {
		case req = <-p.skips:
		default:
			return committed, nil
		}
		p.mu.Lock()
		tl := p.blocked[req.partition]
		p.mu.Unlock()
		if tl == nil || tl.Offset != req.offset {
			req.done <- skipResult{err: fmt.Errorf("%w: partition %d at %d", ErrNotBlocked, req.partition, req.offset)}
			continue
		}
		ok, err := p.skipBatch(ctx, sess, tl, req)
		if err != nil {
			req.done <- skipResult{err: err}
			return committed, err
		}
		if !ok {
			req.done <- skipResult{err: errors.New("processor: the skip's transaction aborted; nothing was skipped, try again")}
			continue
		}
		committed = true
		req.done <- skipResult{to: tl.NextOffset}
	}
}

func (p *Processor[S]) skipBatch(ctx context.Context, sess *kgo.GroupTransactSession, tl *kgo.ErrDecompressTooLarge, req skipRequest) (bool, error) {
	// The new offset rides in the transaction's offset commit: SetOffsets
	// marks it as the partition's uncommitted offset.
	sess.Client().SetOffsets(map[string]map[int32]kgo.EpochOffset{tl.Topic: {tl.Partition: {Epoch: tl.Epoch, Offset: tl.NextOffset}}})
	if err := sess.Begin(); err != nil {
		return false, &errSession{err: fmt.Errorf("begin transaction: %w", err)}
	}
	now := time.Now()
	detail := truncate(fmt.Sprintf("the batch at offsets %d to %d decompresses beyond KAFKA_MAX_DECOMPRESS_BATCH_BYTES; skipped by %s: %s",
		tl.Offset, tl.NextOffset-1, req.operator, req.note), maxDetailBytes)
	src := &kgo.Record{Topic: tl.Topic, Partition: tl.Partition, Offset: tl.Offset}
	rec := deadLetterRecord(p.dlq, src, ReasonBatchTooLarge, detail, now, int(p.batchMaxBytes)-batchOverhead)
	// Nothing of the batch could be read: the copy holds none of it, and
	// a redrive refuses it, naming where it was.
	rec.Headers = append(rec.Headers,
		kgo.RecordHeader{Key: HeaderDLQOmitted, Value: []byte("value,headers,key")},
		kgo.RecordHeader{Key: HeaderDLQSkippedTo, Value: []byte(strconv.FormatInt(tl.NextOffset, 10))})
	txCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), p.cfg.TransactionTimeout)
	defer cancel()
	produceErr := sess.Client().ProduceSync(txCtx, rec).FirstErr()
	committed, err := sess.End(txCtx, kgo.TransactionEndTry(produceErr == nil))
	if err != nil {
		p.metrics.transactions.WithLabelValues("unknown").Inc()
		return false, &errSession{err: fmt.Errorf("end transaction: %w", err)}
	}
	if !committed {
		p.metrics.transactions.WithLabelValues("aborted").Inc()
		// The offset set goes back to the committed one with the abort:
		// the partition stays blocked.
		p.logger.Warn("the skip's transaction aborted; the partition stays blocked", "partition", tl.Partition, "err", produceErr)
		return false, nil
	}
	p.metrics.transactions.WithLabelValues("committed").Inc()
	p.metrics.dlq.WithLabelValues(ReasonBatchTooLarge).Inc()
	p.mu.Lock()
	delete(p.blocked, tl.Partition)
	p.updateGaugesLocked()
	p.mu.Unlock()
	p.logger.Warn("batch skipped by an operator; its DLQ record says so", "topic", tl.Topic, "partition", tl.Partition,
		"offset", tl.Offset, "next_offset", tl.NextOffset, "operator", req.operator, "note", req.note)
	return true, nil
}

// HeaderDLQSkippedTo, on a batch-too-large DLQ record, is the offset the
// operator's skip moved its partition to: the batch spans from
// dlq-source-offset up to it.
const HeaderDLQSkippedTo = "dlq-skipped-to"
