package avro

import (
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strconv"
	"strings"

	"github.com/twmb/franz-go/pkg/sr"
)

// Confluent Schema Registry error codes.
const (
	codeSubjectNotFound = 40401
	codeVersionNotFound = 40402
	codeSchemaNotFound  = 40403
	codeNoSubjectLevel  = 40408
	codeIncompatible    = 40901
	codeInvalidSchema   = 42201
	codeInvalidVersion  = 42202
	codeInvalidLevel    = 42203
	codeNotPermitted    = 42205
)

const contentType = "application/vnd.schemaregistry.v1+json"

// maxRequestBody bounds a request body: a schema is a few kilobytes.
const maxRequestBody = 1 << 20

// Handler serves the subset of Confluent's Schema Registry REST API that
// clients use, so franz-go's sr client, kcat -s avro and Confluent's
// serializers work against the embedded registry:
//
//	GET  /schemas/ids/{id}                      {"schema": "..."}
//	GET  /schemas/ids/{id}/schema               the schema text
//	GET  /schemas/ids/{id}/subjects             ["a-value", ...]
//	GET  /schemas/ids/{id}/versions             [{"subject","version"}]
//	GET  /schemas/types                         ["AVRO"]
//	GET  /subjects                              ["a-value", ...]
//	GET  /subjects/{subject}/versions           [1, 2]
//	GET  /subjects/{subject}/versions/{version} {"subject","version","id","schema"}; version may be "latest"
//	GET  /subjects/{subject}/versions/{version}/schema
//	POST /subjects/{subject}/versions           {"schema": "...", "schemaType"?: "AVRO"} -> {"id": N}; 409 if incompatible
//	POST /subjects/{subject}                    lookup: {"subject","version","id","schema"}
//	POST /compatibility/subjects/{subject}/versions/{version}  {"is_compatible": bool, "messages"?: [...]}
//	POST /compatibility/subjects/{subject}/versions            against the versions the level checks
//	GET  /config, /config/{subject}             {"compatibilityLevel": "BACKWARD"}; ?defaultToGlobal=true
//	PUT  /config, /config/{subject}             {"compatibility": "NONE"}: sets the level
//	DELETE /config/{subject}                    the subject follows the default again; answers the level it had
//	GET  /mode                                  {"mode": "READWRITE"}
//
// Compatibility behaves as in Confluent's registry: a subject's own level,
// else the default (BACKWARD); ?verbose=true adds the reasons to a
// compatibility answer; a subject without versions is compatible with
// anything at "latest".
// Errors have Confluent's body {"error_code": 40401, "message": "..."}.
// Deleting, schema references and types other than AVRO are not supported.
func (e *Embedded) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, r *http.Request) { reply(w, map[string]any{}) })
	mux.HandleFunc("GET /schemas/types", func(w http.ResponseWriter, r *http.Request) { reply(w, []string{"AVRO"}) })
	mux.HandleFunc("GET /schemas/ids/{id}", e.serveSchemaByID)
	mux.HandleFunc("GET /schemas/ids/{id}/schema", e.serveSchemaByID)
	mux.HandleFunc("GET /schemas/ids/{id}/subjects", e.serveUsages(true))
	mux.HandleFunc("GET /schemas/ids/{id}/versions", e.serveUsages(false))
	mux.HandleFunc("GET /subjects", func(w http.ResponseWriter, r *http.Request) { reply(w, e.subjectList()) })
	mux.HandleFunc("GET /subjects/{subject}/versions", e.serveVersions)
	mux.HandleFunc("GET /subjects/{subject}/versions/{version}", e.serveVersion)
	mux.HandleFunc("GET /subjects/{subject}/versions/{version}/schema", e.serveVersion)
	mux.HandleFunc("POST /subjects/{subject}/versions", e.serveRegister)
	mux.HandleFunc("POST /subjects/{subject}", e.serveLookup)
	mux.HandleFunc("POST /compatibility/subjects/{subject}/versions/{version}", e.serveCompatibility)
	mux.HandleFunc("POST /compatibility/subjects/{subject}/versions", e.serveCompatibility)
	mux.HandleFunc("GET /config", e.serveConfig)
	mux.HandleFunc("GET /config/{subject}", e.serveConfig)
	mux.HandleFunc("PUT /config", e.serveSetConfig)
	mux.HandleFunc("PUT /config/{subject}", e.serveSetConfig)
	mux.HandleFunc("DELETE /config/{subject}", e.serveDeleteConfig)
	mux.HandleFunc("GET /mode", func(w http.ResponseWriter, r *http.Request) { reply(w, map[string]string{"mode": "READWRITE"}) })
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		replyError(w, http.StatusNotFound, http.StatusNotFound, "HTTP 404 Not Found")
	})
	return mux
}

