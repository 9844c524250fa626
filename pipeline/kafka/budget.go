package kafka

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"

	"github.com/twmb/franz-go/pkg/kgo"
)

// A decompression budget bounds what a consumer decompresses between two
// polls, whatever the number of batches (docs/security.md, "many small
// bombs"). MaxDecompressBatchBytes bounds one batch, but franz-go
// decompresses every batch of a fetch before the poll returns it: a zstd
// batch of 15 MiB of zeros is under 2 KiB on the wire, so one partition's
// fetch of 1 MiB could hold some 600 of them, 9 GiB.
//
// The budget counts the bytes its client decompressed since the client's
// last poll began (HookPollStart: by then the consumer is done with the
// records of the poll before). A batch past the budget is not
// decompressed: franz-go then returns the partition's records up to that
// batch and fetches the rest again after the next poll, or, when the batch
// is the partition's first in this fetch, an error the consumer takes as
// "later" (OverBudget) and the same fetch again after the next poll. Each
// broker's connection buffers one fetch at a time, so a consumer holds at
// most about (brokers + 1) budgets of decompressed records, and a batch
// alone always fits (the budget is at least the bound of one batch).
type budget struct {
	inner kgo.Decompressor // bounded at MaxDecompressBatchBytes a batch
	limit int64
	used  atomic.Int64
}

// errOverBudget is what a batch past the budget fails with. It is not
// kgo.ErrMaxDecompress, which would stop the partition for good.
var errOverBudget = errors.New("kafka: decompression budget of this poll spent; the batch is fetched again after the next poll")

// OverBudget reports whether a fetch error is a batch left for after the
// next poll because the poll's decompression budget was spent: not a
// failure, and not worth a warning.
func OverBudget(err error) bool { return errors.Is(err, errOverBudget) }

func (b *budget) Decompress(src []byte, codec kgo.CompressionCodecType) ([]byte, error) {
	if codec == kgo.CodecNone {
		return src, nil
	}
	if b.used.Load() >= b.limit {
		return nil, errOverBudget
	}
	out, err := b.inner.Decompress(src, codec)
	if err != nil {
		return nil, err
	}
	if b.used.Add(int64(len(out))) > b.limit {
		b.used.Add(-int64(len(out)))
		return nil, errOverBudget
	}
	return out, nil
}

// OnPollStart starts a new budget: the consumer is done with what it
// polled before (kgo.HookPollStart).
func (b *budget) OnPollStart(context.Context) { b.used.Store(0) }

// readBudget is a budget of its own for a fetch response read by hand
// (ReadPartition, BlockedBatch, the lag's fetches), which reads each
// response's records before it fetches again.
func (b *budget) readBudget() *budget {
	return &budget{inner: b.inner, limit: b.limit}
}

var (
	boundedMu sync.Mutex
	bounded   = map[int]kgo.Decompressor{}
)

// boundedDecompressor is franz-go's own decompressor bounded at max bytes
// a batch. franz-go builds it only inside a client's configuration
// (kgo.MaxDecompressBatchBytes), so one client that never connects is
// made, per bound, to take it from; it is safe for concurrent use and
// kept for every later client with the same bound.
func boundedDecompressor(max int) (kgo.Decompressor, error) {
	boundedMu.Lock()
	defer boundedMu.Unlock()
	if d, ok := bounded[max]; ok {
		return d, nil
	}
	cl, err := kgo.NewClient(kgo.MaxDecompressBatchBytes(max))
	if err != nil {
		return nil, err
	}
	defer cl.Close()
	d, ok := cl.OptValue(kgo.WithDecompressor).(kgo.Decompressor)
	if !ok || d == nil {
		return nil, errors.New("kafka: franz-go's client has no decompressor")
	}
	bounded[max] = d
	return d, nil
}
