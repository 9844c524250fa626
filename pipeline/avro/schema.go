package avro

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"strconv"
	"strings"
)

// kind is an Avro type.
type kind uint8

const (
	kindNull kind = iota
	kindBoolean
	kindInt
	kindLong
	kindFloat
	kindDouble
	kindBytes
	kindString
	kindRecord
	kindEnum
	kindArray
	kindMap
	kindUnion
	kindFixed
)

var kindNames = [...]string{
	kindNull: "null", kindBoolean: "boolean", kindInt: "int", kindLong: "long",
	kindFloat: "float", kindDouble: "double", kindBytes: "bytes", kindString: "string",
	kindRecord: "record", kindEnum: "enum", kindArray: "array", kindMap: "map",
	kindUnion: "union", kindFixed: "fixed",
}

func (k kind) String() string { return kindNames[k] }

var primitives = map[string]kind{
	"null": kindNull, "boolean": kindBoolean, "int": kindInt, "long": kindLong,
	"float": kindFloat, "double": kindDouble, "bytes": kindBytes, "string": kindString,
}

// Logical types this package maps to Go types. Others are legal and are read
// as their underlying type.
const (
	logicalTimestampMillis = "timestamp-millis"
	logicalTimestampMicros = "timestamp-micros"
)

// schema is a parsed Avro schema. goavro builds codecs but does not expose
// its schema tree, and schema resolution needs one, so the package keeps its
// own.
type schema struct {
	kind     kind
	name     string // full name of a record, enum or fixed
	logical  string // logicalType, on any type
	fields   []*field
	items    *schema   // array
	values   *schema   // map
	branches []*schema // union
	symbols  []string  // enum
	enumDef  string    // enum default symbol, when hasEnumDef
	size     int       // fixed

	hasEnumDef bool
}

type field struct {
	name       string
	aliases    []string
	typ        *schema
	def        any // the default, in goavro's native form for typ
	hasDefault bool
}

// shortName is the name without its namespace.
func (s *schema) shortName() string {
	if i := strings.LastIndexByte(s.name, '.'); i >= 0 {
		return s.name[i+1:]
	}
	return s.name
}

// branchName is the key goavro uses for this type inside a union: the full
// name of a named type, otherwise the type's name. (The codecs this package
// builds have their logical types stripped, so there is no "long.timestamp-millis".)
func (s *schema) branchName() string {
	switch s.kind {
	case kindRecord, kindEnum, kindFixed:
		return s.name
	}
	return s.kind.String()
}

// describe names the type for error messages.
func (s *schema) describe() string {
	switch s.kind {
	case kindRecord, kindEnum, kindFixed:
		return s.kind.String() + " " + s.name
	case kindArray:
		return "array<" + s.items.describe() + ">"
	case kindMap:
		return "map<" + s.values.describe() + ">"
	case kindUnion:
		names := make([]string, len(s.branches))
		for i, b := range s.branches {
			names[i] = b.describe()
		}
		return "[" + strings.Join(names, ", ") + "]"
	}
	if s.logical != "" {
		return s.kind.String() + " (" + s.logical + ")"
	}
	return s.kind.String()
}

// field returns the record field named name, or nil.
func (s *schema) field(name string) *field {
	for _, f := range s.fields {
		if f.name == name {
			return f
		}
	}
	return nil
}

// writerField returns the field of this (the writer's) record that the
// reader's field rf reads: the one of its name, else the first of its
// aliases, or nil.
func (s *schema) writerField(rf *field) *field {
	if f := s.field(rf.name); f != nil {
		return f
	}
	for _, a := range rf.aliases {
		if f := s.field(a); f != nil {
			return f
		}
	}
	return nil
}

// zeroWidth reports whether a value of s can encode to zero bytes. An array
// of such items lets a few bytes claim billions of items (one block count
// after another, each under goavro.MaxBlockCount), so such arrays are
// refused; see limits.go.
func (s *schema) zeroWidth() bool {
	switch s.kind {
	case kindNull:
		return true
	case kindFixed:
		return s.size == 0
	case kindRecord:
		for _, f := range s.fields {
			if !f.typ.zeroWidth() {
				return false
			}
		}
		return true
	}
	return false
}

// parsedSchema is a parsed schema and the text goavro gets for it: the same
// schema with every logicalType removed, so goavro's natives are always the
// underlying types (int64, not time.Time) and union branch keys are plain
// type names. Logical types do not change the binary encoding.
type parsedSchema struct {
	root  *schema
	codec string
}