func (e *Embedded) serveSchemaByID(w http.ResponseWriter, r *http.Request) {
	id, err := strconv.Atoi(r.PathValue("id"))
	if err != nil {
		replyError(w, http.StatusNotFound, codeSchemaNotFound, "Schema not found")
		return
	}
	s, err := e.SchemaByID(r.Context(), id)
	if err != nil {
		replyError(w, http.StatusNotFound, codeSchemaNotFound, "Schema "+strconv.Itoa(id)+" not found")
		return
	}
	if isRaw(r) {
		replyRaw(w, s)
		return
	}
	reply(w, map[string]string{"schema": s})
}

// serveUsages answers the subjects (subjectsOnly) or subject versions that
// use a schema id.
func (e *Embedded) serveUsages(subjectsOnly bool) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		id, err := strconv.Atoi(r.PathValue("id"))
		var us []subjectVersion
		if err == nil {
			us, err = e.usages(id)
		}
		if err != nil {
			replyError(w, http.StatusNotFound, codeSchemaNotFound, "Schema "+r.PathValue("id")+" not found")
			return
		}
		if subjectsOnly {
			subjects := make([]string, len(us))
			for i, u := range us {
				subjects[i] = u.Subject
			}
			reply(w, subjects)
			return
		}
		type sv struct {
			Subject string `json:"subject"`
			Version int    `json:"version"`
		}
		out := make([]sv, len(us))
		for i, u := range us {
			out[i] = sv{u.Subject, u.Version}
		}
		reply(w, out)
	}
}

func (e *Embedded) serveVersions(w http.ResponseWriter, r *http.Request) {
	vs, err := e.versions(r.PathValue("subject"))
	if err != nil {
		replyRegistryError(w, r, err)
		return
	}
	reply(w, vs)
}

func (e *Embedded) serveVersion(w http.ResponseWriter, r *http.Request) {
	v, ok := parseVersion(r.PathValue("version"))
	if !ok {
		replyError(w, http.StatusUnprocessableEntity, codeInvalidVersion,
			"The specified version '"+r.PathValue("version")+"' is not a valid version id. Allowed values are between [1, 2^31-1] and the string \"latest\"")
		return
	}
	sv, err := e.version(r.PathValue("subject"), v)
	if err != nil {
		replyRegistryError(w, r, err)
		return
	}
	if isRaw(r) {
		replyRaw(w, sv.Schema)
		return
	}
	reply(w, sv)
}

// schemaRequest is the body of a register or lookup request.
type schemaRequest struct {
	Schema     string            `json:"schema"`
	SchemaType string            `json:"schemaType"`
	References []json.RawMessage `json:"references"`
	ID         int               `json:"id"`
	Version    int               `json:"version"`
}

func readSchemaRequest(w http.ResponseWriter, r *http.Request) (schemaRequest, bool) {
	var req schemaRequest
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxRequestBody))
	if err == nil {
		err = json.Unmarshal(body, &req)
	}
	switch {
	case err != nil:
		replyError(w, http.StatusUnprocessableEntity, codeInvalidSchema, "Invalid request body: "+err.Error())
	case req.SchemaType != "" && req.SchemaType != "AVRO":
		replyError(w, http.StatusUnprocessableEntity, codeInvalidSchema, "Schema type "+req.SchemaType+" is not supported; this registry serves AVRO only")
	case len(req.References) > 0:
		replyError(w, http.StatusUnprocessableEntity, codeInvalidSchema, "Schema references are not supported")
	case req.Schema == "":
		replyError(w, http.StatusUnprocessableEntity, codeInvalidSchema, "Empty schema")
	default:
		return req, true
	}
	return req, false
}

func (e *Embedded) serveRegister(w http.ResponseWriter, r *http.Request) {
	req, ok := readSchemaRequest(w, r)
	if !ok {
		return
	}
	if req.ID > 0 || req.Version > 0 {
		replyError(w, http.StatusUnprocessableEntity, codeNotPermitted, "Registering with a given id or version is not supported")
		return
	}
	id, err := e.Register(r.Context(), r.PathValue("subject"), req.Schema)
	if err != nil {
		replyRegistryError(w, r, err)
		return
	}
	reply(w, map[string]int{"id": id})
}

func (e *Embedded) serveLookup(w http.ResponseWriter, r *http.Request) {
	req, ok := readSchemaRequest(w, r)
	if !ok {
		return
	}
	sv, err := e.lookup(r.PathValue("subject"), req.Schema)
	if err != nil {
		replyRegistryError(w, r, err)
		return
	}
	reply(w, sv)
}

