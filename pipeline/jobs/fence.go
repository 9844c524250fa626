package jobs

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivertype"

	"github.com/onceflow/onceflow/pipeline"
	"github.com/onceflow/onceflow/pipeline/postgres"
)

// ErrFenced is Complete's error when the attempt is no longer the job's
// current one: its lease expired and another attempt took the job (or
// finished it). Nothing the attempt wrote in Complete's transaction is
// kept; the worker should return (its outcome is refused too).
var ErrFenced = errors.New("jobs: a later attempt holds the job")

// Output is what a job attempt records as its output
// (river_job.metadata.output): the attempt that wrote it, its fencing
// token, and a short note of what happened (a delivery's status).
type Output struct {
	Attempt int    `json:"onceflow_attempt"`
	Note    string `json:"note,omitempty"`
}

// fence is the worker middleware of every onceflow job: it writes the
// attempt's token into the outcome River will write, maps onceflow's
// control errors onto River's, and counts.
type fence struct {
	river.MiddlewareDefaults
	w *Worker
}

var _ rivertype.WorkerMiddleware = (*fence)(nil)

// noteKey carries the attempt's note from the worker to the middleware.
type noteKey struct{}

// Note sets what the attempt records in its output next to its token
// (e.g. "delivered 200"): visible in `onceflow jobs list`.
func Note(ctx context.Context, note string) {
	if p, ok := ctx.Value(noteKey{}).(*string); ok {
		*p = note
	}
}

func (f *fence) Work(ctx context.Context, job *rivertype.JobRow, doInner func(context.Context) error) (err error) {
	start := time.Now()
	t := token{job.ID, job.Attempt}
	var note string
	defer func() {
		// Deferred so that a panic too carries the token into River's
		// update.
		if oerr := river.RecordOutput(ctx, Output{Attempt: job.Attempt, Note: note}); oerr != nil && err == nil {
			err = oerr
		}
		f.w.metrics.attemptSeconds.WithLabelValues(job.Kind).Observe(time.Since(start).Seconds())
	}()
	err = doInner(context.WithValue(ctx, noteKey{}, &note))
	if err != nil && errors.Is(err, ErrFenced) || f.overran(job, start) && f.w.stale(ctx, t) {
		f.w.metrics.attempts.WithLabelValues(job.Kind, outcomeFenced).Inc()
		f.w.metrics.fenced.WithLabelValues(job.Kind).Inc()
		f.w.logger.Warn("late job attempt: another attempt took the job; its outcome is refused",
			"job_id", job.ID, "kind", job.Kind, "attempt", job.Attempt)
		return err
	}
	var snooze *river.JobSnoozeError
	switch {
	case err == nil:
		f.w.retry.forget(t)
		f.w.metrics.attempts.WithLabelValues(job.Kind, outcomeCompleted).Inc()
		return nil
	case errors.As(err, &snooze):
		f.w.metrics.attempts.WithLabelValues(job.Kind, outcomeSnoozed).Inc()
		return err
	case pipeline.IsPermanent(err):
		f.w.metrics.attempts.WithLabelValues(job.Kind, outcomeDead).Inc()
		f.w.metrics.dead.WithLabelValues(job.Kind, "permanent").Inc()
		return river.JobCancel(err)
	case job.Attempt >= job.MaxAttempts:
		f.w.metrics.attempts.WithLabelValues(job.Kind, outcomeDead).Inc()
		f.w.metrics.dead.WithLabelValues(job.Kind, "attempts").Inc()
		f.w.logger.Warn("job out of attempts: discarded with its errors", "job_id", job.ID, "kind", job.Kind,
			"attempts", job.Attempt, "err", err)
		return err
	}
	if d, ok := pipeline.AsRetryAfter(err); ok {
		f.w.retry.ask(t, d)
	}
	f.w.metrics.attempts.WithLabelValues(job.Kind, outcomeRetry).Inc()
	return err
}

// overran says whether the attempt ran long enough that its lease may
// have expired (only then can another attempt have taken the job; the
// check costs a query, so fast attempts skip it).
func (f *fence) overran(job *rivertype.JobRow, start time.Time) bool {
	began := start
	if job.AttemptedAt != nil && job.AttemptedAt.Before(began) {
		began = *job.AttemptedAt
	}
	return time.Since(began) >= f.w.cfg.Lease*9/10
}

const currentAttemptSQL = `SELECT attempt, state = 'running' FROM river_job WHERE id = $1`

