package natsink

import (
	"context"
	"errors"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/twmb/franz-go/pkg/kgo"
)

// batch is one poll's records on their way to JetStream, in the order
// they were fetched (each partition's in offset order).
type batch struct {
	entries []entry
	unacked int
	// retried: a publish of the batch failed and was tried again, so an
	// aggregate's events may have been stored out of order (checkOrder).
	retried bool
}

type entry struct {
	rec *kgo.Record
	msg *nats.Msg
	ack *jetstream.PubAck // nil until JetStream acknowledged it
}

func (s *Sink) newBatch(records []*kgo.Record) *batch {
	b := &batch{entries: make([]entry, len(records)), unacked: len(records)}
	for i, r := range records {
		m, id, valid := message(r, s.cfg.Subject)
		if !valid {
			s.metrics.positional.Inc()
			s.positional.warn(s.logger, "record without a valid event-id header; published with its position as message id",
				"partition", r.Partition, "offset", r.Offset, "msg_id", id)
		}
		b.entries[i] = entry{rec: r, msg: m}
	}
	return b
}

// forward publishes a batch until JetStream has acknowledged every record
// of it or ctx ends, then commits, per partition, the offsets up to the
// first record not acknowledged. A round that fails is followed by a wait
// (50ms doubling to MaxBackoff) and a round over the records not
// acknowledged, in their order: JetStream down or refusing holds the
// batch and its offsets, and nothing is skipped.
func (s *Sink) forward(ctx context.Context, cl *kgo.Client, js jetstream.JetStream, records []*kgo.Record) {
	start := time.Now()
	b := s.newBatch(records)
	wait := 50 * time.Millisecond
	var failures int
	var since, logged time.Time
	for {
		err := s.publish(ctx, js, b)
		if b.unacked == 0 || ctx.Err() != nil {
			break
		}
		b.retried = true
		if failures++; failures == 1 {
			since = time.Now()
		}
		if time.Since(logged) >= retryLogInterval {
			logged = time.Now()
			s.logger.Warn("publish to jetstream failed; retrying", "class", errorClass(err), "err", err, "failures", failures,
				"since", since, "backoff", wait, "unacked", b.unacked, "records", len(b.entries))
		}
		select {
		case <-ctx.Done():
		case <-time.After(wait):
		}
		if ctx.Err() != nil {
			break
		}
		wait = min(2*wait, s.cfg.MaxBackoff)
	}
	if failures > 0 && b.unacked == 0 {
		s.logger.Info("batch published after retrying", "failures", failures, "since", since)
	}
	if b.retried {
		s.checkOrder(b)
	}
	if b.unacked == 0 && s.cfg.Hold != nil {
		s.cfg.Hold(HoldAcked)
	}
	s.commit(ctx, cl, b)
	s.metrics.batch.Observe(time.Since(start).Seconds())
}

// inflight is a published entry awaiting its acknowledgement.
type inflight struct {
	e *entry
	f jetstream.PubAckFuture
}

// publish is one round: it publishes the entries not yet acknowledged, in
// order, with at most MaxInFlight awaiting their acknowledgement, and
// settles every one it published. It publishes nothing more once one
// failed (the round's error) or ctx ended.
func (s *Sink) publish(ctx context.Context, js jetstream.JetStream, b *batch) error {
	var firstErr error
	queue := make([]inflight, 0, min(s.cfg.MaxInFlight, b.unacked))
	fail := func(err error) {
		s.metrics.errors.WithLabelValues(errorClass(err)).Inc()
		if firstErr == nil {
			firstErr = err
		}
	}
	// settle takes p's outcome, waiting for it if block, and reports
	// whether it took one.
	settle := func(p inflight, block bool) bool {
		okc, errc := p.f.Ok(), p.f.Err()
		if !block {
			select {
			case ack := <-okc:
				s.acked(b, p.e, ack)
			case err := <-errc:
				fail(err)
			default:
				return false
			}
			return true
		}
		select {
		case ack := <-okc:
			s.acked(b, p.e, ack)
		case err := <-errc:
			fail(err)
		}
		return true
	}
	for i := range b.entries {
		e := &b.entries[i]
		if e.ack != nil {
			continue
		}
		for len(queue) >= s.cfg.MaxInFlight {
			settle(queue[0], true)
			queue = queue[1:]
		}
		if firstErr != nil || ctx.Err() != nil {
			break
		}
		f, err := js.PublishMsgAsync(e.msg, s.pubOpts...)
		if err != nil {
			fail(err)
			break
		}
		queue = append(queue, inflight{e, f})
		// Settle what has come back already, so a failure stops the round
		// early.
		for len(queue) > 0 && settle(queue[0], false) {
			queue = queue[1:]
		}
	}
	for _, p := range queue {
		settle(p, true)
	}
	return firstErr
}

