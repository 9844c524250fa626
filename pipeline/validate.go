package pipeline

import (
	"errors"
	"fmt"
	"reflect"
	"strings"
	"unicode/utf8"
)

// Validator is implemented by a command whose fields have rules beyond
// their types: an amount above zero, an id in the local-id alphabet, a
// currency code. Ingest checks an HTTP request with the same rules before
// it accepts it, and the processor checks a command produced straight to
// Kafka with them before deciding (a failing command goes to the DLQ), so
// both doors let in the same commands. Validate returns nil or an
// InvalidFields.
type Validator interface {
	Validate() error
}

// FieldError is one field of a command that breaks a rule.
type FieldError struct {
	Field   string `json:"field"`
	Message string `json:"message"`
}

// InvalidFields lists the fields of a command that break a rule, all at
// once, so a client can fix them in one round.
type InvalidFields []FieldError

func (e InvalidFields) Error() string {
	var b strings.Builder
	b.WriteString("invalid fields: ")
	for i, f := range e {
		if i > 0 {
			b.WriteString("; ")
		}
		b.WriteString(f.Field)
		b.WriteString(" ")
		b.WriteString(f.Message)
	}
	return b.String()
}

// DefaultMaxStringBytes bounds each string of a command unless
// configured otherwise: the same bound at both doors, ingest and the
// processor.
const DefaultMaxStringBytes = 4096

// ValidateMessage checks a decoded command: every string in it (fields of
// nested records, arrays and maps included) is valid UTF-8, holds no NUL
// and is at most maxString bytes long; then the message's own rules, if it
// is a Validator. The error is an InvalidFields.
func ValidateMessage(m Message, maxString int) error {
	var errs InvalidFields
	checkStrings(reflect.ValueOf(m), "", maxString, &errs)
	if len(errs) > 0 {
		return errs
	}
	if v, ok := m.(Validator); ok {
		if err := v.Validate(); err != nil {
			var fe InvalidFields
			if errors.As(err, &fe) {
				return fe
			}
			return InvalidFields{{Field: "", Message: err.Error()}}
		}
	}
	return nil
}

// CheckString reports what is wrong with a string field's value, or "".
func CheckString(s string, max int) string {
	switch {
	case len(s) > max:
		return fmt.Sprintf("must be at most %d bytes (is %d)", max, len(s))
	case !utf8.ValidString(s):
		return "must be valid UTF-8"
	case strings.IndexByte(s, 0) >= 0:
		return "must not contain NUL"
	}
	return ""
}

func checkStrings(v reflect.Value, path string, max int, errs *InvalidFields) {
	switch v.Kind() {
	case reflect.String:
		if msg := CheckString(v.String(), max); msg != "" {
			*errs = append(*errs, FieldError{Field: path, Message: msg})
		}
	case reflect.Pointer, reflect.Interface:
		if !v.IsNil() {
			checkStrings(v.Elem(), path, max, errs)
		}
	case reflect.Struct:
		t := v.Type()
		for i := range v.NumField() {
			f := t.Field(i)
			if !f.IsExported() {
				continue
			}
			checkStrings(v.Field(i), join(path, fieldName(f)), max, errs)
		}
	case reflect.Slice, reflect.Array:
		if v.Type().Elem().Kind() == reflect.Uint8 {
			return // bytes
		}
		for i := range v.Len() {
			checkStrings(v.Index(i), fmt.Sprintf("%s[%d]", path, i), max, errs)
		}
	case reflect.Map:
		it := v.MapRange()
		for it.Next() {
			k := it.Key()
			if k.Kind() == reflect.String {
				if msg := CheckString(k.String(), max); msg != "" {
					*errs = append(*errs, FieldError{Field: path + " key", Message: msg})
					continue
				}
			}
			checkStrings(it.Value(), fmt.Sprintf("%s[%v]", path, k), max, errs)
		}
	}
}

// fieldName is the field's name as the schemas spell it: its avro tag,
// else its json tag, else its Go name.
func fieldName(f reflect.StructField) string {
	for _, tag := range []string{"avro", "json"} {
		if name, _, _ := strings.Cut(f.Tag.Get(tag), ","); name != "" && name != "-" {
			return name
		}
	}
	return f.Name
}

func join(path, name string) string {
	if path == "" {
		return name
	}
	return path + "." + name
}
