package projector

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/onceflow/onceflow/pipeline"
	"github.com/onceflow/onceflow/pipeline/pipelinetest"
)

// checked is a batch projection with a CHECK constraint: an event of a
// negative version (which the benchmark makes) violates it.
type checked struct{}

func (checked) Name() string { return "checked" }

func (c checked) Apply(ctx context.Context, tx pgx.Tx, ev pipeline.Event) error {
	out, err := c.ApplyBatch(ctx, tx, []pipeline.Event{ev})
	if err != nil {
		return err
	}
	return out[0]
}

func (checked) ApplyBatch(ctx context.Context, tx pgx.Tx, evs []pipeline.Event) ([]error, error) {
	ids, versions := make([][16]byte, len(evs)), make([]int64, len(evs))
	for i, ev := range evs {
		ids[i], versions[i] = [16]byte(ev.ID), ev.Version
	}
	_, err := tx.Exec(ctx, `INSERT INTO bench_checked (event_id, version) SELECT * FROM unnest($1::uuid[], $2::bigint[])`, ids, versions)
	return make([]error, len(evs)), err
}

// BenchmarkDataError measures one batch's transaction (5,000 events over
// 8 partitions, a batch projection) clean, and with one event in the
// middle that raises a data error: the batch then fails, runs again with
// the projection's events applied one at a time under savepoints to find
// the event, and a third time without the rest of its partition.
func BenchmarkDataError(b *testing.B) {
	const perPartition, partitions = 625, 8
	pool, _ := pipelinetest.Pool(b)
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `CREATE TABLE bench_checked (event_id uuid PRIMARY KEY, version bigint NOT NULL CHECK (version > 0))`); err != nil {
		b.Fatal(err)
	}
	for _, bad := range []bool{false, true} {
		name := "clean"
		if bad {
			name = "one-bad"
		}
		b.Run(name, func(b *testing.B) {
			a := &applier{consumer: "bench-" + name, topic: "events", pool: pool, projections: []pipeline.Projection[pgx.Tx]{checked{}}}
			var from int64
			for b.Loop() {
				b.StopTimer()
				var evs []event
				for p := range int32(partitions) {
					evs = append(evs, tallyEvents(perPartition, p, from)...)
				}
				if bad {
					evs[len(evs)/2+perPartition/2].Version = -1 // the middle of partition 4
				}
				from += perPartition
				b.StartTimer()
				res, err := a.apply(ctx, evs, nil)
				if err != nil {
					b.Fatal(err)
				}
				if want := map[bool]int{false: 0, true: 1}[bad]; len(res.parks) != want {
					b.Fatalf("%d parks, want %d", len(res.parks), want)
				}
			}
			b.ReportMetric(float64(perPartition*partitions)*float64(b.N)/b.Elapsed().Seconds(), "events/s")
		})
	}
}
