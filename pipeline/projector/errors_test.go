package projector

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/onceflow/onceflow/pipeline"
)

func TestClassifiesErrors(t *testing.T) {
	t.Parallel()
	pg := func(code string) error { return fmt.Errorf("notes: %w", &pgconn.PgError{Code: code, Message: "m"}) }
	for _, tc := range []struct {
		err   error
		data  bool
		class string
	}{
		{pg("22001"), true, classData}, // string_data_right_truncation
		{pg("22003"), true, classData}, // numeric_value_out_of_range
		{pg("22P02"), true, classData}, // invalid_text_representation
		{pg("22021"), true, classData}, // character_not_in_repertoire
		{pg("23514"), true, classData}, // check_violation
		{pg("23502"), true, classData}, // not_null_violation
		{pg("23505"), true, classData}, // unique_violation
		{pg("23503"), true, classData}, // foreign_key_violation
		{pg("54000"), true, classData}, // program_limit_exceeded (an index row too large)
		{pg("54001"), true, classData}, // statement_too_complex
		{pg("08006"), false, classConnection},
		{pg("53300"), false, classConnection}, // too_many_connections
		{pg("53100"), false, classResources},  // disk_full
		{pg("40001"), false, classSerialization},
		{pg("40P01"), false, classDeadlock},
		{pg("55P03"), false, classLockTimeout},
		{pg("57014"), false, classCanceled},
		{pg("57P01"), false, classShutdown}, // admin_shutdown
		{pg("42P01"), false, classSchema},   // undefined_table
		{pg("42703"), false, classSchema},   // undefined_column
		{pg("25P02"), false, classPostgres}, // in_failed_sql_transaction
		{pg("XX000"), false, classPostgres},
		{pg("22"), false, classOther}, // not a SQLSTATE
		{fmt.Errorf("commit: %w", io.ErrUnexpectedEOF), false, classConnection},
		{fmt.Errorf("%w: registry down", errRegistry), false, classRegistry},
		{context.DeadlineExceeded, false, classCanceled},
		{pipeline.Permanent(errors.New("refused")), false, classOther},
		{errors.New("something"), false, classOther},
	} {
		if _, got := dataError(tc.err); got != tc.data {
			t.Errorf("dataError(%v) = %v, want %v", tc.err, got, tc.data)
		}
		if got := retryClass(tc.err); got != tc.class {
			t.Errorf("retryClass(%v) = %q, want %q", tc.err, got, tc.class)
		}
	}
}

// Only a projection's data errors park an event: the same SQLSTATE from
// the runtime's own statements or the commit is no event's fault.
func TestOnlyProjectionDataErrorsPark(t *testing.T) {
	t.Parallel()
	check := &pgconn.PgError{Code: "23514"}
	for _, tc := range []struct {
		err  error
		want bool
	}{
		{&projectionError{"notes", fmt.Errorf("insert: %w", check)}, true},
		{fmt.Errorf("batch: %w", &projectionError{"notes", check}), true},
		{&projectionError{"notes", &pgconn.PgError{Code: "40001"}}, false},
		{fmt.Errorf("commit: %w", check), false},
		{fmt.Errorf("save parked partitions: %w", check), false},
	} {
		if got := isProjectionDataError(tc.err); got != tc.want {
			t.Errorf("isProjectionDataError(%v) = %v, want %v", tc.err, got, tc.want)
		}
	}
}

func TestDataErrorDetail(t *testing.T) {
	t.Parallel()
	cmd := pipeline.NewCommandID()
	e := event{Event: pipeline.Event{ID: pipeline.EventID("acme/a", cmd, 0), CommandID: cmd, AggregateID: "acme/a", Version: 7,
		Payload: pipeline.CommandRejected{}}}
	got := dataErrorDetail("notes", e, &pgconn.PgError{Code: "22001", Message: "value too long for type character varying(8)",
		TableName: "test_notes", ColumnName: "memo"})
	want := "notes: CommandRejected event " + e.ID.String() + " (aggregate acme/a, version 7): SQLSTATE 22001: " +
		"value too long for type character varying(8) (table test_notes, column memo)"
	if got != want {
		t.Errorf("detail\n got %s\nwant %s", got, want)
	}
	// What the message names already is not repeated.
	got = dataErrorDetail("notes", e, &pgconn.PgError{Code: "23514", Message: `new row for relation "test_notes" violates check constraint "c"`,
		TableName: "test_notes", ConstraintName: "c"})
	if !strings.HasSuffix(got, `violates check constraint "c"`) {
		t.Errorf("detail repeats the message's names: %s", got)
	}
}

