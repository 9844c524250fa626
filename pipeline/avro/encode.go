package avro

import (
	"fmt"
	"math"
	"reflect"
	"strings"
	"sync"
	"time"
	"unicode"

	"github.com/onceflow/onceflow/pipeline"
)

var (
	typeTime    = reflect.TypeFor[time.Time]()
	typeMessage = reflect.TypeFor[pipeline.Message]()
)

// structInfo is how a Go struct type maps to Avro record fields.
type structInfo struct {
	fields []structField
	byName map[string]int // Avro name -> index in fields
}

type structField struct {
	index  int    // in the struct
	name   string // Avro field name
	goName string
}

var structInfos sync.Map // reflect.Type -> *structInfo

// structInfoOf returns the field mapping of struct type t: exported fields
// by their `avro:"name"` tag, else the snake_case of the field name;
// `avro:"-"` skips a field. It is computed once per type.
func structInfoOf(t reflect.Type) (*structInfo, error) {
	if si, ok := structInfos.Load(t); ok {
		return si.(*structInfo), nil
	}
	si := &structInfo{byName: map[string]int{}}
	for i := range t.NumField() {
		f := t.Field(i)
		tag, tagged := f.Tag.Lookup("avro")
		if !f.IsExported() || tag == "-" {
			continue
		}
		if f.Anonymous && !tagged {
			return nil, fmt.Errorf("embedded field %s.%s: give it an avro tag or a name", t, f.Name)
		}
		name := tag
		if name == "" {
			name = snakeCase(f.Name)
		}
		if prev, dup := si.byName[name]; dup {
			return nil, fmt.Errorf("fields %s.%s and %s.%s both map to Avro field %q", t, si.fields[prev].goName, t, f.Name, name)
		}
		si.byName[name] = len(si.fields)
		si.fields = append(si.fields, structField{index: i, name: name, goName: f.Name})
	}
	si2, _ := structInfos.LoadOrStore(t, si)
	return si2.(*structInfo), nil
}

// Fields returns a struct's fields by the names its Avro records give
// them (the avro tag, else the snake_case of the Go name; `avro:"-"`
// fields left out), so a copy of an event kept elsewhere, such as the
// audit log's JSON, reads like the topic.
func Fields(v any) (map[string]any, error) {
	rv := reflect.ValueOf(v)
	for rv.Kind() == reflect.Pointer && !rv.IsNil() {
		rv = rv.Elem()
	}
	if rv.Kind() != reflect.Struct {
		return nil, fmt.Errorf("avro fields of %T: not a struct", v)
	}
	si, err := structInfoOf(rv.Type())
	if err != nil {
		return nil, err
	}
	out := make(map[string]any, len(si.fields))
	for _, f := range si.fields {
		out[f.name] = rv.Field(f.index).Interface()
	}
	return out, nil
}

// snakeCase turns a Go field name into an Avro one: TransferID ->
// transfer_id, AtMS -> at_ms, HTTPStatus -> http_status.
func snakeCase(s string) string {
	rs := []rune(s)
	var b strings.Builder
	for i, r := range rs {
		if unicode.IsUpper(r) {
			prevLower := i > 0 && (unicode.IsLower(rs[i-1]) || unicode.IsDigit(rs[i-1]))
			nextLower := i > 0 && i+1 < len(rs) && unicode.IsUpper(rs[i-1]) && unicode.IsLower(rs[i+1])
			if prevLower || nextLower {
				b.WriteByte('_')
			}
			r = unicode.ToLower(r)
		}
		b.WriteRune(r)
	}
	return b.String()
}

// builder builds the encoders and decoders of one Serde.
type builder struct {
	types map[string]reflect.Type // record full name -> Go type
}

// encoder converts a Go value into goavro's native form of one schema.
type encoder func(v reflect.Value) (any, error)

func isByteSlice(t reflect.Type) bool {
	return t.Kind() == reflect.Slice && t.Elem().Kind() == reflect.Uint8
}

