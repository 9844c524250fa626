package avro

// Exported for the black-box tests.
var ErrPanicked = errPanicked

const MaxBlockCount = maxBlockCount
