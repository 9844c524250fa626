package postgres_test

import (
	"errors"
	"slices"
	"testing"

	"github.com/onceflow/onceflow/pipeline"
	"github.com/onceflow/onceflow/pipeline/postgres"
)

// Outcome payloads name every id, each under Postgres's payload limit;
// too many ids are "*" (every waiter looks again), and what a payload
// names reads back.
func TestOutcomePayloads(t *testing.T) {
	for _, n := range []int{1, 239, 240, 1000, 3800, 5000} {
		ids := make([]pipeline.ID, n)
		for i := range ids {
			ids[i] = pipeline.NewCommandID()
		}
		payloads := postgres.OutcomePayloads(ids)
		var got []pipeline.ID
		for _, p := range payloads {
			if len(p) >= 8000 {
				t.Fatalf("%d ids: a payload of %d bytes, over Postgres's 8000", n, len(p))
			}
			part, err := postgres.ParseOutcomePayload(p)
			if errors.Is(err, postgres.ErrAllOutcomes) {
				got = nil
				if len(payloads) != 1 {
					t.Fatalf("%d ids: \"*\" among %d payloads", n, len(payloads))
				}
				break
			}
			got = append(got, part...)
		}
		if got != nil && !slices.Equal(got, ids) {
			t.Errorf("%d ids: read back %d of them", n, len(got))
		}
		if got == nil && n < 3000 {
			t.Errorf("%d ids: answered \"*\", want them named", n)
		}
	}
	if _, err := postgres.ParseOutcomePayload(""); !errors.Is(err, postgres.ErrAllOutcomes) {
		t.Errorf("an empty payload (a fresh connection): %v, want ErrAllOutcomes", err)
	}
	if ids, err := postgres.ParseOutcomePayload("zz,0123"); err != nil || len(ids) != 0 {
		t.Errorf("garbage: %v, %v; want nothing named", ids, err)
	}
}
