package avro

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"

	"github.com/linkedin/goavro/v2"
	"github.com/twmb/franz-go/pkg/sr"

	"github.com/onceflow/onceflow/pipeline"
)

// Registry gives Confluent-compatible schema ids. Embedded and Client
// implement it; both pass the same conformance suite.
type Registry interface {
	// Register returns the id of schema under subject, registering it (as
	// the next version) if the subject does not have it yet.
	Register(ctx context.Context, subject, schema string) (int, error)
	// SchemaByID returns the schema text registered with id; an unknown id
	// returns an error wrapping ErrUnknownSchema.
	SchemaByID(ctx context.Context, id int) (string, error)
}

var (
	// ErrUnknownSchema is returned for a schema id the registry does not
	// have. It is pipeline.ErrUnknownSchema, so consumers can classify it
	// without importing this package.
	ErrUnknownSchema = pipeline.ErrUnknownSchema

	// ErrInvalidSchema is returned by Register for text that is not a valid
	// Avro schema.
	ErrInvalidSchema = errors.New("invalid avro schema")

	// ErrIncompatibleSchema is returned by Register for a schema that may
	// not become the subject's next version under its compatibility level;
	// the error is an *IncompatibleError.
	ErrIncompatibleSchema = errors.New("schema incompatible with an earlier version")
)

// IncompatibleError says why a schema may not become a subject's next
// version. It wraps ErrIncompatibleSchema.
type IncompatibleError struct {
	Subject string
	// Level is the subject's compatibility level; 0 when a registry
	// refused without saying.
	Level sr.CompatibilityLevel
	// Problems name each field or type at fault, as the registry put them.
	Problems []string
}

func (e *IncompatibleError) Error() string {
	var b strings.Builder
	b.WriteString("schema incompatible with an earlier version of ")
	b.WriteString(e.Subject)
	if e.Level != 0 {
		b.WriteString(" (compatibility " + e.Level.String() + ")")
	}
	if len(e.Problems) > 0 {
		b.WriteString(": " + strings.Join(e.Problems, "; "))
	}
	return b.String()
}

func (e *IncompatibleError) Unwrap() error { return ErrIncompatibleSchema }

// ValueSubject is the subject of a topic's value schema under Confluent's
// TopicNameStrategy: "{topic}-value".
func ValueSubject(topic string) string { return topic + "-value" }

// Embedded is an in-memory schema registry: what `onceflow dev` and tests
// use. Ids start at 1 and are global across subjects, as in Confluent's
// registry: the same schema under two subjects has one id and a version in
// each. Registering a schema a subject already has (compared in normalized
// form, see normalizeSchema) returns its id and adds no version; a schema
// new to the subject must be compatible with its earlier versions under
// the subject's compatibility level (DefaultCompatibility, BACKWARD, unless
// SetCompatibility says otherwise; see compat.go), else Register returns
// an error wrapping ErrIncompatibleSchema that names each field or type
// at fault. It is safe for concurrent use.
type Embedded struct {
	mu       sync.RWMutex
	schemas  []string                         // schemas[id-1]: the text as first registered
	byNorm   map[string]int                   // normalized text -> id
	subjects map[string][]int                 // subject -> id of each version (version v at v-1)
	levels   map[string]sr.CompatibilityLevel // subject ("" for the default) -> level
	path     string                           // the file it persists to (OpenEmbedded), or ""
	log      []registration                   // what added a version, in order: what path holds
}

// registration is one schema added to a subject.
type registration struct {
	Subject string `json:"subject"`
	Schema  string `json:"schema"`
}

// NewEmbedded returns an empty registry.
func NewEmbedded() *Embedded {
	return &Embedded{byNorm: map[string]int{}, subjects: map[string][]int{}, levels: map[string]sr.CompatibilityLevel{}}
}

