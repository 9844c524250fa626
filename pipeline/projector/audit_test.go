package projector_test

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/onceflow/onceflow/examples/ledger"
	"github.com/onceflow/onceflow/pipeline"
	"github.com/onceflow/onceflow/pipeline/pipelinetest"
	"github.com/onceflow/onceflow/pipeline/projector"
)

// audit_log records each event once, whether a batch goes in with one
// INSERT (a few events) or with COPY (many): an event already recorded
// (the inbox forgot it after its retention) is a duplicate, the others
// are written, in a batch of either size.
func TestAuditLogRecordsEachEventOnce(t *testing.T) {
	t.Parallel()
	for _, n := range []int{3, 100} {
		t.Run(fmt.Sprintf("batch of %d", n), func(t *testing.T) {
			t.Parallel()
			pool, _ := pipelinetest.Pool(t)
			ctx := context.Background()
			s := newStream("acme", "acc")
			evs := make([]pipeline.Event, n)
			for i := range evs {
				evs[i] = s.next(ledger.Deposited{Amount: int64(i + 1)})
			}
			apply := func(batch []pipeline.Event) []error {
				tx, err := pool.Begin(ctx)
				if err != nil {
					t.Fatal(err)
				}
				defer tx.Rollback(ctx)
				out, err := projector.AuditLog{}.ApplyBatch(ctx, tx, batch)
				if err != nil {
					t.Fatal(err)
				}
				if err := tx.Commit(ctx); err != nil {
					t.Fatal(err)
				}
				return out
			}
			if out := apply(evs[:n/2]); len(out) != n/2 || errors.Join(out...) != nil {
				t.Fatalf("first half: %v", out)
			}
			out := apply(evs)
			for i, err := range out {
				if dup := i < n/2; dup != errors.Is(err, pipeline.ErrDuplicate) {
					t.Errorf("event %d: %v, want a duplicate: %v", i, err, dup)
				}
			}
			var rows int
			if err := pool.QueryRow(ctx, `SELECT count(DISTINCT event_id) FROM audit_log`).Scan(&rows); err != nil || rows != n {
				t.Errorf("audit_log: %d events (%v), want %d", rows, err, n)
			}
		})
	}
}