func isByteArray(t reflect.Type, n int) bool {
	return t.Kind() == reflect.Array && t.Elem().Kind() == reflect.Uint8 && t.Len() == n
}

func isTimestamp(s *schema) bool {
	return s.logical == logicalTimestampMillis || s.logical == logicalTimestampMicros
}

func cannotHold(path string, t reflect.Type, s *schema, hint string) error {
	if hint != "" {
		hint = " (" + hint + ")"
	}
	return fmt.Errorf("%s: Go type %s cannot hold %s%s", path, t, s.describe(), hint)
}

// encoder returns the encoder of Go type t for schema s. Its errors are
// what NewSerde reports for a Go type that does not fit its schema.
func (b *builder) encoder(s *schema, t reflect.Type, path string) (encoder, error) {
	if s.kind == kindUnion {
		return b.unionEncoder(s, t, path)
	}
	if t.Kind() == reflect.Pointer {
		return nil, cannotHold(path, t, s, "pointers are for unions with null")
	}
	var enc encoder
	var err error
	switch s.kind {
	case kindBoolean:
		if t.Kind() == reflect.Bool {
			enc = func(v reflect.Value) (any, error) { return v.Bool(), nil }
		}
	case kindInt, kindLong, kindFloat, kindDouble:
		enc, err = numberEncoder(s, t, path)
	case kindBytes, kindString, kindFixed, kindEnum:
		enc = byteEncoder(s, t, path)
	case kindArray:
		if t.Kind() == reflect.Slice && !isByteSlice(t) {
			enc, err = b.arrayEncoder(s, t, path)
		}
	case kindMap:
		if t.Kind() == reflect.Map && t.Key().Kind() == reflect.String {
			enc, err = b.mapEncoder(s, t, path)
		}
	case kindRecord:
		if t.Kind() == reflect.Struct && t != typeTime {
			return b.recordEncoder(s, t, path)
		}
	}
	if enc == nil && err == nil {
		err = cannotHold(path, t, s, "")
	}
	return enc, err
}

// numberEncoder is the encoder of t for an int, long, float or double,
// or nil when t cannot hold it.
func numberEncoder(s *schema, t reflect.Type, path string) (encoder, error) {
	switch s.kind {
	case kindInt:
		switch t.Kind() {
		case reflect.Int32:
			return func(v reflect.Value) (any, error) { return int32(v.Int()), nil }, nil
		case reflect.Int, reflect.Int64:
			return func(v reflect.Value) (any, error) {
				n := v.Int()
				if n < math.MinInt32 || n > math.MaxInt32 {
					return nil, fmt.Errorf("%s: %d overflows Avro int", path, n)
				}
				return int32(n), nil
			}, nil
		}
	case kindLong:
		if t == typeTime {
			switch s.logical {
			case logicalTimestampMillis:
				return func(v reflect.Value) (any, error) { return v.Interface().(time.Time).UnixMilli(), nil }, nil
			case logicalTimestampMicros:
				return func(v reflect.Value) (any, error) { return v.Interface().(time.Time).UnixMicro(), nil }, nil
			}
			return nil, cannotHold(path, t, s, "time.Time needs logicalType timestamp-millis or timestamp-micros")
		}
		switch t.Kind() { // not int32: it could not hold every long the field may carry
		case reflect.Int, reflect.Int64:
			return func(v reflect.Value) (any, error) { return v.Int(), nil }, nil
		}
	case kindFloat:
		switch t.Kind() {
		case reflect.Float32, reflect.Float64:
			return func(v reflect.Value) (any, error) { return float32(v.Float()), nil }, nil
		}
	case kindDouble:
		if t.Kind() == reflect.Float64 { // not float32: it would round what it reads
			return func(v reflect.Value) (any, error) { return v.Float(), nil }, nil
		}
	}
	return nil, nil
}