// parseSchema parses the JSON text of an Avro schema. Recursive types are
// refused: a recursive schema lets a payload nest as deep as it is long,
// which can exhaust the goroutine stack (a fatal error, not a panic).
func parseSchema(text string) (*parsedSchema, error) {
	v, err := decodeJSON(text)
	if err != nil {
		return nil, err
	}
	p := &parser{named: map[string]*schema{}, open: map[string]bool{}}
	root, err := p.parse(v, "")
	if err != nil {
		return nil, err
	}
	stripped, err := json.Marshal(v) // p.parse removed the logicalType attributes
	if err != nil {
		return nil, err
	}
	return &parsedSchema{root: root, codec: string(stripped)}, nil
}

type parser struct {
	named map[string]*schema
	open  map[string]bool // records being parsed: a reference to one is recursion
}

func (p *parser) parse(v any, ns string) (*schema, error) {
	switch v := v.(type) {
	case string:
		return p.ref(v, ns)
	case []any:
		return p.union(v, ns)
	case map[string]any:
		return p.object(v, ns)
	}
	return nil, fmt.Errorf("a schema is a string, an array or an object, not %s", jsonKind(v))
}

func (p *parser) ref(name, ns string) (*schema, error) {
	if k, ok := primitives[name]; ok {
		return &schema{kind: k}, nil
	}
	full := name
	if !strings.Contains(name, ".") && ns != "" {
		full = ns + "." + name
	}
	for _, n := range []string{full, name} {
		if p.open[n] {
			return nil, fmt.Errorf("recursive type %s: recursive schemas are not supported", n)
		}
		if s, ok := p.named[n]; ok {
			return s, nil
		}
	}
	return nil, fmt.Errorf("unknown type %q", name)
}

func (p *parser) union(v []any, ns string) (*schema, error) {
	s := &schema{kind: kindUnion}
	seen := map[string]bool{}
	for i, b := range v {
		bs, err := p.parse(b, ns)
		if err != nil {
			return nil, fmt.Errorf("union branch %d: %w", i, err)
		}
		if bs.kind == kindUnion {
			return nil, fmt.Errorf("union branch %d: a union cannot contain a union", i)
		}
		key := bs.branchName()
		if seen[key] {
			return nil, fmt.Errorf("union branch %d: duplicate type %s", i, key)
		}
		seen[key] = true
		s.branches = append(s.branches, bs)
	}
	if len(s.branches) == 0 {
		return nil, fmt.Errorf("empty union")
	}
	return s, nil
}

func (p *parser) object(m map[string]any, ns string) (*schema, error) {
	t, ok := m["type"]
	if !ok {
		return nil, fmt.Errorf("schema object has no type")
	}
	logical, _ := m["logicalType"].(string)
	delete(m, "logicalType")
	tn, ok := t.(string)
	if !ok { // {"type": {...}} or {"type": [...]}
		s, err := p.parse(t, ns)
		if err != nil {
			return nil, err
		}
		return s, nil
	}
	switch tn {
	case "record", "error":
		return p.record(m, ns, logical)
	case "enum":
		return p.enum(m, ns, logical)
	case "fixed":
		return p.fixed(m, ns, logical)
	case "array":
		items, ok := m["items"]
		if !ok {
			return nil, fmt.Errorf("array has no items")
		}
		is, err := p.parse(items, ns)
		if err != nil {
			return nil, fmt.Errorf("array items: %w", err)
		}
		if is.zeroWidth() {
			return nil, fmt.Errorf("array of %s: items that encode to zero bytes are not supported (unbounded decoding)", is.describe())
		}
		return &schema{kind: kindArray, items: is, logical: logical}, nil
	case "map":
		values, ok := m["values"]
		if !ok {
			return nil, fmt.Errorf("map has no values")
		}
		vs, err := p.parse(values, ns)
		if err != nil {
			return nil, fmt.Errorf("map values: %w", err)
		}
		return &schema{kind: kindMap, values: vs, logical: logical}, nil
	}
	s, err := p.ref(tn, ns)
	if err != nil {
		return nil, err
	}
	if logical != "" {
		if s.kind >= kindRecord { // a reference to a named type: annotate a copy
			c := *s
			c.logical = logical
			return &c, nil
		}
		s.logical = logical
	}
	return s, nil
}

// define registers a named type and returns its full name and the namespace
// its children inherit.
func (p *parser) define(m map[string]any, ns string, s *schema) (childNS string, err error) {
	name, _ := m["name"].(string)
	if name == "" {
		return "", fmt.Errorf("%s has no name", s.kind)
	}
	full := name
	switch {
	case strings.Contains(name, "."):
	case m["namespace"] != nil:
		n, ok := m["namespace"].(string)
		if !ok {
			return "", fmt.Errorf("%s %s: namespace is not a string", s.kind, name)
		}
		if n != "" {
			full = n + "." + name
		}
	case ns != "":
		full = ns + "." + name
	}
	for _, part := range strings.Split(full, ".") {
		if !validName(part) {
			return "", fmt.Errorf("%s name %q is not a valid Avro name", s.kind, full)
		}
	}
	if _, ok := primitives[full]; ok {
		return "", fmt.Errorf("%s name %q is a primitive type name", s.kind, full)
	}
	if _, ok := p.named[full]; ok || p.open[full] {
		return "", fmt.Errorf("type %s is defined twice", full)
	}
	s.name = full
	if i := strings.LastIndexByte(full, '.'); i >= 0 {
		return full[:i], nil
	}
	return "", nil
}