// acked records JetStream's acknowledgement of e.
func (s *Sink) acked(b *batch, e *entry, ack *jetstream.PubAck) {
	e.ack = ack
	b.unacked--
	if ack.Duplicate {
		s.metrics.duplicates.Inc()
		return
	}
	s.metrics.published.Inc()
	s.metrics.age.Observe(max(time.Since(e.rec.Timestamp).Seconds(), 0))
}

// checkOrder counts the events stored after a later event of their
// aggregate: in a batch that needed a retry, a publish that failed while
// one behind it was stored lands after it. Without a failure the stream
// takes a connection's messages in the order they were sent, so only
// batches that were retried are checked. A duplicate stored nothing and is
// not counted.
func (s *Sink) checkOrder(b *batch) {
	last := make(map[string]uint64)
	for _, e := range b.entries {
		if e.ack == nil || e.ack.Duplicate {
			continue
		}
		if seq, ok := last[string(e.rec.Key)]; ok && e.ack.Sequence < seq {
			s.metrics.outOfOrder.Inc()
			s.logger.Warn("event stored after a later event of its aggregate (a retried publish)",
				"partition", e.rec.Partition, "offset", e.rec.Offset, "aggregate_id", string(e.rec.Key), "seq", e.ack.Sequence, "after_seq", seq)
			continue
		}
		last[string(e.rec.Key)] = e.ack.Sequence
	}
}

// commit commits each partition's offset past the last record of the
// batch that JetStream acknowledged with every record before it. After a
// shutdown that interrupted the batch, the rest is read again by the next
// owner. A failed commit is logged and counted: the next batch's commit
// covers it, and a record read again is dropped by JetStream as a
// duplicate.
func (s *Sink) commit(ctx context.Context, cl *kgo.Client, b *batch) {
	last := map[int32]*kgo.Record{}
	stopped := map[int32]bool{}
	for _, e := range b.entries {
		p := e.rec.Partition
		switch {
		case stopped[p]:
		case e.ack == nil:
			stopped[p] = true
		default:
			last[p] = e.rec
		}
	}
	if len(last) == 0 {
		return
	}
	recs := make([]*kgo.Record, 0, len(last))
	for _, r := range last {
		recs = append(recs, r)
	}
	// Shutdown commits what was acknowledged too.
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	if err := cl.CommitRecords(cctx, recs...); err != nil {
		s.metrics.commits.WithLabelValues("failed").Inc()
		s.logger.Warn("commit offsets failed; the records are published again by whoever reads them next, and JetStream drops them as duplicates within its window",
			"err", err, "partitions", len(recs))
		return
	}
	s.metrics.commits.WithLabelValues("committed").Inc()
}

// errorClass classifies a failed publish (metrics.go).
func errorClass(err error) string {
	var apiErr *jetstream.APIError
	if errors.As(err, &apiErr) && apiErr.Code != 503 || errors.Is(err, nats.ErrMaxPayload) || errors.Is(err, nats.ErrBadSubject) ||
		errors.Is(err, nats.ErrBadHeaderMsg) || errors.Is(err, nats.ErrHeadersNotSupported) {
		return classRefused
	}
	return classUnavailable
}
