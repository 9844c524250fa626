package avro

import (
	"fmt"
	"reflect"
	"time"

	"github.com/onceflow/onceflow/pipeline"
)

// decoder stores goavro's native form of a datum written with a writer
// schema into dst, a settable value of the Go type of the reader schema.
// It applies Avro schema resolution on the way: goavro decodes with the
// writer's schema only.
type decoder func(native any, dst reflect.Value) error

func incompatible(path, format string, args ...any) error {
	return fmt.Errorf("%w: %s: %s", ErrIncompatible, path, fmt.Sprintf(format, args...))
}

func unexpected(path string, native any, want string) error {
	return fmt.Errorf("%w: %s: decoded %T, want %s", ErrMalformed, path, native, want)
}

// failing is the decoder of a writer branch that cannot be resolved: per
// the Avro spec it is an error only when data actually uses that branch.
func failing(err error) decoder {
	return func(any, reflect.Value) error { return err }
}

// decoder returns the decoder from writer schema w to reader schema r and
// its Go type t. Plan-time errors wrap ErrIncompatible.
func (b *builder) decoder(w, r *schema, t reflect.Type, path string) (decoder, error) {
	if w.kind == kindUnion {
		return b.writerUnionDecoder(w, r, t, path)
	}
	if r.kind == kindUnion {
		return b.readerUnionDecoder(w, r, t, path)
	}
	switch {
	case w.kind == kindNull && r.kind == kindNull:
		return func(_ any, dst reflect.Value) error { dst.SetZero(); return nil }, nil
	case w.kind == kindRecord && r.kind == kindRecord:
		if w.shortName() != r.shortName() {
			return nil, incompatible(path, "writer record %s, reader record %s", w.name, r.name)
		}
		return b.recordDecoder(w, r, t, path)
	case w.kind == kindArray && r.kind == kindArray:
		item, err := b.decoder(w.items, r.items, t.Elem(), path+"[]")
		if err != nil {
			return nil, err
		}
		return func(native any, dst reflect.Value) error {
			a, ok := native.([]any)
			if !ok {
				return unexpected(path, native, "[]any")
			}
			if len(a) == 0 { // nil, as a Go zero value
				dst.SetZero()
				return nil
			}
			sl := reflect.MakeSlice(t, len(a), len(a))
			for i, x := range a {
				if err := item(x, sl.Index(i)); err != nil {
					return err
				}
			}
			dst.Set(sl)
			return nil
		}, nil
	case w.kind == kindMap && r.kind == kindMap:
		val, err := b.decoder(w.values, r.values, t.Elem(), path+"{}")
		if err != nil {
			return nil, err
		}
		kt, et := t.Key(), t.Elem()
		return func(native any, dst reflect.Value) error {
			m, ok := native.(map[string]any)
			if !ok {
				return unexpected(path, native, "map[string]any")
			}
			if len(m) == 0 {
				dst.SetZero()
				return nil
			}
			out := reflect.MakeMapWithSize(t, len(m))
			for k, x := range m {
				ev := reflect.New(et).Elem()
				if err := val(x, ev); err != nil {
					return err
				}
				out.SetMapIndex(reflect.ValueOf(k).Convert(kt), ev)
			}
			dst.Set(out)
			return nil
		}, nil
	case w.kind == kindEnum && r.kind == kindEnum:
		return b.enumDecoder(w, r, t, path)
	case w.kind == kindFixed && r.kind == kindFixed:
		if w.shortName() != r.shortName() || w.size != r.size {
			return nil, incompatible(path, "writer fixed %s (size %d), reader fixed %s (size %d)", w.name, w.size, r.name, r.size)
		}
		return leafDecoder(w, r, t, path)
	}
	if promotable(w.kind, r.kind) {
		return leafDecoder(w, r, t, path)
	}
	return nil, incompatible(path, "writer has %s, reader has %s", w.describe(), r.describe())
}

// promotable reports whether a primitive written as w can be read as r.
func promotable(w, r kind) bool {
	if w == r {
		return w <= kindString
	}
	switch w {
	case kindInt:
		return r == kindLong || r == kindFloat || r == kindDouble
	case kindLong:
		return r == kindFloat || r == kindDouble
	case kindFloat:
		return r == kindDouble
	case kindString:
		return r == kindBytes
	case kindBytes:
		return r == kindString
	}
	return false
}

// writerUnionDecoder resolves each branch the writer may have written.
func (b *builder) writerUnionDecoder(w, r *schema, t reflect.Type, path string) (decoder, error) {
	byKey := make(map[string]decoder, len(w.branches))
	var null decoder
	for _, wb := range w.branches {
		d, err := b.decoder(wb, r, t, path)
		if err != nil {
			d = failing(err)
		}
		if wb.kind == kindNull {
			null = d
		}
		byKey[wb.branchName()] = d
	}
	return func(native any, dst reflect.Value) error {
		if native == nil {
			if null == nil {
				return unexpected(path, native, "a union branch")
			}
			return null(nil, dst)
		}
		m, ok := native.(map[string]any)
		if !ok || len(m) != 1 {
			return unexpected(path, native, "a union branch")
		}
		for k, x := range m {
			d, ok := byKey[k]
			if !ok {
				return unexpected(path, native, "a union branch")
			}
			return d(x, dst)
		}
		return nil
	}, nil
}