// stale reads whether t is no longer its job's running attempt.
func (w *Worker) stale(ctx context.Context, t token) bool {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	var attempt int
	var running bool
	if err := w.pool.QueryRow(ctx, currentAttemptSQL, t.id).Scan(&attempt, &running); err != nil {
		return errors.Is(err, pgx.ErrNoRows) // another error: cannot tell, the trigger still fences
	}
	return attempt != t.attempt || !running
}

// Fence is an SQL condition that holds only while attempt (the
// placeholders jobParam and attemptParam, e.g. 6 and 4 for $6 and $4) is
// its job's running attempt, and locks the job's row for the statement's
// transaction. A write guarded by it (UPDATE ... WHERE ... AND Fence(6, 4))
// is made by the attempt only while it holds the job, in one round trip;
// River's completer then completes the job in its batch (and the trigger
// fences that too). Complete and Record are the same in a transaction of
// their own.
func Fence(jobParam, attemptParam int) string {
	return fmt.Sprintf(`EXISTS (SELECT 1 FROM river_job WHERE id = $%d AND attempt = $%d AND state = 'running' FOR UPDATE)`, jobParam, attemptParam)
}

const lockAttemptSQL = `SELECT attempt, state = 'running' FROM river_job WHERE id = $1 FOR UPDATE`

// Complete runs fn and completes job in one transaction of pool, fenced:
// it first locks the job's row and checks that job's attempt is still the
// running one, else returns ErrFenced without running fn. What fn writes
// (the effect's record) and the completion commit together, so an attempt
// that was taken over writes nothing. Call it from a River worker's Work;
// on success Work returns nil.
func Complete[T river.JobArgs](ctx context.Context, pool *pgxpool.Pool, job *river.Job[T], fn func(pgx.Tx) error) error {
	return fenced(ctx, pool, job, nil, fn, true)
}

// CompleteScoped is Complete in a transaction scoped to tenant
// (postgres.TenantSetting): with row-level security, fn sees and writes
// that tenant's rows only, whatever its statements say. A domain's job
// completes so, as its event's tenant (Tenant).
func CompleteScoped[T river.JobArgs](ctx context.Context, pool *pgxpool.Pool, job *river.Job[T], tenant string, fn func(pgx.Tx) error) error {
	// An empty tenant scopes to none: the policy shows it no row.
	return fenced(ctx, pool, job, &tenant, fn, true)
}

// Record runs fn in a transaction of pool fenced like Complete's, without
// completing the job: what a failed attempt writes (its error in a
// delivery's log) before it returns the error.
func Record[T river.JobArgs](ctx context.Context, pool *pgxpool.Pool, job *river.Job[T], fn func(pgx.Tx) error) error {
	return fenced(ctx, pool, job, nil, fn, false)
}

// scopeSQL scopes a transaction to a tenant (postgres.TenantSetting).
const scopeSQL = `SELECT set_config('` + postgres.TenantSetting + `', $1, true)`

// fenced runs fn fenced by job's attempt; a non-nil tenant scopes the
// transaction to it, nil leaves the pool's scope (postgres.AllTenants).
func fenced[T river.JobArgs](ctx context.Context, pool *pgxpool.Pool, job *river.Job[T], tenant *string, fn func(pgx.Tx) error, complete bool) error {
	// The token rides in the completion's own update too (the trigger).
	if err := river.RecordOutput(ctx, Output{Attempt: job.Attempt}); err != nil {
		return err
	}
	return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		var attempt int
		var running bool
		if err := tx.QueryRow(ctx, lockAttemptSQL, job.ID).Scan(&attempt, &running); err != nil {
			if errors.Is(err, pgx.ErrNoRows) {
				return ErrFenced
			}
			return fmt.Errorf("lock job %d: %w", job.ID, err)
		}
		if attempt != job.Attempt || !running {
			return ErrFenced
		}
		if tenant != nil {
			if _, err := tx.Exec(ctx, scopeSQL, *tenant); err != nil {
				return fmt.Errorf("scope job %d to its tenant: %w", job.ID, err)
			}
		}
		if fn != nil {
			if err := fn(tx); err != nil {
				return err
			}
		}
		if !complete {
			return nil
		}
		// The completion writes the output as recorded now: with the note
		// fn set (Note), which the middleware's later record cannot reach.
		if p, ok := ctx.Value(noteKey{}).(*string); ok && *p != "" {
			if err := river.RecordOutput(ctx, Output{Attempt: job.Attempt, Note: *p}); err != nil {
				return err
			}
		}
		if _, err := river.JobCompleteTx[*riverpgxv5.Driver](ctx, tx, job); err != nil {
			return fmt.Errorf("complete job %d: %w", job.ID, err)
		}
		return nil
	})
}
