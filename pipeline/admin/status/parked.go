package status

import (
	"context"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/onceflow/onceflow/pipeline/projector"
)

// parkedReader reads the parked and retrying partitions from the database
// at most once per every, whoever asks: /status.json answers anyone who
// reaches the admin address, and a hundred of them polling at once cost
// the two queries once per interval, not a hundred times. The callers
// that come while a reading runs wait for it and share it.
type parkedReader struct {
	pool  *pgxpool.Pool
	every time.Duration

	mu      sync.Mutex // one reading at a time; the others wait for it
	readAt  time.Time  // zero: read at the next call
	reading parkedReading
}

// parkedReading is one reading: each list with the error that kept it
// from being read.
type parkedReading struct {
	parked                 []projector.ParkedPartition
	retrying               []projector.RetryingPartition
	parkedErr, retryingErr error
}

// read returns the parked and retrying partitions, reading them again at
// most once per every.
// The reading is not the caller's: a caller that goes away does not fail
// it for the others.
func (r *parkedReader) read(ctx context.Context) parkedReading {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.readAt.IsZero() || time.Since(r.readAt) >= r.every {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
		var next parkedReading
		next.parked, next.parkedErr = projector.Parked(ctx, r.pool)
		next.retrying, next.retryingErr = projector.Retrying(ctx, r.pool)
		r.reading = next
		cancel()
		r.readAt = time.Now()
	}
	return r.reading
}

// forget makes the next call read: an unpark changed what it would show.
func (r *parkedReader) forget() {
	r.mu.Lock()
	r.readAt = time.Time{}
	r.mu.Unlock()
}
