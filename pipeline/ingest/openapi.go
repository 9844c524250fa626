package ingest

import (
	"encoding/json"
	"fmt"
	"reflect"
	"regexp"
	"strings"
	"unicode"

	"github.com/onceflow/onceflow/openapi"
	"github.com/onceflow/onceflow/pipeline"
)

// OpenAPI returns the OpenAPI 3.1 document of a server with routes and
// queries: the shared part (package openapi) with an operation for each
// route, its body's schema derived from the command's fields (a field's
// `doc` tag describes it, its `pattern` tag is the regular expression its
// value matches), and one for each query, its answer's schema
// derived from Query.Response.
func OpenAPI(routes []Route, queries []Query) ([]byte, error) {
	var doc map[string]any
	if err := json.Unmarshal(openapi.Base, &doc); err != nil {
		return nil, fmt.Errorf("openapi base: %w", err)
	}
	paths := doc["paths"].(map[string]any)
	schemas := doc["components"].(map[string]any)["schemas"].(map[string]any)
	op := func(pattern string) (map[string]any, error) {
		method, path, _ := strings.Cut(pattern, " ")
		item, _ := paths[path].(map[string]any)
		if item == nil {
			item = map[string]any{}
			paths[path] = item
		}
		m := strings.ToLower(method)
		if item[m] != nil {
			return nil, fmt.Errorf("openapi: %s is declared twice", pattern)
		}
		o := map[string]any{}
		item[m] = o
		return o, nil
	}
	for i := range routes {
		r := routes[i]
		if err := r.prepare(); err != nil {
			return nil, err
		}
		o, err := op(r.Pattern)
		if err != nil {
			return nil, err
		}
		name := r.Command.MessageType()
		o["operationId"] = lowerFirst(name)
		o["summary"] = or(r.Summary, name)
		if r.Description != "" {
			o["description"] = r.Description
		}
		o["tags"] = []string{"commands"}
		params := pathParams(r.Pattern, r.PathID)
		params = append(params, map[string]any{"$ref": "#/components/parameters/IdempotencyKey"})
		o["parameters"] = params
		body := name + "Request"
		schemas[body] = bodySchema(&r)
		o["requestBody"] = map[string]any{"required": true, "content": map[string]any{
			"application/json": map[string]any{"schema": map[string]any{"$ref": "#/components/schemas/" + body}}}}
		o["responses"] = refs(map[string]string{"202": "Accepted", "400": "BadRequest", "401": "Unauthorized", "409": "KeyReused",
			"413": "TooLarge", "415": "UnsupportedMediaType", "422": "Invalid", "429": "RateLimited", "500": "Internal", "503": "Unavailable"})
	}
	for _, q := range queries {
		o, err := op(q.Pattern)
		if err != nil {
			return nil, err
		}
		_, path, _ := strings.Cut(q.Pattern, " ")
		o["operationId"] = "get" + operationName(path)
		o["summary"] = or(q.Summary, q.Pattern)
		if q.Description != "" {
			o["description"] = q.Description
		}
		o["tags"] = []string{"queries"}
		o["parameters"] = pathParams(q.Pattern, "")
		answer := map[string]any{"type": "object"}
		if q.Response != nil {
			t := reflect.TypeOf(q.Response)
			schemas[t.Name()] = valueSchema(t)
			answer = map[string]any{"$ref": "#/components/schemas/" + t.Name()}
		}
		resp := refs(map[string]string{"401": "Unauthorized", "404": "NotFound", "429": "RateLimited", "500": "Internal", "503": "Unavailable"})
		resp["200"] = map[string]any{"description": "The answer.", "content": map[string]any{"application/json": map[string]any{"schema": answer}}}
		o["responses"] = resp
	}
	return json.MarshalIndent(doc, "", "  ")
}

// localIDSchema is the schema of a tenant-local id (pipeline.ValidateLocalID).
func localIDSchema() map[string]any {
	return map[string]any{"type": "string", "pattern": fmt.Sprintf("^[A-Za-z0-9._:-]{1,%d}$", pipeline.MaxLocalIDLen),
		"minLength": 1, "maxLength": pipeline.MaxLocalIDLen}
}