// serveCompatibility answers whether a schema may follow a version of a
// subject (or, without a version, the versions its level checks).
func (e *Embedded) serveCompatibility(w http.ResponseWriter, r *http.Request) {
	v := 0
	if raw := r.PathValue("version"); raw != "" {
		var ok bool
		if v, ok = parseVersion(raw); !ok {
			replyError(w, http.StatusUnprocessableEntity, codeInvalidVersion,
				"The specified version '"+raw+"' is not a valid version id. Allowed values are between [1, 2^31-1] and the string \"latest\"")
			return
		}
	}
	req, ok := readSchemaRequest(w, r)
	if !ok {
		return
	}
	verbose := r.URL.Query().Get("verbose") == "true"
	problems, err := e.checkCompatibility(r.PathValue("subject"), req.Schema, v)
	if errors.Is(err, ErrInvalidSchema) && verbose {
		problems, err = []string{err.Error()}, nil // as Confluent's registry answers it
	}
	if err != nil {
		replyRegistryError(w, r, err)
		return
	}
	res := map[string]any{"is_compatible": len(problems) == 0}
	if verbose {
		res["messages"] = append([]string{}, problems...)
	}
	reply(w, res)
}

func (e *Embedded) serveConfig(w http.ResponseWriter, r *http.Request) {
	subject := r.PathValue("subject")
	level, ok := e.subjectLevel(subject)
	if !ok {
		if subject != "" && r.URL.Query().Get("defaultToGlobal") != "true" {
			replyError(w, http.StatusNotFound, codeNoSubjectLevel, "Subject '"+subject+"' does not have subject-level compatibility configured")
			return
		}
		level = e.Compatibility(subject)
	}
	reply(w, map[string]string{"compatibilityLevel": level.String()})
}

func (e *Embedded) serveSetConfig(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Compatibility string `json:"compatibility"`
	}
	var level sr.CompatibilityLevel
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxRequestBody))
	if err == nil {
		err = json.Unmarshal(body, &req)
	}
	if err == nil {
		err = level.UnmarshalText([]byte(req.Compatibility))
	}
	if err != nil {
		replyError(w, http.StatusUnprocessableEntity, codeInvalidLevel, "Invalid compatibility level")
		return
	}
	if err := e.SetCompatibility(r.PathValue("subject"), level); err != nil {
		replyError(w, http.StatusInternalServerError, 50001, err.Error())
		return
	}
	reply(w, map[string]string{"compatibility": level.String()})
}

func (e *Embedded) serveDeleteConfig(w http.ResponseWriter, r *http.Request) {
	subject := r.PathValue("subject")
	level, err := e.resetCompatibility(subject)
	if errors.Is(err, errNoSubjectLevel) { // Confluent's registry answers so
		replyError(w, http.StatusNotFound, codeSubjectNotFound, "Subject '"+subject+"' not found.")
		return
	}
	if err != nil {
		replyError(w, http.StatusInternalServerError, 50001, err.Error())
		return
	}
	reply(w, map[string]string{"compatibilityLevel": level.String()})
}

// parseVersion parses a version path segment: 1..2^31-1, "latest" or -1.
func parseVersion(s string) (int, bool) {
	if s == "latest" {
		return -1, true
	}
	v, err := strconv.ParseInt(s, 10, 32)
	if err != nil || v == 0 || v < -1 {
		return 0, false
	}
	return int(v), true
}

// isRaw reports whether the request asks for the schema text alone.
func isRaw(r *http.Request) bool {
	return strings.HasSuffix(r.URL.Path, "/schema")
}

func replyRegistryError(w http.ResponseWriter, r *http.Request, err error) {
	subject := r.PathValue("subject")
	var incompatible *IncompatibleError
	switch {
	case errors.Is(err, errSubjectNotFound):
		replyError(w, http.StatusNotFound, codeSubjectNotFound, "Subject '"+subject+"' not found.")
	case errors.Is(err, errVersionNotFound):
		replyError(w, http.StatusNotFound, codeVersionNotFound, "Version "+r.PathValue("version")+" not found.")
	case errors.Is(err, errSchemaNotFound):
		replyError(w, http.StatusNotFound, codeSchemaNotFound, "Schema not found")
	case errors.Is(err, ErrInvalidSchema):
		replyError(w, http.StatusUnprocessableEntity, codeInvalidSchema, err.Error())
	case errors.As(err, &incompatible):
		b, _ := json.Marshal(incompatible.Problems)
		replyError(w, http.StatusConflict, codeIncompatible,
			"Schema being registered is incompatible with an earlier schema for subject \""+subject+"\", details: "+string(b))
	default:
		replyError(w, http.StatusInternalServerError, 50001, err.Error())
	}
}

func reply(w http.ResponseWriter, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		replyError(w, http.StatusInternalServerError, 50001, err.Error())
		return
	}
	w.Header().Set("Content-Type", contentType)
	w.Write(b)
}

func replyRaw(w http.ResponseWriter, s string) {
	w.Header().Set("Content-Type", contentType)
	io.WriteString(w, s)
}

func replyError(w http.ResponseWriter, status, code int, msg string) {
	b, _ := json.Marshal(struct {
		Code    int    `json:"error_code"`
		Message string `json:"message"`
	}{code, msg})
	w.Header().Set("Content-Type", contentType)
	w.WriteHeader(status)
	w.Write(b)
}