// readerUnionDecoder reads a writer's non-union type into a reader union:
// into the first branch that matches exactly, else the first the writer's
// type promotes to. Named types match by full name.
func (b *builder) readerUnionDecoder(w, r *schema, t reflect.Type, path string) (decoder, error) {
	var rb *schema
	for _, exact := range []bool{true, false} {
		for _, br := range r.branches {
			if branchMatches(w, br, exact) {
				rb = br
				break
			}
		}
		if rb != nil {
			break
		}
	}
	if rb == nil {
		name := w.describe()
		if w.name != "" {
			name = w.name
		}
		return nil, incompatible(path, "unknown type %s: the reader's %s has no such branch", name, r.describe())
	}
	if rb.kind == kindNull {
		return func(_ any, dst reflect.Value) error { dst.SetZero(); return nil }, nil
	}
	switch t.Kind() {
	case reflect.Interface:
		gt, err := b.branchType(rb, t, path)
		if err != nil {
			return nil, incompatible(path, "%v", err)
		}
		d, err := b.decoder(w, rb, gt, path+"<"+rb.name+">")
		if err != nil {
			return nil, err
		}
		return func(native any, dst reflect.Value) error {
			v := reflect.New(gt).Elem()
			if err := d(native, v); err != nil {
				return err
			}
			dst.Set(v)
			return nil
		}, nil
	case reflect.Pointer:
		et := t.Elem()
		d, err := b.decoder(w, rb, et, path)
		if err != nil {
			return nil, err
		}
		return func(native any, dst reflect.Value) error {
			p := reflect.New(et)
			if err := d(native, p.Elem()); err != nil {
				return err
			}
			dst.Set(p)
			return nil
		}, nil
	}
	return b.decoder(w, rb, t, path)
}

func branchMatches(w, r *schema, exact bool) bool {
	if w.kind != r.kind {
		return !exact && promotable(w.kind, r.kind)
	}
	switch w.kind {
	case kindRecord, kindEnum, kindFixed:
		return w.name == r.name
	}
	return true
}

func (b *builder) recordDecoder(w, r *schema, t reflect.Type, path string) (decoder, error) {
	if t.Kind() != reflect.Struct {
		return nil, incompatible(path, "Go type %s for record %s", t, r.name)
	}
	si, err := structInfoOf(t)
	if err != nil {
		return nil, incompatible(path, "%v", err)
	}
	type fieldDecoder struct {
		wname string // "" reads def
		def   any
		index int
		dec   decoder
	}
	fds := make([]fieldDecoder, 0, len(r.fields))
	for _, rf := range r.fields {
		i, ok := si.byName[rf.name]
		if !ok {
			continue // NewSerde checked it has a default; nothing holds it
		}
		sf := si.fields[i]
		ft := t.Field(sf.index).Type
		fpath := path + "." + rf.name
		wf := w.writerField(rf)
		if wf == nil {
			if !rf.hasDefault {
				return nil, incompatible(fpath, "the writer's record %s lacks the field and the reader's has no default", w.name)
			}
			d, err := b.decoder(rf.typ, rf.typ, ft, fpath)
			if err != nil {
				return nil, err
			}
			fds = append(fds, fieldDecoder{def: rf.def, index: sf.index, dec: d})
			continue
		}
		d, err := b.decoder(wf.typ, rf.typ, ft, fpath)
		if err != nil {
			return nil, err
		}
		fds = append(fds, fieldDecoder{wname: wf.name, index: sf.index, dec: d})
	}
	return func(native any, dst reflect.Value) error {
		m, ok := native.(map[string]any)
		if !ok {
			return unexpected(path, native, "map[string]any")
		}
		for _, fd := range fds {
			x := fd.def
			if fd.wname != "" {
				x = m[fd.wname]
			}
			if err := fd.dec(x, dst.Field(fd.index)); err != nil {
				return err
			}
		}
		return nil
	}, nil
}

func (b *builder) enumDecoder(w, r *schema, t reflect.Type, path string) (decoder, error) {
	if w.shortName() != r.shortName() {
		return nil, incompatible(path, "writer enum %s, reader enum %s", w.name, r.name)
	}
	if t.Kind() != reflect.String {
		return nil, incompatible(path, "Go type %s for enum %s", t, r.name)
	}
	symbols := make(map[string]string, len(w.symbols))
	for _, sym := range w.symbols {
		switch {
		case r.symbol(sym) >= 0:
			symbols[sym] = sym
		case r.hasEnumDef:
			symbols[sym] = r.enumDef
		}
	}
	return func(native any, dst reflect.Value) error {
		s, ok := native.(string)
		if !ok {
			return unexpected(path, native, "string")
		}
		sym, ok := symbols[s]
		if !ok {
			return incompatible(path, "unknown symbol %q: the reader's enum %s has no such symbol and no default", s, r.name)
		}
		dst.SetString(sym)
		return nil
	}, nil
}