// byteEncoder is the encoder of t for bytes, a string, a fixed or an
// enum, or nil when t cannot hold it.
func byteEncoder(s *schema, t reflect.Type, path string) encoder {
	switch s.kind {
	case kindBytes:
		switch {
		case isByteSlice(t):
			return func(v reflect.Value) (any, error) { return v.Bytes(), nil }
		case t.Kind() == reflect.String:
			return func(v reflect.Value) (any, error) { return v.String(), nil }
		}
	case kindString:
		switch {
		case t.Kind() == reflect.String:
			return func(v reflect.Value) (any, error) { return v.String(), nil }
		case isByteSlice(t):
			return func(v reflect.Value) (any, error) { return v.Bytes(), nil }
		case isByteArray(t, 16): // a UUID, in its canonical text form
			return func(v reflect.Value) (any, error) {
				var id pipeline.ID
				reflect.Copy(reflect.ValueOf(id[:]), v)
				return id.String(), nil
			}
		}
	case kindFixed:
		switch {
		case isByteArray(t, s.size):
			return func(v reflect.Value) (any, error) {
				buf := make([]byte, s.size)
				reflect.Copy(reflect.ValueOf(buf), v)
				return buf, nil
			}
		case isByteSlice(t):
			return func(v reflect.Value) (any, error) {
				if v.Len() != s.size {
					return nil, fmt.Errorf("%s: %d bytes for fixed %s of size %d", path, v.Len(), s.name, s.size)
				}
				return v.Bytes(), nil
			}
		}
	case kindEnum:
		if t.Kind() == reflect.String {
			return func(v reflect.Value) (any, error) {
				sym := v.String()
				if s.symbol(sym) < 0 {
					return nil, fmt.Errorf("%s: %q is not a symbol of enum %s", path, sym, s.name)
				}
				return sym, nil
			}
		}
	}
	return nil
}

func (b *builder) arrayEncoder(s *schema, t reflect.Type, path string) (encoder, error) {
	item, err := b.encoder(s.items, t.Elem(), path+"[]")
	if err != nil {
		return nil, err
	}
	return func(v reflect.Value) (any, error) {
		out := make([]any, v.Len())
		for i := range out {
			x, err := item(v.Index(i))
			if err != nil {
				return nil, err
			}
			out[i] = x
		}
		return out, nil
	}, nil
}

func (b *builder) mapEncoder(s *schema, t reflect.Type, path string) (encoder, error) {
	val, err := b.encoder(s.values, t.Elem(), path+"{}")
	if err != nil {
		return nil, err
	}
	return func(v reflect.Value) (any, error) {
		out := make(map[string]any, v.Len())
		for it := v.MapRange(); it.Next(); {
			x, err := val(it.Value())
			if err != nil {
				return nil, err
			}
			out[it.Key().String()] = x
		}
		return out, nil
	}, nil
}

func (b *builder) recordEncoder(s *schema, t reflect.Type, path string) (encoder, error) {
	si, err := structInfoOf(t)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	type fieldEncoder struct {
		name  string
		index int // in the struct; -1 writes def
		def   any
		enc   encoder
	}
	fes := make([]fieldEncoder, 0, len(s.fields))
	used := make([]bool, len(si.fields))
	for _, f := range s.fields {
		i, ok := si.byName[f.name]
		if !ok {
			if !f.hasDefault {
				return nil, fmt.Errorf("%s: field %s of record %s has no Go field in %s and no default (tag a field `avro:%q`)", path, f.name, s.name, t, f.name)
			}
			fes = append(fes, fieldEncoder{name: f.name, index: -1, def: f.def})
			continue
		}
		used[i] = true
		sf := si.fields[i]
		enc, err := b.encoder(f.typ, t.Field(sf.index).Type, path+"."+f.name)
		if err != nil {
			return nil, err
		}
		fes = append(fes, fieldEncoder{name: f.name, index: sf.index, enc: enc})
	}
	for i, sf := range si.fields {
		if !used[i] {
			return nil, fmt.Errorf("%s: Go field %s.%s (Avro name %q) is not a field of record %s", path, t, sf.goName, sf.name, s.name)
		}
	}
	return func(v reflect.Value) (any, error) {
		m := make(map[string]any, len(fes))
		for _, fe := range fes {
			if fe.index < 0 {
				m[fe.name] = fe.def
				continue
			}
			x, err := fe.enc(v.Field(fe.index))
			if err != nil {
				return nil, err
			}
			m[fe.name] = x
		}
		return m, nil
	}, nil
}

