package relay

import (
	"context"

	"github.com/twmb/franz-go/pkg/kgo"
)

// SetHooks stops a relay at the moments fencing is about: beforeProduce
// runs after the lease check and before producing a batch, afterCommit
// after the Kafka commit and before the delete, beforeKeep before each
// round of the lease keeper (blocking it is a relay that stopped renewing).
func SetHooks(r *Relay, beforeProduce, afterCommit func(shard int), beforeKeep func()) {
	r.hooks = hooks{beforeProduce: beforeProduce, afterCommit: afterCommit, beforeKeep: beforeKeep}
}

// SetBeforeCommit stops a relay after its batch was produced (and acked)
// and before its Kafka transaction commits.
func SetBeforeCommit(r *Relay, f func(shard int)) { r.hooks.beforeCommit = f }

// AwaitPartitions is the check before a batch's commit that the producer
// sees the partitions it wrote to (shard.go, awaitPartitions).
func (r *Relay) AwaitPartitions(ctx context.Context, cl *kgo.Client, recs []kgo.Record) error {
	return r.awaitPartitions(ctx, cl, recs)
}

// SetClientOpts gives the producer of each shard more options (a test's
// hooks and partitioner).
func SetClientOpts(r *Relay, f func(shard int) []kgo.Opt) { r.hooks.clientOpts = f }