func (p *parser) record(m map[string]any, ns, logical string) (*schema, error) {
	s := &schema{kind: kindRecord, logical: logical}
	childNS, err := p.define(m, ns, s)
	if err != nil {
		return nil, err
	}
	fields, ok := m["fields"].([]any)
	if !ok {
		return nil, fmt.Errorf("record %s: fields is not an array", s.name)
	}
	p.open[s.name] = true
	for i, fv := range fields {
		fm, ok := fv.(map[string]any)
		if !ok {
			return nil, fmt.Errorf("record %s: field %d is not an object", s.name, i)
		}
		f := &field{}
		f.name, _ = fm["name"].(string)
		if !validName(f.name) {
			return nil, fmt.Errorf("record %s: field %d: invalid name %q", s.name, i, f.name)
		}
		if s.field(f.name) != nil {
			return nil, fmt.Errorf("record %s: field %s is defined twice", s.name, f.name)
		}
		if al, ok := fm["aliases"].([]any); ok {
			for _, a := range al {
				if as, ok := a.(string); ok {
					f.aliases = append(f.aliases, as)
				}
			}
		}
		ft, ok := fm["type"]
		if !ok {
			return nil, fmt.Errorf("record %s: field %s has no type", s.name, f.name)
		}
		if f.typ, err = p.parse(ft, childNS); err != nil {
			return nil, fmt.Errorf("record %s: field %s: %w", s.name, f.name, err)
		}
		if d, ok := fm["default"]; ok {
			if f.def, err = defaultNative(f.typ, d); err != nil {
				return nil, fmt.Errorf("record %s: field %s: default: %w", s.name, f.name, err)
			}
			f.hasDefault = true
		}
		s.fields = append(s.fields, f)
	}
	delete(p.open, s.name)
	p.named[s.name] = s
	return s, nil
}

func (p *parser) enum(m map[string]any, ns, logical string) (*schema, error) {
	s := &schema{kind: kindEnum, logical: logical}
	if _, err := p.define(m, ns, s); err != nil {
		return nil, err
	}
	syms, ok := m["symbols"].([]any)
	if !ok || len(syms) == 0 {
		return nil, fmt.Errorf("enum %s: symbols is not a non-empty array", s.name)
	}
	for _, sv := range syms {
		sym, _ := sv.(string)
		if !validName(sym) || s.symbol(sym) >= 0 {
			return nil, fmt.Errorf("enum %s: invalid or duplicate symbol %v", s.name, sv)
		}
		s.symbols = append(s.symbols, sym)
	}
	if d, ok := m["default"]; ok {
		ds, _ := d.(string)
		if s.symbol(ds) < 0 {
			return nil, fmt.Errorf("enum %s: default %v is not a symbol", s.name, d)
		}
		s.enumDef, s.hasEnumDef = ds, true
	}
	p.named[s.name] = s
	return s, nil
}

func (s *schema) symbol(sym string) int {
	for i, x := range s.symbols {
		if x == sym {
			return i
		}
	}
	return -1
}

func (p *parser) fixed(m map[string]any, ns, logical string) (*schema, error) {
	s := &schema{kind: kindFixed, logical: logical}
	if _, err := p.define(m, ns, s); err != nil {
		return nil, err
	}
	n, ok := m["size"].(json.Number)
	if !ok {
		return nil, fmt.Errorf("fixed %s: size is not a number", s.name)
	}
	size, err := strconv.Atoi(n.String())
	if err != nil || size < 0 || size > maxBytes {
		return nil, fmt.Errorf("fixed %s: size %s is not in 0..%d", s.name, n, maxBytes)
	}
	s.size = size
	p.named[s.name] = s
	return s, nil
}

func validName(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '_', 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z':
		case '0' <= c && c <= '9' && i > 0:
		default:
			return false
		}
	}
	return true
}

func jsonKind(v any) string {
	switch v.(type) {
	case nil:
		return "null"
	case bool:
		return "a boolean"
	case json.Number:
		return "a number"
	case string:
		return "a string"
	case []any:
		return "an array"
	case map[string]any:
		return "an object"
	}
	return fmt.Sprintf("%T", v)
}