// A detail holds what a producer put in a record key: it must still be
// storable as text.
func TestCleanText(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ in, want string }{
		{"plain", "plain"},
		{"nul\x00key", `nul\x00key`},
		{"bad\xffutf8", "bad\uFFFDutf8"},
	} {
		if got := cleanText(tc.in); got != tc.want {
			t.Errorf("cleanText(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
	long := cleanText(strings.Repeat("é", maxDetail))
	if len(long) > maxDetail+len("…") || !utf8.ValidString(long) {
		t.Errorf("long text cut to %d bytes, valid UTF-8 %v", len(long), utf8.ValidString(long))
	}
}

// The classification of any error a projection can return: it never
// panics; the kind follows the class (data errors and pipeline.Permanent
// park at once, the known passing classes are retried for as long as they
// last, anything else is of no known kind); wrapping an error, as a
// projection or the runtime does, never changes its kind or class; and
// pipeline.Permanent makes any error permanent.
func FuzzClassify(f *testing.F) {
	for _, c := range []string{"22001", "23505", "54000", "40001", "40P01", "08006", "53300", "57P01", "42P01", "XX000", "P0001", "22", ""} {
		f.Add(c, "m", uint8(0), false)
	}
	f.Add("", "json: unsupported value", uint8(3), false)
	f.Add("", "refused", uint8(1), true)
	f.Add("0", "m", uint8(0), true) // postgres.IsUnavailable sliced a code shorter than 2
	transientClasses := map[string]bool{classConnection: true, classShutdown: true, classSerialization: true, classDeadlock: true,
		classLockTimeout: true, classCanceled: true, classResources: true, classSchema: true, classRegistry: true}
	f.Fuzz(func(t *testing.T, code, msg string, wraps uint8, perm bool) {
		var err error = errors.New(msg)
		if code != "" {
			err = &pgconn.PgError{Code: code, Message: msg}
		}
		kind, class := classify(err)
		if !slices.Contains(retryClasses, class) {
			t.Fatalf("%v: class %q is not one of the retry classes", err, class)
		}
		switch {
		case class == classData && kind != permanent, transientClasses[class] && kind != transient,
			(class == classPostgres || class == classOther) && kind != unknown:
			t.Fatalf("%v: class %s, kind %s", err, class, kind)
		}
		if len(code) == 5 && (strings.HasPrefix(code, "22") || strings.HasPrefix(code, "23") || strings.HasPrefix(code, "54")) && kind != permanent {
			t.Fatalf("SQLSTATE %s: kind %s, want permanent", code, kind)
		}
		if code == "" && kind != unknown {
			t.Fatalf("a plain error %q: kind %s, want unknown", msg, kind)
		}
		wrapped := err
		for i := range int(wraps % 8) {
			switch i % 3 {
			case 0:
				wrapped = fmt.Errorf("apply: %w", wrapped)
			case 1:
				wrapped = &projectionError{"p", wrapped}
			case 2:
				wrapped = errors.Join(wrapped)
			}
		}
		if k, c := classify(wrapped); k != kind || c != class {
			t.Fatalf("%v wrapped as %v: %s/%s, want %s/%s", err, wrapped, k, c, kind, class)
		}
		if perm {
			if k, _ := classify(pipeline.Permanent(wrapped)); k != permanent {
				t.Fatalf("Permanent(%v): kind %s", wrapped, k)
			}
		}
	})
}
