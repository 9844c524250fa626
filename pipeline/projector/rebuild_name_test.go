package projector

import (
	"testing"
	"time"
)

// Two rebuilds of a projection started within one second run under two
// consumer names: `projections rebuild` twice in a row failed with a
// duplicate key in projection_rebuilds when the first took less than a
// second (the docs check ran the pages' two rebuilds so).
func TestShadowConsumerUniqueWithinASecond(t *testing.T) {
	at := time.Date(2026, 12, 3, 14, 17, 40, 100_000_000, time.UTC)
	a, b := shadowConsumer("onceflow-projector", "accounts", at), shadowConsumer("onceflow-projector", "accounts", at.Add(time.Millisecond))
	if a == b {
		t.Errorf("two rebuilds a millisecond apart are both %s", a)
	}
}
