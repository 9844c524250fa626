package avro

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"

	"github.com/linkedin/goavro/v2"

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
)

// ValueSubject is the subject of a topic's value schema under Confluent's
// TopicNameStrategy: "{topic}-value".
func ValueSubject(topic string) string { return topic + "-value" }

// Embedded is an in-memory schema registry: what `onceflow dev` and tests
// use. Ids start at 1 and are global across subjects, as in Confluent's
// registry: the same schema under two subjects has one id and a version in
// each. Registering a schema a subject already has (compared in normalized
// form, see normalizeSchema) returns its id and adds no version. Embedded
// does not check compatibility between versions. It is safe for concurrent
// use.
type Embedded struct {
	mu       sync.RWMutex
	schemas  []string         // schemas[id-1]: the text as first registered
	byNorm   map[string]int   // normalized text -> id
	subjects map[string][]int // subject -> id of each version (version v at v-1)
}

// NewEmbedded returns an empty registry.
func NewEmbedded() *Embedded {
	return &Embedded{byNorm: map[string]int{}, subjects: map[string][]int{}}
}

// Register implements Registry. Invalid schemas return an error wrapping
// ErrInvalidSchema.
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
	id, ok := e.byNorm[norm]
	if !ok {
		e.schemas = append(e.schemas, schema)
		id = len(e.schemas)
		e.byNorm[norm] = id
	}
	if !slices.Contains(e.subjects[subject], id) {
		e.subjects[subject] = append(e.subjects[subject], id)
	}
	return id, nil
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
