package ingest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"reflect"
	"strings"

	"github.com/onceflow/onceflow/pipeline"
)

// Route is one command route: a POST that accepts one command type for one
// aggregate, with the whole Idempotency-Key contract (docs/ingest.md). The
// body is a JSON object whose members are the command's fields; ingest
// decodes it strictly (unknown and repeated members are field errors),
// checks every string (UTF-8, no NUL, at most MaxStringBytes), then the
// command's own rules (pipeline.Validator) and Check, and reports every
// field error at once as a 422.
type Route struct {
	// Pattern is the method and path as net/http's ServeMux reads them,
	// "POST /v1/accounts/{id}/deposits". Required; the method is POST.
	Pattern string
	// Command is a zero value of the command type the route accepts: a
	// struct whose exported fields are the body's members, named by their
	// json tag (else the field's name). A field is required unless its tag
	// says omitempty; its kind is string, bool, an integer (any JSON
	// spelling of an integer is read exactly), float64 or []string.
	// Required.
	Command pipeline.Message
	// PathID names the path wildcard that holds the aggregate's local id
	// ("id" in /v1/accounts/{id}/deposits); BodyID instead names a string
	// member of the body that holds it and is not a field of the command
	// ("account_id"). Exactly one is required; the id is checked as a
	// local id (pipeline.ValidateLocalID).
	PathID, BodyID string
	// Name is the route's name in the request hash a retry with the same
	// Idempotency-Key must match. Default: the command type. Changing it
	// makes retries of requests accepted before the change a 409.
	Name string
	// Check, if set, adds the rules that need the aggregate's id as well
	// as the command (a transfer's source must not be its target).
	Check func(localID string, cmd pipeline.Message) []pipeline.FieldError
	// Summary and Description document the route in the OpenAPI document.
	Summary, Description string

	// Topic is the commands topic the command goes to, and Encoder encodes
	// it for that topic. The application sets both from the command type's
	// aggregate type; ingest.New requires them.
	Topic   string
	Encoder Encoder

	fields []bodyField
}

// Query is one read route: a GET answered from the read models, scoped to
// the caller's tenant.
type Query struct {
	// Pattern is "GET /v1/accounts/{id}". Required; the method is GET.
	Pattern string
	// Get answers the query for tenant with a value ingest writes as JSON
	// (200), or ErrNotFound (404, also for another tenant's resource), or
	// another error (503 when the database is away, else 500). db is a
	// read-only transaction scoped to tenant (TenantSetting): a read model
	// with row-level security shows it only tenant's rows, but its queries
	// still name their tenant. r's context carries the request's timeout.
	Get func(ctx context.Context, db DB, tenant string, r *http.Request) (any, error)
	// Response is a zero value of Get's answer, for the OpenAPI document.
	Response any
	// Summary and Description document the route.
	Summary, Description string
}

// ErrNotFound is a Query's answer for a resource the tenant does not have.
var ErrNotFound = errors.New("not found")

// bodyField is one member of a route's body: a field of the command.
type bodyField struct {
	name     string
	index    int
	kind     reflect.Kind
	optional bool
}

// prepare checks r and computes its body fields.
func (r *Route) prepare() error {
	method, path, ok := strings.Cut(r.Pattern, " ")
	if !ok || method != http.MethodPost || !strings.HasPrefix(path, "/") {
		return fmt.Errorf("route %q: want \"POST /path\"", r.Pattern)
	}
	if r.Command == nil {
		return fmt.Errorf("route %s: Command is required", r.Pattern)
	}
	if (r.PathID == "") == (r.BodyID == "") {
		return fmt.Errorf("route %s: set exactly one of PathID and BodyID", r.Pattern)
	}
	if r.PathID != "" && !strings.Contains(path, "{"+r.PathID+"}") {
		return fmt.Errorf("route %s: the path has no {%s}", r.Pattern, r.PathID)
	}
	if r.Name == "" {
		r.Name = r.Command.MessageType()
	}
	t := reflect.TypeOf(r.Command)
	if t.Kind() != reflect.Struct {
		return fmt.Errorf("route %s: Command is a %s, want a struct", r.Pattern, t)
	}
	r.fields = nil
	for i := range t.NumField() {
		f := t.Field(i)
		if !f.IsExported() {
			continue
		}
		name, opts, _ := strings.Cut(f.Tag.Get("json"), ",")
		if name == "-" {
			continue
		}
		if name == "" {
			name = f.Name
		}
		k := f.Type.Kind()
		switch {
		case k == reflect.String, k == reflect.Bool, k == reflect.Float64, k >= reflect.Int && k <= reflect.Int64,
			k == reflect.Slice && f.Type.Elem().Kind() == reflect.String:
		default:
			return fmt.Errorf("route %s: field %s is a %s; a body member is a string, bool, integer, float64 or []string", r.Pattern, f.Name, f.Type)
		}
		if name == r.BodyID {
			return fmt.Errorf("route %s: BodyID %q is also a field of %s", r.Pattern, name, t.Name())
		}
		r.fields = append(r.fields, bodyField{name: name, index: i, kind: k, optional: strings.Contains(opts, "omitempty")})
	}
	return nil
}