// leafDecoder decodes primitives (after promotion) and fixed values into the
// Go type t chosen for the reader schema r.
func leafDecoder(w, r *schema, t reflect.Type, path string) (decoder, error) {
	var d decoder
	switch {
	case t == typeTime:
		d = timeDecoder(w, r, path)
	case t.Kind() == reflect.Bool:
		d = func(native any, dst reflect.Value) error {
			v, ok := native.(bool)
			if !ok {
				return unexpected(path, native, "bool")
			}
			dst.SetBool(v)
			return nil
		}
	case t.Kind() == reflect.Int || t.Kind() == reflect.Int32 || t.Kind() == reflect.Int64:
		if r.kind != kindLong || t.Kind() != reflect.Int32 {
			d = intDecoder(t, path)
		}
	case t.Kind() == reflect.Float32 || t.Kind() == reflect.Float64:
		d = floatDecoder(path)
	case t.Kind() == reflect.String:
		d = func(native any, dst reflect.Value) error {
			switch v := native.(type) {
			case string:
				dst.SetString(v)
			case []byte:
				dst.SetString(string(v))
			default:
				return unexpected(path, native, "string or bytes")
			}
			return nil
		}
	case isByteSlice(t):
		d = func(native any, dst reflect.Value) error {
			switch v := native.(type) {
			case []byte: // aliases the record: copy
				dst.SetBytes(append([]byte(nil), v...))
			case string:
				dst.SetBytes([]byte(v))
			default:
				return unexpected(path, native, "bytes or string")
			}
			return nil
		}
	case t.Kind() == reflect.Array && t.Elem().Kind() == reflect.Uint8:
		d = byteArrayDecoder(r, t, path)
	}
	if d == nil {
		return nil, incompatible(path, "Go type %s cannot hold %s", t, r.describe())
	}
	return d, nil
}

// timeDecoder decodes a timestamp into a time.Time, or is nil when r is
// no timestamp.
func timeDecoder(w, r *schema, path string) decoder {
	if !isTimestamp(r) {
		return nil
	}
	unit := r.logical // a long the writer wrote without logical type is in the reader's unit
	if isTimestamp(w) {
		unit = w.logical
	}
	return func(native any, dst reflect.Value) error {
		n, ok := toInt64(native)
		if !ok {
			return unexpected(path, native, "an integer")
		}
		var tm time.Time
		if unit == logicalTimestampMicros {
			tm = time.UnixMicro(n).UTC()
		} else {
			tm = time.UnixMilli(n).UTC()
		}
		dst.Set(reflect.ValueOf(tm))
		return nil
	}
}

func intDecoder(t reflect.Type, path string) decoder {
	return func(native any, dst reflect.Value) error {
		n, ok := toInt64(native)
		if !ok {
			return unexpected(path, native, "an integer")
		}
		if dst.OverflowInt(n) {
			return fmt.Errorf("%w: %s: %d overflows %s", ErrMalformed, path, n, t)
		}
		dst.SetInt(n)
		return nil
	}
}

func floatDecoder(path string) decoder {
	return func(native any, dst reflect.Value) error {
		var f float64
		switch v := native.(type) {
		case int32:
			f = float64(v)
		case int64:
			f = float64(v)
		case float32:
			f = float64(v)
		case float64:
			f = v
		default:
			return unexpected(path, native, "a number")
		}
		dst.SetFloat(f)
		return nil
	}
}

// byteArrayDecoder decodes a fixed of t's length into t, or a string
// holding a UUID into a [16]byte; nil for anything else.
func byteArrayDecoder(r *schema, t reflect.Type, path string) decoder {
	switch {
	case r.kind == kindFixed && t.Len() == r.size:
		return func(native any, dst reflect.Value) error {
			v, ok := native.([]byte)
			if !ok || len(v) != t.Len() {
				return unexpected(path, native, fmt.Sprintf("%d bytes", t.Len()))
			}
			reflect.Copy(dst, reflect.ValueOf(v))
			return nil
		}
	case r.kind == kindString && t.Len() == 16:
		return func(native any, dst reflect.Value) error {
			var s string
			switch v := native.(type) {
			case string:
				s = v
			case []byte:
				s = string(v)
			default:
				return unexpected(path, native, "string")
			}
			id, err := pipeline.ParseID(s)
			if err != nil {
				return fmt.Errorf("%w: %s: %q is not a UUID", ErrMalformed, path, s)
			}
			reflect.Copy(dst, reflect.ValueOf(id[:]))
			return nil
		}
	}
	return nil
}

func toInt64(native any) (int64, bool) {
	switch v := native.(type) {
	case int32:
		return int64(v), true
	case int64:
		return v, true
	}
	return 0, false
}
