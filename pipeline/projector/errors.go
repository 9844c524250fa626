package projector

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/onceflow/onceflow/pipeline"
	"github.com/onceflow/onceflow/pipeline/postgres"
)

// dataError returns the Postgres error in err's chain if it is a data error:
// SQLSTATE class 22 (data exception: a number out of range, text too long for
// its column, invalid input, a character the encoding refuses), 23 (integrity
// constraint violation: check, not-null, unique, foreign key, exclusion) or
// 54 (program limit exceeded: an index row too large, a statement too
// complex). The same event written by the same statement into the same tables
// raises it again every time, so retrying cannot fix it: the event's
// partition parks (docs/decisions/0029-projection-errors-classified.md).
// Every other error (the connection, a serialization failure, a deadlock, a
// shutdown, a missing table) is transient and the batch is retried.
func dataError(err error) (*pgconn.PgError, bool) {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || len(pgErr.Code) != 5 {
		return nil, false
	}
	switch pgErr.Code[:2] {
	case "22", "23", "54":
		return pgErr, true
	}
	return nil, false
}

// projectionError is a projection's failure of a batch: only its data
// errors, not those of the runtime's own statements, park an event.
type projectionError struct {
	name string
	err  error
}

func (e *projectionError) Error() string { return e.name + ": " + e.err.Error() }
func (e *projectionError) Unwrap() error { return e.err }

// isProjectionDataError reports whether err is a data error raised by a
// projection's SQL (rather than the runtime's own statements or the
// commit, which no event can be blamed for).
func isProjectionDataError(err error) bool {
	var pe *projectionError
	if !errors.As(err, &pe) {
		return false
	}
	_, ok := dataError(pe.err)
	return ok
}

// unknownErrorDetail is the park detail of an error of no known kind that
// failed the event's batch tries times.
func unknownErrorDetail(projection string, e event, err error, tries int) string {
	return fmt.Sprintf("%s: %s event %s (aggregate %s, version %d): %v (failed %d tries; an error of no known kind is taken as the event's)",
		projection, e.Type(), e.ID, e.AggregateID, e.Version, err, tries)
}

// dataErrorDetail is a data error's park detail: the projection, the event
// and Postgres's error, so `onceflow lag` says what to fix without a look
// at the logs.
func dataErrorDetail(projection string, e event, pgErr *pgconn.PgError) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s: %s event %s (aggregate %s, version %d): SQLSTATE %s: %s",
		projection, e.Type(), e.ID, e.AggregateID, e.Version, pgErr.Code, pgErr.Message)
	var where []string
	for _, f := range []struct{ name, value string }{
		{"table", pgErr.TableName}, {"column", pgErr.ColumnName}, {"constraint", pgErr.ConstraintName},
	} {
		if f.value != "" && !strings.Contains(pgErr.Message, `"`+f.value+`"`) {
			where = append(where, f.name+" "+f.value)
		}
	}
	if len(where) > 0 {
		b.WriteString(" (" + strings.Join(where, ", ") + ")")
	}
	return b.String()
}

// maxDetail bounds what a park or retry row stores of an error.
const maxDetail = 2000

// cleanText makes s storable in a text column: valid UTF-8, no NUL (an
// aggregate id or an error can carry what a producer put in a record key;
// Postgres would refuse it, and the row that tells the operator why a
// partition stopped must not fail to be written), at most maxDetail bytes.
func cleanText(s string) string {
	s = strings.ToValidUTF8(s, "\uFFFD")
	s = strings.ReplaceAll(s, "\x00", `\x00`)
	if len(s) > maxDetail {
		cut := maxDetail
		for cut > 0 && !utf8.RuneStart(s[cut]) {
			cut--
		}
		s = s[:cut] + "…"
	}
	return s
}

// Classes of the transient errors a batch is retried on, the class label
// of onceflow_projector_batch_errors_total and
// onceflow_projector_retrying_partitions (a fixed set: the label stays
// bounded).
const (
	classConnection    = "connection"    // unreachable, connection lost, too many connections (08, 53300)
	classShutdown      = "shutdown"      // the server is shutting down or restarting (57P01-57P03)
	classSerialization = "serialization" // serialization failure and other transaction rollbacks (40)
	classDeadlock      = "deadlock"      // 40P01
	classLockTimeout   = "lock-timeout"  // lock_timeout (55P03)
	classCanceled      = "canceled"      // statement_timeout or a cancel request (57014)
	classResources     = "resources"     // out of memory or disk (53)
	classSchema        = "schema"        // a missing table or column, a syntax error: a projection and the schema disagree (42)
	classData          = "data"          // a data error no event can be blamed for (a deferred constraint at commit)
	classPostgres      = "postgres"      // any other SQLSTATE
	classRegistry      = "registry"      // the schema registry could not be reached
	classOther         = "other"
)

var retryClasses = []string{classConnection, classShutdown, classSerialization, classDeadlock, classLockTimeout,
	classCanceled, classResources, classSchema, classData, classPostgres, classRegistry, classOther}

// errRegistry marks a batch that failed because its records could not be
// decoded for a reason that is not theirs (the registry is unreachable).
var errRegistry = errors.New("schema registry")

// errorKind is what a projection's error means for its batch (classify).
type errorKind int

const (
	// transient: the cause passes (the connection, a serialization
	// failure, a deploy ahead of its migration): retried with backoff for
	// as long as it lasts, counted by class, the partitions shown as
	// retrying and alerted after a bound (OnceflowProjectorRetrying).
	transient errorKind = iota
	// permanent: the same event fails the same way every time (a data
	// error, pipeline.Permanent, a version gap): its partition parks on it.
	permanent
	// unknown: neither is known (a projection's own Go error, a SQLSTATE
	// of no class above): retried Config.MaxUnknownFailures times, then
	// taken as permanent (reasonProjectionError), never retried for ever.
	unknown
)

func (k errorKind) String() string {
	switch k {
	case transient:
		return "transient"
	case permanent:
		return "permanent"
	}
	return "unknown"
}

// classify says what kind of error err is, and its class (retryClass).
func classify(err error) (errorKind, string) {
	class := retryClass(err)
	var gap *pipeline.VersionGapError
	switch {
	case pipeline.IsPermanent(err), errors.As(err, &gap), class == classData:
		return permanent, class
	case class == classPostgres, class == classOther:
		return unknown, class
	}
	return transient, class
}

// isProjectionError reports whether err was returned by a projection (for
// an event or its batch), rather than by the runtime's own statements or
// the commit, which no event can be blamed for.
func isProjectionError(err error) bool {
	var pe *projectionError
	return errors.As(err, &pe)
}

// retryClass names the kind of a transient batch failure.
func retryClass(err error) string {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && len(pgErr.Code) == 5 {
		switch code, class := pgErr.Code, pgErr.Code[:2]; {
		case code == "40P01":
			return classDeadlock
		case class == "40":
			return classSerialization
		case code == "55P03":
			return classLockTimeout
		case code == "57014":
			return classCanceled
		case class == "57":
			return classShutdown
		case code == "53300", class == "08":
			return classConnection
		case class == "53":
			return classResources
		case class == "42":
			return classSchema
		case class == "22", class == "23", class == "54":
			return classData
		}
		return classPostgres
	}
	switch {
	case errors.Is(err, errRegistry):
		return classRegistry
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, context.Canceled):
		return classCanceled
	case postgres.IsUnavailable(err):
		return classConnection
	}
	return classOther
}

// kindOf is classify's kind alone.
func kindOf(err error) errorKind {
	k, _ := classify(err)
	return k
}