// defaultNative converts a field default, as JSON, into goavro's native form
// for s (logical types stripped). A union's default is for its first branch.
func defaultNative(s *schema, v any) (any, error) {
	bad := func() (any, error) {
		return nil, fmt.Errorf("%s is not a valid %s", jsonKind(v), s.describe())
	}
	switch s.kind {
	case kindNull:
		if v != nil {
			return bad()
		}
		return nil, nil
	case kindBoolean:
		b, ok := v.(bool)
		if !ok {
			return bad()
		}
		return b, nil
	case kindInt, kindLong, kindFloat, kindDouble:
		n, ok := v.(json.Number)
		if !ok {
			return bad()
		}
		return defaultNumber(s, n)
	case kindString:
		str, ok := v.(string)
		if !ok {
			return bad()
		}
		return str, nil
	case kindBytes, kindFixed:
		str, ok := v.(string)
		if !ok {
			return bad()
		}
		return defaultBytes(s, str)
	case kindEnum:
		str, ok := v.(string)
		if !ok || s.symbol(str) < 0 {
			return nil, fmt.Errorf("%v is not a symbol of enum %s", v, s.name)
		}
		return str, nil
	case kindArray:
		a, ok := v.([]any)
		if !ok {
			return bad()
		}
		return defaultArray(s, a)
	case kindMap:
		m, ok := v.(map[string]any)
		if !ok {
			return bad()
		}
		return defaultMap(s, m)
	case kindRecord:
		m, ok := v.(map[string]any)
		if !ok {
			return bad()
		}
		return defaultRecord(s, m)
	case kindUnion:
		first := s.branches[0]
		n, err := defaultNative(first, v)
		if err != nil {
			return nil, fmt.Errorf("a union's default is for its first branch (%s): %w", first.describe(), err)
		}
		if first.kind == kindNull {
			return nil, nil
		}
		return map[string]any{first.branchName(): n}, nil
	}
	return bad()
}

// defaultNumber is the default n of an int, long, float or double.
func defaultNumber(s *schema, n json.Number) (any, error) {
	if s.kind == kindFloat || s.kind == kindDouble {
		f, err := n.Float64()
		if err != nil {
			return nil, err
		}
		if s.kind == kindFloat {
			return float32(f), nil
		}
		return f, nil
	}
	i, err := strconv.ParseInt(n.String(), 10, 64)
	if err != nil {
		return nil, fmt.Errorf("%s is not an integer", n)
	}
	if s.kind == kindInt {
		if i < math.MinInt32 || i > math.MaxInt32 {
			return nil, fmt.Errorf("%d overflows int", i)
		}
		return int32(i), nil
	}
	return i, nil
}

// defaultBytes is the default str of bytes or a fixed: Avro writes them
// as strings whose code points 0-255 are the bytes.
func defaultBytes(s *schema, str string) (any, error) {
	var b bytes.Buffer
	for _, r := range str {
		if r > 255 {
			return nil, fmt.Errorf("bytes default has code point %U above U+00FF", r)
		}
		b.WriteByte(byte(r))
	}
	if s.kind == kindFixed && b.Len() != s.size {
		return nil, fmt.Errorf("default has %d bytes, fixed %s has %d", b.Len(), s.name, s.size)
	}
	return b.Bytes(), nil
}

func defaultArray(s *schema, a []any) (any, error) {
	out := make([]any, len(a))
	for i, x := range a {
		n, err := defaultNative(s.items, x)
		if err != nil {
			return nil, fmt.Errorf("item %d: %w", i, err)
		}
		out[i] = n
	}
	return out, nil
}

func defaultMap(s *schema, m map[string]any) (any, error) {
	out := make(map[string]any, len(m))
	for k, x := range m {
		n, err := defaultNative(s.values, x)
		if err != nil {
			return nil, fmt.Errorf("key %q: %w", k, err)
		}
		out[k] = n
	}
	return out, nil
}

// defaultRecord is the default m of a record: a field it lacks takes the
// field's own default.
func defaultRecord(s *schema, m map[string]any) (any, error) {
	out := make(map[string]any, len(s.fields))
	for _, f := range s.fields {
		x, ok := m[f.name]
		if !ok {
			if !f.hasDefault {
				return nil, fmt.Errorf("record %s: field %s missing and has no default", s.name, f.name)
			}
			out[f.name] = f.def
			continue
		}
		n, err := defaultNative(f.typ, x)
		if err != nil {
			return nil, fmt.Errorf("field %s: %w", f.name, err)
		}
		out[f.name] = n
	}
	return out, nil
}

// RecordNames returns the full names of the records of schema, a record or
// a union of records, in order.
func RecordNames(schema string) ([]string, error) {
	ps, err := parseSchema(schema)
	if err != nil {
		return nil, err
	}
	records, err := topRecords(ps.root)
	if err != nil {
		return nil, err
	}
	out := make([]string, len(records))
	for i, r := range records {
		out[i] = r.name
	}
	return out, nil
}