// members are the names a body may have.
func (r *Route) members() []string {
	out := make([]string, 0, len(r.fields)+1)
	if r.BodyID != "" {
		out = append(out, r.BodyID)
	}
	for _, f := range r.fields {
		out = append(out, f.name)
	}
	return out
}

// parse validates a request of the route into a command.
func (r *Route) parse(req *http.Request, body []byte, maxString int) (command, *Problem) {
	obj, errs, p := decodeObject(body, r.members()...)
	if p != nil {
		return command{}, p
	}
	var localID string
	if r.BodyID != "" {
		localID = obj.id(r.BodyID, &errs)
	} else {
		localID = req.PathValue(r.PathID)
		if err := pipeline.ValidateLocalID(localID); err != nil {
			errs = append(errs, FieldError{r.PathID, err.Error()})
		}
	}
	return r.build(localID, obj, errs, maxString)
}

// build makes the route's command from the members of obj, for the
// aggregate localID, adding to errs (a request's, or an inbound event's:
// its fields are members picked out of the delivery).
func (r *Route) build(localID string, obj object, errs []FieldError, maxString int) (command, *Problem) {
	v := reflect.New(reflect.TypeOf(r.Command)).Elem()
	canon := []any{r.Name, localID}
	failed := map[string]bool{}
	for _, f := range r.fields {
		n := len(errs)
		if raw, ok := obj[f.name]; ok && string(raw) != "null" || !f.optional {
			obj.set(f, v.Field(f.index), &errs)
		}
		if len(errs) > n {
			failed[f.name] = true
		}
		canon = append(canon, v.Field(f.index).Interface())
	}
	cmd, _ := v.Interface().(pipeline.Message)
	if len(errs) == 0 || len(failed) < len(r.fields) {
		// The command's own rules, on the fields that decoded.
		var fe pipeline.InvalidFields
		if err := pipeline.ValidateMessage(cmd, maxString); errors.As(err, &fe) {
			for _, e := range fe {
				if !failed[e.Field] {
					errs = append(errs, FieldError{e.Field, e.Message})
				}
			}
		}
		if r.Check != nil && len(errs) == 0 {
			for _, e := range r.Check(localID, cmd) {
				errs = append(errs, FieldError{e.Field, e.Message})
			}
		}
	}
	b, _ := json.Marshal(canon)
	return finish(errs, command{localID: localID, payload: cmd, canonical: b, route: r})
}

// set decodes the member f into dst.
func (o object) set(f bodyField, dst reflect.Value, errs *[]FieldError) {
	raw, ok := o[f.name]
	if !ok || string(raw) == "null" {
		*errs = append(*errs, FieldError{f.name, "is required"})
		return
	}
	switch f.kind {
	case reflect.String:
		if s, ok := o.str(f.name, errs); ok {
			dst.SetString(s)
		}
	case reflect.Bool:
		var b bool
		if raw[0] != 't' && raw[0] != 'f' || json.Unmarshal(raw, &b) != nil {
			*errs = append(*errs, FieldError{f.name, "must be true or false"})
			return
		}
		dst.SetBool(b)
	case reflect.Float64:
		var x float64
		if c := raw[0]; c != '-' && (c < '0' || c > '9') || json.Unmarshal(raw, &x) != nil {
			*errs = append(*errs, FieldError{f.name, "must be a number"})
			return
		}
		dst.SetFloat(x)
	case reflect.Slice:
		var ss []string
		if raw[0] != '[' || json.Unmarshal(raw, &ss) != nil {
			*errs = append(*errs, FieldError{f.name, "must be an array of strings"})
			return
		}
		dst.Set(reflect.ValueOf(ss).Convert(dst.Type()))
	default: // the integer kinds
		if c := raw[0]; c != '-' && (c < '0' || c > '9') {
			*errs = append(*errs, FieldError{f.name, "must be a number"})
			return
		}
		n, err := exactInt64(string(raw))
		if err == nil && dst.OverflowInt(n) {
			err = fmt.Errorf("must be between %d and %d", -(int64(1) << (dst.Type().Bits() - 1)), int64(1)<<(dst.Type().Bits()-1)-1)
		}
		if err != nil {
			*errs = append(*errs, FieldError{f.name, err.Error()})
			return
		}
		dst.SetInt(n)
	}
}
