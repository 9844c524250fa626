package pipeline

// StageAgeBuckets are the upper bounds, in seconds, of the histograms of a
// command's or event's age when each component finishes with it (ingest's
// commit, the relay's acknowledgement, the processor's commit, the
// projector's commit; docs/architecture.md#observability), the same at
// every stage so the stages compare.
var StageAgeBuckets = []float64{.0005, .001, .002, .005, .01, .02, .05, .1, .2, .5, 1, 2, 5, 10, 30, 60}
