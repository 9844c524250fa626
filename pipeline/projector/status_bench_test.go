package projector

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/onceflow/onceflow/examples/ledger"
	"github.com/onceflow/onceflow/pipeline"
	"github.com/onceflow/onceflow/pipeline/pipelinetest"
)

// BenchmarkDerivedCommands prices what command_status adds to a batch
// whose decisions sent commands (recordDerivedSQL, in the batch's last
// round trip): the projector's transaction (the offsets' lock, the inbox,
// command_status, the offsets) over batches of transfer debits, each
// event naming the credit it sent (derived) or not (plain, as every event
// was before the header), alternated in blocks of 100 batches (plain,
// derived, derived, plain, three times); the medians of the blocks' time
// per batch, for a batch of 1 event (a modest rate) and of 100.
func BenchmarkDerivedCommands(b *testing.B) {
	pool, _ := pipelinetest.Pool(b)
	ctx := context.Background()
	for _, size := range []int{1, 100} {
		b.Run(fmt.Sprintf("batch-%d", size), func(b *testing.B) {
			a := &applier{consumer: fmt.Sprintf("bench-%d", size), topic: "events", pool: pool, asyncCommit: true,
				projections: []pipeline.Projection[pgx.Tx]{CommandStatus{}}}
			var offset int64
			batch := func(derived bool) []event {
				evs := make([]event, size)
				for i := range evs {
					cmd := pipeline.NewCommandID()
					ev := pipeline.Event{ID: pipeline.EventID("acme/a", cmd, 0), CommandID: cmd, CommandType: "RequestTransfer", Tenant: "acme",
						AggregateID: "acme/a", Version: offset + 1, Time: time.Now(), Payload: ledger.TransferDebited{TransferID: "t", To: "b", Amount: 1}}
					if derived {
						ev.Derived = []pipeline.CommandRef{{ID: ledger.CreditCommandID("acme/a", cmd, "t"), AggregateID: "acme/b", Type: "CreditTransfer"}}
					}
					evs[i] = event{Event: ev, partition: 0, offset: offset, epoch: -1}
					offset++
				}
				return evs
			}
			const block = 100
			times := map[bool][]float64{}
			for b.Loop() {
				for i := range 12 {
					derived := i%4 == 1 || i%4 == 2
					evs := make([][]event, block)
					for j := range evs {
						evs[j] = batch(derived)
					}
					start := time.Now()
					for _, e := range evs {
						if _, err := a.apply(ctx, e, nil); err != nil {
							b.Fatal(err)
						}
					}
					times[derived] = append(times[derived], float64(time.Since(start).Microseconds())/block)
				}
			}
			median := func(v []float64) float64 {
				s := slices.Clone(v)
				slices.Sort(s)
				return s[len(s)/2]
			}
			b.ReportMetric(median(times[false]), "plain_us/batch")
			b.ReportMetric(median(times[true]), "derived_us/batch")
			b.ReportMetric(0, "ns/op")
		})
	}
}