var wildcard = regexp.MustCompile(`\{([A-Za-z0-9_]+)\.*\}`)

// pathParams are the pattern's path wildcards; idParam holds a local id.
func pathParams(pattern, idParam string) []any {
	var out []any
	for _, m := range wildcard.FindAllStringSubmatch(pattern, -1) {
		schema := map[string]any{"type": "string"}
		if m[1] == idParam {
			schema = localIDSchema()
		}
		out = append(out, map[string]any{"name": m[1], "in": "path", "required": true, "schema": schema})
	}
	return out
}

// bodySchema is the schema of r's body.
func bodySchema(r *Route) map[string]any {
	props := map[string]any{}
	required := []string{}
	if r.BodyID != "" {
		props[r.BodyID] = localIDSchema()
		required = append(required, r.BodyID)
	}
	t := reflect.TypeOf(r.Command)
	for _, f := range r.fields {
		sf := t.Field(f.index)
		s := kindSchema(sf.Type)
		if d := sf.Tag.Get("doc"); d != "" {
			s["description"] = d
		}
		if p := sf.Tag.Get("pattern"); p != "" {
			s["pattern"] = p
		}
		props[f.name] = s
		if !f.optional {
			required = append(required, f.name)
		}
	}
	s := map[string]any{"type": "object", "additionalProperties": false, "required": required, "properties": props}
	if d := r.Description; d != "" {
		s["description"] = d
	}
	return s
}

// valueSchema is the schema of a JSON answer of Go type t (a struct, by
// its json tags).
func valueSchema(t reflect.Type) map[string]any {
	if t.Kind() != reflect.Struct {
		return kindSchema(t)
	}
	props := map[string]any{}
	for i := range t.NumField() {
		f := t.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if !f.IsExported() || name == "-" {
			continue
		}
		if name == "" {
			name = f.Name
		}
		s := valueSchema(f.Type)
		if d := f.Tag.Get("doc"); d != "" {
			s["description"] = d
		}
		props[name] = s
	}
	return map[string]any{"type": "object", "properties": props}
}

func kindSchema(t reflect.Type) map[string]any {
	switch k := t.Kind(); {
	case k == reflect.String:
		return map[string]any{"type": "string"}
	case k == reflect.Bool:
		return map[string]any{"type": "boolean"}
	case k == reflect.Float32 || k == reflect.Float64:
		return map[string]any{"type": "number"}
	case k >= reflect.Int && k <= reflect.Int64:
		return map[string]any{"type": "integer", "format": fmt.Sprintf("int%d", t.Bits())}
	case k >= reflect.Uint && k <= reflect.Uint64:
		return map[string]any{"type": "integer", "minimum": 0}
	case k == reflect.Slice || k == reflect.Array:
		return map[string]any{"type": "array", "items": valueSchema(t.Elem())}
	case k == reflect.Pointer:
		return valueSchema(t.Elem())
	case k == reflect.Struct:
		return valueSchema(t)
	}
	return map[string]any{}
}

func refs(m map[string]string) map[string]any {
	out := make(map[string]any, len(m))
	for status, name := range m {
		out[status] = map[string]any{"$ref": "#/components/responses/" + name}
	}
	return out
}

// operationName is a path's words as one identifier: /v1/accounts/{id}
// is "V1AccountsId".
func operationName(path string) string {
	var b strings.Builder
	up := true
	for _, r := range path {
		if !unicode.IsLetter(r) && !unicode.IsDigit(r) {
			up = true
			continue
		}
		if up {
			r = unicode.ToUpper(r)
			up = false
		}
		b.WriteRune(r)
	}
	return b.String()
}

func lowerFirst(s string) string {
	if s == "" {
		return s
	}
	return strings.ToLower(s[:1]) + s[1:]
}

func or(s, def string) string {
	if s == "" {
		return def
	}
	return s
}