// OpenEmbedded returns an Embedded that keeps its schemas and compatibility
// levels in the file at path (created if missing) and starts with what the
// file holds. Schema ids are written into records, so a registry that
// outlives its records' readers (the data directory of `onceflow dev`) must
// remember them: rebuilt from a binary's schemas alone, it would give an
// edited schema the id of the version before it, and records written with
// that version would be read with the wrong schema.
func OpenEmbedded(path string) (*Embedded, error) {
	e := NewEmbedded()
	b, err := os.ReadFile(path) // #nosec G304 -- the registry file the operator chose
	if errors.Is(err, fs.ErrNotExist) {
		e.path = path
		return e, e.save(nil, e.levels)
	}
	if err != nil {
		return nil, fmt.Errorf("schema registry file: %w", err)
	}
	var st embeddedState
	if err := json.Unmarshal(b, &st); err != nil {
		return nil, fmt.Errorf("schema registry file %s: %w", path, err)
	}
	for i, r := range st.Registrations {
		norm, err := validateSchema(r.Schema)
		if err != nil || r.Subject == "" {
			return nil, fmt.Errorf("schema registry file %s: registration %d (%s): %v", path, i, r.Subject, err)
		}
		// What was checked when it was registered is not checked again:
		// the levels may have changed since.
		if id, ok := e.byNorm[norm]; !ok || !slices.Contains(e.subjects[r.Subject], id) {
			e.add(r.Subject, r.Schema, norm)
		}
	}
	for subject, l := range st.Compatibility {
		var level sr.CompatibilityLevel
		if err := level.UnmarshalText([]byte(l)); err != nil {
			return nil, fmt.Errorf("schema registry file %s: subject %q: %w", path, subject, err)
		}
		e.levels[subject] = level
	}
	e.path = path
	return e, nil
}

// embeddedState is the content of an Embedded's file: every registration
// that added a version, in order (replaying them gives every id and
// version back), and the compatibility levels set.
type embeddedState struct {
	Registrations []registration    `json:"registrations"`
	Compatibility map[string]string `json:"compatibility"`
}

// save writes log and levels to the registry's file, if it has one,
// replacing it whole (a new file renamed over the old one), before the
// registry changes in memory: a change that is not on disk has not
// happened.
func (e *Embedded) save(log []registration, levels map[string]sr.CompatibilityLevel) error {
	if e.path == "" {
		return nil
	}
	st := embeddedState{Registrations: log, Compatibility: map[string]string{}}
	if st.Registrations == nil {
		st.Registrations = []registration{}
	}
	for subject, l := range levels {
		st.Compatibility[subject] = l.String()
	}
	b, err := json.MarshalIndent(st, "", "  ")
	if err != nil {
		return err
	}
	if err := writeFileAtomic(e.path, b); err != nil {
		return fmt.Errorf("save schema registry: %w", err)
	}
	return nil
}

// writeFileAtomic replaces path with b: a crash leaves the old file or the
// new one, never a part.
func writeFileAtomic(path string, b []byte) error {
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return err
	}
	f, err := os.CreateTemp(dir, filepath.Base(path)+".*.tmp")
	if err != nil {
		return err
	}
	defer os.Remove(f.Name()) // after the rename, there is nothing to remove
	if _, err := f.Write(b); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	if err := os.Rename(f.Name(), path); err != nil {
		return err
	}
	d, err := os.Open(dir) // #nosec G304 -- the registry file's directory, which the operator chose
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

