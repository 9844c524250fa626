package processor

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// ErrReplaced is what Run returns when another process has taken this
// instance's transactional id: two processes run with one instance id
// (ONCEFLOW_INSTANCE_ID), or this one was a zombie, paused while its
// supervisor started its successor.
var ErrReplaced = errors.New("replaced by another process with the same instance id")

// producerEpoch is a producer id and epoch of this instance's
// transactional id.
type producerEpoch struct {
	id    int64
	epoch int16
}

// producerOf returns the producer id and epoch a session's client holds,
// nil if it never had one. A producer id that failed with a recoverable
// error is re-initialized from its epoch first (KIP-360), which the
// coordinator refuses if another producer has initialized the
// transactional id since.
func producerOf(ctx context.Context, cl *kgo.Client) *producerEpoch {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	id, epoch, _ := cl.ProducerID(ctx)
	if id < 0 || epoch < 0 || ctx.Err() != nil {
		return nil
	}
	return &producerEpoch{id, epoch}
}

// checkNotReplaced asks the transaction coordinator, before a new session
// initializes the transactional id afresh (which fences whoever holds
// it), whether the ended session's producer still holds it: an
// InitProducerId carrying the producer's id and epoch (KIP-360). Apache
// Kafka accepts it when nobody else initialized the id since — after this
// producer's own transaction timed out, or an EndTxn whose answer was
// lost, too — and answers PRODUCER_FENCED when another producer did:
// then a second process runs with this instance id, and starting a
// session would fence it, which would fence this one back, the two taking
// turns forever. This one leaves instead (ErrReplaced), for its
// supervisor. The accepted InitProducerId bumps the epoch, as the new
// session's does anyway.
//
// The check runs right before the new session's early initialization
// (fencePredecessor), after the backoff, so a successor has as little
// time as can be to take the id between them; a successor that does is
// fenced by this session, and learns it at its own next check, so one of
// the two leaves. The successor's own early initialization is what fences
// the replaced process in the first place.
//
// The embedded broker (kfake) accepts any epoch not above its own, so there
// the check never finds a successor, and the replaced process's next session
// fences its successor in turn
// (docs/decisions/0018-processor-sessions-and-fencing.md). A check that
// cannot be made (the coordinator unreachable) does not stop the new session:
// it is logged.
func (p *Processor[S]) checkNotReplaced(ctx context.Context, cl *kgo.Client, prev *producerEpoch) error {
	if prev == nil {
		return nil
	}
	txnID := p.cfg.TransactionalID()
	req := kmsg.NewPtrInitProducerIDRequest()
	req.TransactionalID = &txnID
	req.TransactionTimeoutMillis = int32(p.cfg.TransactionTimeout.Milliseconds())
	req.ProducerID, req.ProducerEpoch = prev.id, prev.epoch
	ctx, cancel := context.WithTimeout(ctx, max(2*p.cfg.TransactionTimeout, 10*time.Second))
	defer cancel()
	for {
		resp, err := req.RequestWith(ctx, cl)
		if err == nil {
			err = kerr.ErrorForCode(resp.ErrorCode)
		}
		switch {
		case err == nil:
			return nil
		case errors.Is(err, kerr.ProducerFenced):
			p.logger.Error("another process runs with this instance id: leaving", "transactional_id", txnID,
				"producer_id", prev.id, "producer_epoch", prev.epoch, "err", err)
			return fmt.Errorf("%w: the transaction coordinator refuses this process's producer %d (epoch %d) of transactional id %s: another process with instance id %q has initialized it since (%v): this one was replaced while paused or cut off, or two processes run with one instance id, and each must have its own (ONCEFLOW_INSTANCE_ID)",
				ErrReplaced, prev.id, prev.epoch, txnID, p.cfg.InstanceID, err)
		case errors.Is(err, kerr.ConcurrentTransactions) && ctx.Err() == nil:
			// The coordinator is still ending the old transaction.
			select {
			case <-ctx.Done():
			case <-time.After(100 * time.Millisecond):
			}
		default:
			p.logger.Warn("could not check whether another process took this instance id; starting a new session",
				"transactional_id", txnID, "err", err)
			return nil
		}
	}
}