// unionEncoder maps a Go type onto a union:
//   - an interface holds records of the union, by their registered Go types;
//   - a pointer is a union with null: nil writes null;
//   - any other type writes the first branch that can hold it.
func (b *builder) unionEncoder(s *schema, t reflect.Type, path string) (encoder, error) {
	hasNull := false
	for _, br := range s.branches {
		hasNull = hasNull || br.kind == kindNull
	}
	if t.Kind() == reflect.Interface {
		type branch struct {
			key string
			enc encoder
		}
		byType := map[reflect.Type]branch{}
		for _, br := range s.branches {
			if br.kind == kindNull {
				continue
			}
			gt, err := b.branchType(br, t, path)
			if err != nil {
				return nil, err
			}
			enc, err := b.encoder(br, gt, path+"<"+br.name+">")
			if err != nil {
				return nil, err
			}
			byType[gt] = branch{br.name, enc}
		}
		return func(v reflect.Value) (any, error) {
			if !v.IsNil() {
				v = v.Elem()
			}
			if v.Kind() == reflect.Pointer && !v.IsNil() {
				v = v.Elem()
			}
			if v.Kind() == reflect.Interface || v.Kind() == reflect.Pointer {
				if hasNull {
					return nil, nil
				}
				return nil, fmt.Errorf("%s: nil for a union without null", path)
			}
			br, ok := byType[v.Type()]
			if !ok {
				return nil, fmt.Errorf("%s: Go type %s is not a branch of %s", path, v.Type(), s.describe())
			}
			x, err := br.enc(v)
			if err != nil {
				return nil, err
			}
			return map[string]any{br.key: x}, nil
		}, nil
	}
	ptr := t.Kind() == reflect.Pointer
	if ptr && !hasNull {
		return nil, cannotHold(path, t, s, "a pointer needs a union with null")
	}
	et := t
	if ptr {
		et = t.Elem()
	}
	for _, br := range s.branches {
		if br.kind == kindNull {
			continue
		}
		enc, err := b.encoder(br, et, path)
		if err != nil {
			continue
		}
		key := br.branchName()
		if ptr {
			return func(v reflect.Value) (any, error) {
				if v.IsNil() {
					return nil, nil
				}
				x, err := enc(v.Elem())
				if err != nil {
					return nil, err
				}
				return map[string]any{key: x}, nil
			}, nil
		}
		return func(v reflect.Value) (any, error) {
			x, err := enc(v)
			if err != nil {
				return nil, err
			}
			return map[string]any{key: x}, nil
		}, nil
	}
	return nil, cannotHold(path, t, s, "no branch fits")
}

// branchType returns the Go type registered for a record branch of a union
// held in an interface of type it.
func (b *builder) branchType(br *schema, it reflect.Type, path string) (reflect.Type, error) {
	if br.kind != kindRecord {
		return nil, fmt.Errorf("%s: an interface (%s) can hold records only, not %s", path, it, br.describe())
	}
	gt, ok := b.types[br.name]
	if !ok {
		return nil, fmt.Errorf("%s: no Go type for union branch %s (add it to types)", path, br.name)
	}
	if !gt.Implements(it) {
		return nil, fmt.Errorf("%s: %s (for %s) does not implement %s", path, gt, br.name, it)
	}
	return gt, nil
}
