package avro

import (
	"fmt"
	"strings"

	"github.com/twmb/franz-go/pkg/sr"
)

// Compatibility between versions of a subject, with Confluent's meanings:
// under BACKWARD (the default) a new version must read every record
// written with the latest one, so consumers upgrade first; FORWARD asks the
// reverse (the latest reads records of the new one), FULL both; the
// _TRANSITIVE levels check against every earlier version, not only the
// latest; NONE checks nothing.
//
// "Reads" is Avro schema resolution as Serde.Decode does it (see the
// package doc): records match by name, a field the writer lacks needs a
// default in the reader, a field the reader lacks is dropped, every union
// branch the writer has needs a branch in the reader (records by full
// name), primitives promote int -> long -> float -> double and
// string <-> bytes, enums keep the writer's symbols unless the reader has a
// default symbol, fixed types keep their name and size. Logical types are
// not compared: they do not change the encoding.

// DefaultCompatibility is the level of a subject that has none set, as in
// Confluent's registry.
const DefaultCompatibility = sr.CompatBackward

// problemLimit bounds the problems one check reports.
const problemLimit = 20

// compatChecker collects why a reader schema cannot read what a writer
// schema writes.
type compatChecker struct {
	reader, writer string // how messages name the two schemas: "the new schema", "version 3"
	seen           map[[2]*schema]bool
	problems       []string
}

// readProblems returns why a reader with schema r cannot read every datum
// written with schema w, at most problemLimit of them; none if it can.
func readProblems(r, w *schema, readerName, writerName string) []string {
	c := &compatChecker{reader: readerName, writer: writerName, seen: map[[2]*schema]bool{}}
	c.check(r, w, "")
	return c.problems
}

func (c *compatChecker) problem(at, format string, args ...any) {
	if len(c.problems) == problemLimit {
		return
	}
	msg := fmt.Sprintf(format, args...)
	if at != "" {
		msg = at + ": " + msg
	}
	c.problems = append(c.problems, msg)
}

// check compares r and w at location at ("" at the top, else "record X,
// field y" and so on). A named type used in several places is compared
// once per pair: the work stays bounded by the schemas' sizes however
// often they reuse a type.
func (c *compatChecker) check(r, w *schema, at string) {
	pair := [2]*schema{r, w}
	if c.seen[pair] {
		return
	}
	c.seen[pair] = true

	if w.kind == kindUnion {
		for _, wb := range w.branches {
			c.checkBranch(r, wb, at)
		}
		return
	}
	if r.kind == kindUnion {
		c.checkBranch(r, w, at)
		return
	}
	switch {
	case r.kind == kindRecord && w.kind == kindRecord:
		c.record(r, w, at)
	case r.kind == kindArray && w.kind == kindArray:
		c.check(r.items, w.items, join(at, "array items"))
	case r.kind == kindMap && w.kind == kindMap:
		c.check(r.values, w.values, join(at, "map values"))
	case r.kind == kindEnum && w.kind == kindEnum:
		c.enum(r, w, at)
	case r.kind == kindFixed && w.kind == kindFixed:
		if r.shortName() != w.shortName() || r.size != w.size {
			c.problem(at, "%s has fixed %s of size %d, %s has fixed %s of size %d", c.writer, w.name, w.size, c.reader, r.name, r.size)
		}
	case promotable(w.kind, r.kind):
	default:
		c.problem(at, "%s writes %s, which %s's %s cannot read", c.writer, w.describe(), c.reader, r.describe())
	}
}

// checkBranch checks one type w the writer may write against r, which may
// be a union: the branch of r that Serde.Decode would read w into.
func (c *compatChecker) checkBranch(r, w *schema, at string) {
	if r.kind != kindUnion {
		c.check(r, w, at)
		return
	}
	if rb := unionBranch(r, w); rb != nil {
		c.check(rb, w, at)
		return
	}
	what := "union"
	if at == "" {
		what = "top-level union"
	}
	c.problem(at, "%s has %s in its %s and %s does not: records of that type could not be read", c.writer, w.describe(), what, c.reader)
}

// unionBranch is the branch of union r that a datum of type w is read
// into: the first that matches exactly, else the first w promotes to, as
// readerUnionDecoder chooses. Named types match by full name.
func unionBranch(r, w *schema) *schema {
	for _, exact := range []bool{true, false} {
		for _, rb := range r.branches {
			if branchMatches(w, rb, exact) {
				return rb
			}
		}
	}
	return nil
}

func (c *compatChecker) record(r, w *schema, at string) {
	if r.shortName() != w.shortName() {
		c.problem(at, "%s has record %s where %s has record %s", c.writer, w.name, c.reader, r.name)
		return
	}
	for _, rf := range r.fields {
		fat := join(at, "record "+r.name+", field "+rf.name)
		wf := w.writerField(rf)
		if wf == nil {
			if !rf.hasDefault {
				c.problem(fat, "%s has no default for it and %s lacks the field, so its records could not be read", c.reader, c.writer)
			}
			continue
		}
		c.check(rf.typ, wf.typ, fat)
	}
}

func (c *compatChecker) enum(r, w *schema, at string) {
	if r.shortName() != w.shortName() {
		c.problem(at, "%s has enum %s where %s has enum %s", c.writer, w.name, c.reader, r.name)
		return
	}
	if r.hasEnumDef {
		return
	}
	var missing []string
	for _, sym := range w.symbols {
		if r.symbol(sym) < 0 {
			missing = append(missing, sym)
		}
	}
	if len(missing) > 0 {
		c.problem(join(at, "enum "+r.name), "%s has symbols %s that %s lacks, and it has no default symbol", c.writer, strings.Join(missing, ", "), c.reader)
	}
}

func join(at, more string) string {
	if at == "" {
		return more
	}
	return at + ", " + more
}

// version is one version of a subject, parsed.
type version struct {
	n    int // 1, 2, ...
	root *schema
}

// compatProblems returns why schema s may not become the next version of a
// subject whose versions are prev (oldest first), under level.
func compatProblems(level sr.CompatibilityLevel, s *schema, prev []version) []string {
	if len(prev) == 0 || level == sr.CompatNone {
		return nil
	}
	from := len(prev) - 1 // the latest
	switch level {
	case sr.CompatBackwardTransitive, sr.CompatForwardTransitive, sr.CompatFullTransitive:
		from = 0
	}
	backward := level != sr.CompatForward && level != sr.CompatForwardTransitive
	forward := level != sr.CompatBackward && level != sr.CompatBackwardTransitive
	var out []string
	for i := len(prev) - 1; i >= from && len(out) < problemLimit; i-- {
		old := fmt.Sprintf("version %d", prev[i].n)
		if backward {
			out = append(out, readProblems(s, prev[i].root, "the new schema", old)...)
		}
		if forward {
			out = append(out, readProblems(prev[i].root, s, old, "the new schema")...)
		}
	}
	return out[:min(len(out), problemLimit)]
}