// Register implements Registry. Invalid schemas return an error wrapping
// ErrInvalidSchema; a schema incompatible with the subject's earlier
// versions one wrapping ErrIncompatibleSchema.
func (e *Embedded) Register(_ context.Context, subject, schema string) (int, error) {
	norm, err := validateSchema(schema)
	if err != nil {
		return 0, err
	}
	if subject == "" {
		return 0, errors.New("register schema: empty subject")
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	id, known := e.byNorm[norm]
	if known && slices.Contains(e.subjects[subject], id) {
		return id, nil
	}
	level := e.level(subject)
	if problems := e.problems(level, subject, schema, 0); len(problems) > 0 {
		return 0, &IncompatibleError{Subject: subject, Level: level, Problems: problems}
	}
	if err := e.save(append(e.log, registration{subject, schema}), e.levels); err != nil {
		return 0, err
	}
	return e.add(subject, schema, norm), nil
}

// add adds schema as the next version of subject and returns its id.
func (e *Embedded) add(subject, schema, norm string) int {
	id, ok := e.byNorm[norm]
	if !ok {
		e.schemas = append(e.schemas, schema)
		id = len(e.schemas)
		e.byNorm[norm] = id
	}
	e.subjects[subject] = append(e.subjects[subject], id)
	e.log = append(e.log, registration{subject, schema})
	return id
}

// level returns subject's compatibility level.
func (e *Embedded) level(subject string) sr.CompatibilityLevel {
	if l, ok := e.levels[subject]; ok {
		return l
	}
	if l, ok := e.levels[""]; ok {
		return l
	}
	return DefaultCompatibility
}

// problems returns why schema may not follow the versions of subject that
// level checks (only one, if only > 0) under level.
func (e *Embedded) problems(level sr.CompatibilityLevel, subject, schema string, only int) []string {
	ids := e.subjects[subject]
	if len(ids) == 0 || level == sr.CompatNone {
		return nil
	}
	ps, err := parseSchema(schema)
	if err != nil {
		return []string{fmt.Sprintf("the new schema cannot be checked: %v", err)}
	}
	var prev []version
	for i, id := range ids {
		if only > 0 && i+1 != only {
			continue
		}
		old, err := parseSchema(e.schemas[id-1])
		if err != nil {
			return []string{fmt.Sprintf("version %d cannot be checked: %v", i+1, err)}
		}
		prev = append(prev, version{n: i + 1, root: old.root})
	}
	return compatProblems(level, ps.root, prev)
}

// Compatibility returns subject's compatibility level; subject "" asks for
// the registry's default.
func (e *Embedded) Compatibility(subject string) sr.CompatibilityLevel {
	e.mu.RLock()
	defer e.mu.RUnlock()
	return e.level(subject)
}

// SetCompatibility sets subject's compatibility level (subject "": the
// default of subjects that have none). sr.CompatNone turns the check off.
func (e *Embedded) SetCompatibility(subject string, level sr.CompatibilityLevel) error {
	if level.String() == "" {
		return fmt.Errorf("unknown compatibility level %d", level)
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	levels := maps.Clone(e.levels)
	levels[subject] = level
	if err := e.save(e.log, levels); err != nil {
		return err
	}
	e.levels = levels
	return nil
}

// resetCompatibility removes subject's own level and returns the level it
// had.
func (e *Embedded) resetCompatibility(subject string) (sr.CompatibilityLevel, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	l, ok := e.levels[subject]
	if !ok {
		return 0, errNoSubjectLevel
	}
	levels := maps.Clone(e.levels)
	delete(levels, subject)
	if err := e.save(e.log, levels); err != nil {
		return 0, err
	}
	e.levels = levels
	return l, nil
}

// subjectLevel returns the level set for subject itself, if any.
func (e *Embedded) subjectLevel(subject string) (sr.CompatibilityLevel, bool) {
	e.mu.RLock()
	defer e.mu.RUnlock()
	l, ok := e.levels[subject]
	return l, ok
}

// checkCompatibility answers whether schema may follow version v of
// subject (-1: the latest; 0: the versions its level checks) under the
// subject's level: the problems, none if it may. A subject without
// versions accepts anything, as Confluent's registry answers for
// "latest".
func (e *Embedded) checkCompatibility(subject, schema string, v int) ([]string, error) {
	if _, err := validateSchema(schema); err != nil {
		return nil, err
	}
	e.mu.RLock()
	defer e.mu.RUnlock()
	n := len(e.subjects[subject])
	switch {
	case v == -1:
		v = n // 0 when there is none: nothing to check against
	case v > n:
		return nil, errVersionNotFound
	}
	return e.problems(e.level(subject), subject, schema, v), nil
}

// SchemaByID implements Registry.
func (e *Embedded) SchemaByID(_ context.Context, id int) (string, error) {
	e.mu.RLock()
	defer e.mu.RUnlock()
	if id < 1 || id > len(e.schemas) {
		return "", fmt.Errorf("schema id %d: %w", id, ErrUnknownSchema)
	}
	return e.schemas[id-1], nil
}

// subjectVersion is one version of a subject.
type subjectVersion struct {
	Subject string `json:"subject"`
	Version int    `json:"version"`
	ID      int    `json:"id"`
	Schema  string `json:"schema"`
}

var (
	errSubjectNotFound = errors.New("subject not found")
	errVersionNotFound = errors.New("version not found")
	errSchemaNotFound  = errors.New("schema not found")
	errNoSubjectLevel  = errors.New("subject has no compatibility level of its own")
)

func (e *Embedded) subjectList() []string {
	e.mu.RLock()
	defer e.mu.RUnlock()
	out := make([]string, 0, len(e.subjects))
	for s := range e.subjects {
		out = append(out, s)
	}
	sort.Strings(out)
	return out
}

func (e *Embedded) versions(subject string) ([]int, error) {
	e.mu.RLock()
	defer e.mu.RUnlock()
	ids, ok := e.subjects[subject]
	if !ok {
		return nil, errSubjectNotFound
	}
	out := make([]int, len(ids))
	for i := range ids {
		out[i] = i + 1
	}
	return out, nil
}

// version returns version v of subject; v == -1 is the latest.
func (e *Embedded) version(subject string, v int) (subjectVersion, error) {
	e.mu.RLock()
	defer e.mu.RUnlock()
	ids, ok := e.subjects[subject]
	if !ok {
		return subjectVersion{}, errSubjectNotFound
	}
	if v == -1 {
		v = len(ids)
	}
	if v < 1 || v > len(ids) {
		return subjectVersion{}, errVersionNotFound
	}
	id := ids[v-1]
	return subjectVersion{Subject: subject, Version: v, ID: id, Schema: e.schemas[id-1]}, nil
}

// lookup returns the version of subject that has schema.
func (e *Embedded) lookup(subject, schema string) (subjectVersion, error) {
	norm, err := validateSchema(schema)
	if err != nil {
		return subjectVersion{}, err
	}
	e.mu.RLock()
	defer e.mu.RUnlock()
	ids, ok := e.subjects[subject]
	if !ok {
		return subjectVersion{}, errSubjectNotFound
	}
	id, ok := e.byNorm[norm]
	if !ok {
		return subjectVersion{}, errSchemaNotFound
	}
	i := slices.Index(ids, id)
	if i < 0 {
		return subjectVersion{}, errSchemaNotFound
	}
	return subjectVersion{Subject: subject, Version: i + 1, ID: id, Schema: e.schemas[id-1]}, nil
}

// usages returns every subject version that uses id, sorted.
func (e *Embedded) usages(id int) ([]subjectVersion, error) {
	e.mu.RLock()
	defer e.mu.RUnlock()
	if id < 1 || id > len(e.schemas) {
		return nil, ErrUnknownSchema
	}
	var out []subjectVersion
	for s, ids := range e.subjects {
		for i, x := range ids {
			if x == id {
				out = append(out, subjectVersion{Subject: s, Version: i + 1})
			}
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Subject < out[j].Subject })
	return out, nil
}

// validateSchema checks that text is an Avro schema goavro accepts and
// returns its normalized form: the JSON compacted, with object keys sorted,
// so schemas that differ only in whitespace or key order compare equal. It
// is deliberately not Avro's Parsing Canonical Form: that form drops
// defaults, docs and logical types, so a version that only adds a default
// (or a logicalType) would get the old id, and readers fetching the schema
// by that id would never see the addition.
func validateSchema(text string) (string, error) {
	v, err := decodeJSON(text)
	if err != nil {
		return "", fmt.Errorf("%w: %v", ErrInvalidSchema, err)
	}
	b, err := json.Marshal(v) // map keys are marshalled sorted; json.Number keeps its digits
	if err != nil {
		return "", fmt.Errorf("%w: %v", ErrInvalidSchema, err)
	}
	norm := string(b)
	// goavro validates logical types with process-wide, unlocked state (the
	// validated-string pattern cache); they do not change the encoding, so
	// validate without them.
	stripLogicalTypes(v)
	stripped, err := json.Marshal(v)
	if err != nil {
		return "", fmt.Errorf("%w: %v", ErrInvalidSchema, err)
	}
	if _, err := goavro.NewCodec(string(stripped)); err != nil {
		return "", fmt.Errorf("%w: %v", ErrInvalidSchema, err)
	}
	return norm, nil
}

// decodeJSON decodes one JSON value, keeping numbers as json.Number.
func decodeJSON(text string) (any, error) {
	dec := json.NewDecoder(strings.NewReader(text))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, fmt.Errorf("schema is not JSON: %w", err)
	}
	if dec.More() {
		return nil, errors.New("data after the schema's JSON value")
	}
	return v, nil
}

// stripLogicalTypes removes logicalType from every type object of a decoded
// schema, leaving default values alone.
func stripLogicalTypes(v any) {
	switch v := v.(type) {
	case []any:
		for _, b := range v {
			stripLogicalTypes(b)
		}
	case map[string]any:
		delete(v, "logicalType")
		stripLogicalTypes(v["type"])
		stripLogicalTypes(v["items"])
		stripLogicalTypes(v["values"])
		if fields, ok := v["fields"].([]any); ok {
			for _, f := range fields {
				if fm, ok := f.(map[string]any); ok {
					stripLogicalTypes(fm["type"])
				}
			}
		}
	}
}
