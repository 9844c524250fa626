package avro_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/twmb/franz-go/pkg/sr"

	"github.com/onceflow/onceflow/pipeline/avro"
)

const (
	schemaA  = `{"type":"record","name":"A","namespace":"t","fields":[{"name":"x","type":"long"}]}`
	schemaA2 = `{"type":"record","name":"A","namespace":"t","fields":[{"name":"x","type":"long"},{"name":"y","type":"string","default":""}]}`
	schemaB  = `{"type":"record","name":"B","namespace":"t","fields":[{"name":"s","type":"string"}]}`
)

// registryImpls are the Registry implementations under the conformance
// suite: each call returns a fresh, empty registry.
func registryImpls() map[string]func(t *testing.T) avro.Registry {
	return map[string]func(t *testing.T) avro.Registry{
		"Embedded": func(t *testing.T) avro.Registry { return avro.NewEmbedded() },
		"Client": func(t *testing.T) avro.Registry {
			srv := httptest.NewServer(avro.NewEmbedded().Handler())
			t.Cleanup(srv.Close)
			c, err := avro.NewClient(srv.URL)
			if err != nil {
				t.Fatal(err)
			}
			return c
		},
	}
}

// TestRegistryConformance runs one suite of Registry behaviours against
// every implementation (STYLE 13).
func TestRegistryConformance(t *testing.T) {
	t.Parallel()
	for name, newReg := range registryImpls() {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			testRegistry(t, newReg)
		})
	}
}

func testRegistry(t *testing.T, newReg func(t *testing.T) avro.Registry) {
	ctx := context.Background()
	register := func(t *testing.T, r avro.Registry, subject, schema string) int {
		t.Helper()
		id, err := r.Register(ctx, subject, schema)
		if err != nil {
			t.Fatalf("Register(%s): %v", subject, err)
		}
		return id
	}

	t.Run("ids start at 1 in registration order", func(t *testing.T) {
		t.Parallel()
		r := newReg(t)
		for i, s := range []struct{ subject, schema string }{{"s-value", schemaA}, {"b-value", schemaB}, {"s-value", schemaA2}} {
			if got := register(t, r, s.subject, s.schema); got != i+1 {
				t.Errorf("schema %d: got id %d, want %d", i, got, i+1)
			}
		}
	})

	t.Run("same schema same id", func(t *testing.T) {
		t.Parallel()
		r := newReg(t)
		id := register(t, r, "s-value", schemaA)
		if got := register(t, r, "s-value", schemaA); got != id {
			t.Errorf("again: got id %d, want %d", got, id)
		}
		spaced := strings.ReplaceAll(schemaA, ",", " ,\n\t ")
		if got := register(t, r, "s-value", spaced); got != id {
			t.Errorf("with whitespace: got id %d, want %d", got, id)
		}
		reordered := `{"namespace":"t","fields":[{"type":"long","name":"x"}],"name":"A","type":"record"}`
		if got := register(t, r, "s-value", reordered); got != id {
			t.Errorf("keys reordered: got id %d, want %d", got, id)
		}
	})

	t.Run("different subjects share the id of one schema", func(t *testing.T) {
		t.Parallel()
		r := newReg(t)
		a := register(t, r, "one-value", schemaA)
		b := register(t, r, "two-value", schemaA)
		if a != b {
			t.Errorf("got ids %d and %d, want one id", a, b)
		}
		if c := register(t, r, "three-value", schemaB); c == a {
			t.Errorf("a different schema got the same id %d", c)
		}
	})

	t.Run("a default or a doc is a new version", func(t *testing.T) {
		t.Parallel()
		r := newReg(t)
		a := register(t, r, "s-value", schemaA)
		withDoc := strings.Replace(schemaA, `"name":"A"`, `"name":"A","doc":"d"`, 1)
		if b := register(t, r, "s-value", withDoc); b == a {
			t.Errorf("schema with a doc got the old id %d", a)
		}
	})

	t.Run("versions", func(t *testing.T) {
		t.Parallel()
		r := newReg(t)
		v1 := register(t, r, "s-value", schemaA)
		v2 := register(t, r, "s-value", schemaA2)
		if v1 == v2 {
			t.Fatalf("two versions got one id %d", v1)
		}
		// An old version registered again is found, not added.
		if got := register(t, r, "s-value", schemaA); got != v1 {
			t.Errorf("v1 again: got id %d, want %d", got, v1)
		}
		if got := register(t, r, "other-value", schemaB); got != v2+1 {
			t.Errorf("next schema: got id %d, want %d", got, v2+1)
		}
		for id, want := range map[int]string{v1: schemaA, v2: schemaA2} {
			got, err := r.SchemaByID(ctx, id)
			if err != nil || got != want {
				t.Errorf("SchemaByID(%d): got (%s, %v), want %s", id, got, err, want)
			}
		}
	})

	t.Run("schema by id returns the text", func(t *testing.T) {
		t.Parallel()
		r := newReg(t)
		id := register(t, r, "s-value", schemaB)
		for range 2 { // the second read may come from a cache
			got, err := r.SchemaByID(ctx, id)
			if err != nil {
				t.Fatal(err)
			}
			if got != schemaB {
				t.Errorf("got %s, want %s", got, schemaB)
			}
		}
	})

	t.Run("unknown id", func(t *testing.T) {
		t.Parallel()
		r := newReg(t)
		register(t, r, "s-value", schemaA)
		for _, id := range []int{0, -1, 2, 1 << 30} {
			_, err := r.SchemaByID(ctx, id)
			if !errors.Is(err, avro.ErrUnknownSchema) {
				t.Errorf("SchemaByID(%d): got %v, want an error wrapping ErrUnknownSchema", id, err)
			}
		}
	})

	t.Run("invalid schema", func(t *testing.T) {
		t.Parallel()
		r := newReg(t)
		for _, s := range []string{`{"type":"recrod"}`, `not json`, `{"type":"record","name":"X","fields":[{"name":"a","type":"nope"}]}`} {
			_, err := r.Register(ctx, "s-value", s)
			if !errors.Is(err, avro.ErrInvalidSchema) {
				t.Errorf("Register(%s): got %v, want an error wrapping ErrInvalidSchema", s, err)
			}
		}
	})

	t.Run("concurrent registration", func(t *testing.T) {
		t.Parallel()
		r := newReg(t)
		var wg sync.WaitGroup
		ids := make([]int, 16)
		errs := make([]error, len(ids))
		for i := range ids {
			wg.Go(func() {
				subject, schema := "a-value", schemaA
				if i%2 == 1 {
					subject, schema = "b-value", schemaB
				}
				ids[i], errs[i] = r.Register(ctx, subject, schema)
			})
		}
		wg.Wait()
		for i := range ids {
			if errs[i] != nil {
				t.Fatal(errs[i])
			}
			if ids[i] != ids[i%2] {
				t.Errorf("goroutine %d: got id %d, want %d", i, ids[i], ids[i%2])
			}
		}
		if ids[0] == ids[1] || min(ids[0], ids[1]) != 1 || max(ids[0], ids[1]) != 2 {
			t.Errorf("got ids %d and %d, want 1 and 2", ids[0], ids[1])
		}
	})

	t.Run("an incompatible version is refused, naming the field", func(t *testing.T) {
		t.Parallel()
		r := newReg(t)
		v1 := register(t, r, "s-value", schemaA)
		_, err := r.Register(ctx, "s-value", schemaANoDefault)
		var ie *avro.IncompatibleError
		if !errors.Is(err, avro.ErrIncompatibleSchema) || !errors.As(err, &ie) {
			t.Fatalf("got %v, want an *IncompatibleError", err)
		}
		if ie.Subject != "s-value" || !strings.Contains(err.Error(), "record t.A, field y") {
			t.Errorf("got %v, want the subject and the record and field at fault", err)
		}
		if _, err := r.Register(ctx, "s-value", schemaB); !errors.Is(err, avro.ErrIncompatibleSchema) || !strings.Contains(err.Error(), "t.B") {
			t.Errorf("another record: got %v, want ErrIncompatibleSchema naming t.B", err)
		}
		// Nothing was registered: the next schema gets the next id.
		if got := register(t, r, "s-value", schemaA2); got != v1+1 {
			t.Errorf("a compatible version: got id %d, want %d", got, v1+1)
		}
		// Another subject has versions of its own.
		register(t, r, "other-value", schemaANoDefault)
	})

	t.Run("an earlier version registers again", func(t *testing.T) {
		t.Parallel()
		// A binary older than the latest version, during a rolling
		// upgrade: the latest reads its records, the reverse need not hold
		// (it lacks the union branch the latest added).
		r := newReg(t)
		v1 := register(t, r, "u-value", unionV1)
		register(t, r, "u-value", unionV2)
		if got := register(t, r, "u-value", unionV1); got != v1 {
			t.Errorf("got id %d, want %d", got, v1)
		}
	})
}

const (
	schemaANoDefault = `{"type":"record","name":"A","namespace":"t","fields":[{"name":"x","type":"long"},{"name":"y","type":"string"}]}`
	schemaAZ         = `{"type":"record","name":"A","namespace":"t","fields":[{"name":"x","type":"long"},{"name":"z","type":"int"}]}`
	unionV1          = `[` + schemaA + `]`
	unionV2          = `[` + schemaA + `,` + schemaB + `]`
)

// TestHandlerWithFranzGoClient checks that franz-go's sr client, as other
// tools would, can use the embedded registry over HTTP.
func TestHandlerWithFranzGoClient(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	srv := httptest.NewServer(avro.NewEmbedded().Handler())
	t.Cleanup(srv.Close)
	cl, err := sr.NewClient(sr.URLs(srv.URL))
	if err != nil {
		t.Fatal(err)
	}

	ss, err := cl.CreateSchema(ctx, "ledger.events-value", sr.Schema{Schema: schemaA})
	if err != nil {
		t.Fatalf("CreateSchema: %v", err)
	}
	if ss.ID != 1 || ss.Version != 1 || ss.Subject != "ledger.events-value" || ss.Schema.Schema != schemaA {
		t.Errorf("CreateSchema: got %+v, want id 1, version 1", ss)
	}
	ss2, err := cl.CreateSchema(ctx, "ledger.events-value", sr.Schema{Schema: schemaA2, Type: sr.TypeAvro})
	if err != nil || ss2.ID != 2 || ss2.Version != 2 {
		t.Fatalf("CreateSchema v2: got (%+v, %v), want id 2, version 2", ss2, err)
	}

	found, err := cl.LookupSchema(ctx, "ledger.events-value", sr.Schema{Schema: strings.ReplaceAll(schemaA, ":", ": ")})
	if err != nil || found.ID != 1 || found.Version != 1 {
		t.Errorf("LookupSchema: got (%+v, %v), want id 1 version 1", found, err)
	}
	_, err = cl.LookupSchema(ctx, "ledger.events-value", sr.Schema{Schema: schemaB})
	wantCode(t, "LookupSchema of an unregistered schema", err, 404, 40403)
	_, err = cl.LookupSchema(ctx, "nope-value", sr.Schema{Schema: schemaA})
	wantCode(t, "LookupSchema in an unknown subject", err, 404, 40401)

	byID, err := cl.SchemaByID(ctx, 2)
	if err != nil || byID.Schema != schemaA2 || byID.Type != sr.TypeAvro {
		t.Errorf("SchemaByID(2): got (%+v, %v), want schema A2", byID, err)
	}
	text, err := cl.SchemaTextByID(ctx, 1)
	if err != nil || text != schemaA {
		t.Errorf("SchemaTextByID(1): got (%s, %v), want %s", text, err, schemaA)
	}
	_, err = cl.SchemaByID(ctx, 99)
	wantCode(t, "SchemaByID(99)", err, 404, 40403)

	versions, err := cl.SubjectVersions(ctx, "ledger.events-value")
	if err != nil || !slices.Equal(versions, []int{1, 2}) {
		t.Errorf("SubjectVersions: got (%v, %v), want [1 2]", versions, err)
	}
	latest, err := cl.SchemaByVersion(ctx, "ledger.events-value", -1)
	if err != nil || latest.Version != 2 || latest.ID != 2 || latest.Schema.Schema != schemaA2 {
		t.Errorf("SchemaByVersion(latest): got (%+v, %v), want version 2 id 2", latest, err)
	}
	v1, err := cl.SchemaByVersion(ctx, "ledger.events-value", 1)
	if err != nil || v1.ID != 1 {
		t.Errorf("SchemaByVersion(1): got (%+v, %v), want id 1", v1, err)
	}
	_, err = cl.SchemaByVersion(ctx, "ledger.events-value", 3)
	wantCode(t, "SchemaByVersion(3)", err, 404, 40402)
	_, err = cl.SubjectVersions(ctx, "nope-value")
	wantCode(t, "SubjectVersions of an unknown subject", err, 404, 40401)

	if _, err := cl.CreateSchema(ctx, "other-value", sr.Schema{Schema: schemaA}); err != nil {
		t.Fatal(err)
	}
	subjects, err := cl.Subjects(ctx)
	if err != nil || !slices.Equal(subjects, []string{"ledger.events-value", "other-value"}) {
		t.Errorf("Subjects: got (%v, %v)", subjects, err)
	}
	usages, err := cl.SchemaUsagesByID(ctx, 1)
	if err != nil || len(usages) != 2 {
		t.Errorf("SchemaUsagesByID(1): got (%+v, %v), want 2 usages", usages, err)
	}

	_, err = cl.CreateSchema(ctx, "x-value", sr.Schema{Schema: `{"type":"record","name":"R","fields":[{"name":"a","type":"nope"}]}`})
	wantCode(t, "CreateSchema of an invalid schema", err, 422, 42201)
	_, err = cl.CreateSchema(ctx, "x-value", sr.Schema{Schema: `syntax = "proto3";`, Type: sr.TypeProtobuf})
	wantCode(t, "CreateSchema of a protobuf schema", err, 422, 42201)

	types, err := cl.SupportedTypes(ctx)
	if err != nil || !slices.Equal(types, []sr.SchemaType{sr.TypeAvro}) {
		t.Errorf("SupportedTypes: got (%v, %v), want [AVRO]", types, err)
	}
	for _, res := range cl.Compatibility(sr.WithParams(ctx, sr.DefaultToGlobal), "", "ledger.events-value") {
		if res.Err != nil || res.Level != sr.CompatBackward {
			t.Errorf("Compatibility(%q): got (%v, %v), want BACKWARD", res.Subject, res.Level, res.Err)
		}
	}
	res := cl.Compatibility(ctx, "ledger.events-value")[0]
	wantCode(t, "Compatibility of a subject without a level of its own", res.Err, 404, 40408)

	// Compatibility as Confluent's registry checks it.
	check, err := cl.CheckCompatibility(ctx, "ledger.events-value", -1, sr.Schema{Schema: schemaB})
	if err != nil || check.Is {
		t.Errorf("CheckCompatibility of another record: got (%+v, %v), want incompatible", check, err)
	}
	check, err = cl.CheckCompatibility(sr.WithParams(ctx, sr.Verbose), "ledger.events-value", -1, sr.Schema{Schema: schemaB})
	if err != nil || check.Is || len(check.Messages) == 0 || !strings.Contains(check.Messages[0], "t.B") {
		t.Errorf("CheckCompatibility, verbose: got (%+v, %v), want the reason", check, err)
	}
	check, err = cl.CheckCompatibility(ctx, "nope-value", -1, sr.Schema{Schema: schemaB})
	if err != nil || !check.Is {
		t.Errorf("CheckCompatibility with a new subject: got (%+v, %v), want compatible", check, err)
	}
	_, err = cl.CheckCompatibility(ctx, "ledger.events-value", 9, sr.Schema{Schema: schemaA})
	wantCode(t, "CheckCompatibility with version 9", err, 404, 40402)
	_, err = cl.CreateSchema(ctx, "ledger.events-value", sr.Schema{Schema: schemaB})
	wantCode(t, "CreateSchema of an incompatible schema", err, 409, 40901)
	set := cl.SetCompatibility(ctx, sr.SetCompatibility{Level: sr.CompatNone}, "ledger.events-value")[0]
	if set.Err != nil || set.Level != sr.CompatNone {
		t.Fatalf("SetCompatibility(NONE): got (%v, %v)", set.Level, set.Err)
	}
	if _, err := cl.CreateSchema(ctx, "ledger.events-value", sr.Schema{Schema: schemaB}); err != nil {
		t.Errorf("CreateSchema under NONE: %v", err)
	}
	if res := cl.ResetCompatibility(ctx, "ledger.events-value")[0]; res.Err != nil {
		t.Errorf("ResetCompatibility: %v", res.Err)
	}
	if res := cl.Compatibility(sr.WithParams(ctx, sr.DefaultToGlobal), "ledger.events-value")[0]; res.Level != sr.CompatBackward {
		t.Errorf("after the reset: got %v, want BACKWARD", res.Level)
	}
}

func wantCode(t *testing.T, what string, err error, status, code int) {
	t.Helper()
	var re *sr.ResponseError
	if !errors.As(err, &re) {
		t.Errorf("%s: got %v, want an sr.ResponseError", what, err)
		return
	}
	if re.StatusCode != status || re.ErrorCode != code {
		t.Errorf("%s: got HTTP %d error_code %d (%s), want HTTP %d error_code %d", what, re.StatusCode, re.ErrorCode, re.Message, status, code)
	}
}

// TestHandlerHTTP checks the wire details other clients (kcat, Confluent's
// serializers) rely on: content type, error bodies, raw schema endpoints.
func TestHandlerHTTP(t *testing.T) {
	t.Parallel()
	reg := avro.NewEmbedded()
	if _, err := reg.Register(context.Background(), "s-value", schemaA); err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(reg.Handler())
	t.Cleanup(srv.Close)

	for _, tc := range []struct {
		method, path, body string
		status             int
		want               string // the body, or the error_code for errors
	}{
		{"GET", "/schemas/ids/1", "", 200, `{"schema":` + jsonString(schemaA) + `}`},
		{"GET", "/schemas/ids/1/schema", "", 200, schemaA},
		{"GET", "/schemas/ids/2", "", 404, "40403"},
		{"GET", "/schemas/ids/x", "", 404, "40403"},
		{"GET", "/schemas/ids/1/subjects", "", 200, `["s-value"]`},
		{"GET", "/subjects", "", 200, `["s-value"]`},
		{"GET", "/subjects/s-value/versions", "", 200, `[1]`},
		{"GET", "/subjects/s-value/versions/latest", "", 200, `{"subject":"s-value","version":1,"id":1,"schema":` + jsonString(schemaA) + `}`},
		{"GET", "/subjects/s-value/versions/1/schema", "", 200, schemaA},
		{"GET", "/subjects/s-value/versions/0", "", 422, "42202"},
		{"GET", "/subjects/s-value/versions/2", "", 404, "40402"},
		{"GET", "/subjects/nope/versions/1", "", 404, "40401"},
		{"POST", "/subjects/s-value/versions", `{"schema":` + jsonString(schemaA2) + `}`, 200, `{"id":2}`},
		{"POST", "/subjects/s-value/versions", `{"schema":` + jsonString(schemaA2) + `,"schemaType":"AVRO"}`, 200, `{"id":2}`},
		{"POST", "/subjects/s-value/versions", `{"schema":` + jsonString(schemaB) + `}`, 409, "40901"},
		{"POST", "/compatibility/subjects/s-value/versions/latest", `{"schema":` + jsonString(schemaB) + `}`, 200, `{"is_compatible":false}`},
		{"POST", "/compatibility/subjects/s-value/versions/1?verbose=true", `{"schema":` + jsonString(schemaA2) + `}`, 200, `{"is_compatible":true,"messages":[]}`},
		{"POST", "/compatibility/subjects/s-value/versions?verbose=true", `{"schema":` + jsonString(schemaAZ) + `}`, 200,
			`{"is_compatible":false,"messages":["record t.A, field z: the new schema has no default for it and version 2 lacks the field, so its records could not be read"]}`},
		{"POST", "/compatibility/subjects/nope-value/versions/latest", `{"schema":` + jsonString(schemaB) + `}`, 200, `{"is_compatible":true}`},
		{"POST", "/compatibility/subjects/s-value/versions/7", `{"schema":` + jsonString(schemaB) + `}`, 404, "40402"},
		{"POST", "/compatibility/subjects/s-value/versions/x", `{"schema":` + jsonString(schemaB) + `}`, 422, "42202"},
		{"POST", "/compatibility/subjects/s-value/versions/latest", `{"schema":"{\"type\":\"nope\"}"}`, 422, "42201"},
		{"POST", "/subjects/s-value/versions", `{"schema":"{\"type\":\"nope\"}"}`, 422, "42201"},
		{"POST", "/subjects/s-value/versions", `{"schema":` + jsonString(schemaB) + `,"references":[{"name":"x","subject":"y","version":1}]}`, 422, "42201"},
		{"POST", "/subjects/s-value/versions", `{`, 422, "42201"},
		{"POST", "/subjects/s-value", `{"schema":` + jsonString(schemaA) + `}`, 200, `{"subject":"s-value","version":1,"id":1,"schema":` + jsonString(schemaA) + `}`},
		{"POST", "/subjects/s-value", `{"schema":` + jsonString(schemaB) + `}`, 404, "40403"},
		{"GET", "/config", "", 200, `{"compatibilityLevel":"BACKWARD"}`},
		{"GET", "/config/s-value", "", 404, "40408"},
		{"GET", "/config/s-value?defaultToGlobal=true", "", 200, `{"compatibilityLevel":"BACKWARD"}`},
		{"PUT", "/config/s-value", `{"compatibility":"NONE"}`, 200, `{"compatibility":"NONE"}`},
		{"GET", "/config/s-value", "", 200, `{"compatibilityLevel":"NONE"}`},
		{"POST", "/subjects/s-value/versions", `{"schema":` + jsonString(schemaB) + `}`, 200, `{"id":3}`},
		{"PUT", "/config/s-value", `{"compatibility":"SIDEWAYS"}`, 422, "42203"},
		{"DELETE", "/config/s-value", "", 200, `{"compatibilityLevel":"NONE"}`},
		{"DELETE", "/config/s-value", "", 404, "40401"},
		{"PUT", "/config", `{"compatibility":"FULL"}`, 200, `{"compatibility":"FULL"}`},
		{"GET", "/config", "", 200, `{"compatibilityLevel":"FULL"}`},
		{"GET", "/nothing/here", "", 404, "404"},
	} {
		req, err := http.NewRequest(tc.method, srv.URL+tc.path, strings.NewReader(tc.body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/vnd.schemaregistry.v1+json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		name := tc.method + " " + tc.path
		if resp.StatusCode != tc.status {
			t.Errorf("%s: got status %d (%s), want %d", name, resp.StatusCode, body, tc.status)
			continue
		}
		if ct := resp.Header.Get("Content-Type"); ct != "application/vnd.schemaregistry.v1+json" {
			t.Errorf("%s: got content type %q, want application/vnd.schemaregistry.v1+json", name, ct)
		}
		if tc.status == 200 {
			if string(body) != tc.want {
				t.Errorf("%s: got body %s, want %s", name, body, tc.want)
			}
			continue
		}
		var e struct {
			Code    json.Number `json:"error_code"`
			Message string      `json:"message"`
		}
		if err := json.Unmarshal(body, &e); err != nil || e.Code.String() != tc.want || e.Message == "" {
			t.Errorf("%s: got error body %s, want error_code %s and a message", name, body, tc.want)
		}
	}
}

func jsonString(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}

// TestClientReadOnlyRegistry: where producers may not register, Register
// finds a schema registered beforehand by looking it up.
func TestClientReadOnlyRegistry(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	emb := avro.NewEmbedded()
	id, err := emb.Register(ctx, "s-value", schemaA)
	if err != nil {
		t.Fatal(err)
	}
	h := emb.Handler()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost && strings.HasSuffix(r.URL.Path, "/versions") {
			w.Header().Set("Content-Type", "application/vnd.schemaregistry.v1+json")
			w.WriteHeader(http.StatusForbidden)
			io.WriteString(w, `{"error_code":40301,"message":"User cannot access the resource."}`)
			return
		}
		h.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	c, err := avro.NewClient(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	got, err := c.Register(ctx, "s-value", schemaA)
	if err != nil || got != id {
		t.Errorf("registered schema: got (%d, %v), want %d", got, err, id)
	}
	if _, err := c.Register(ctx, "s-value", schemaA2); err == nil || !strings.Contains(err.Error(), "User cannot access") {
		t.Errorf("unregistered schema: got %v, want the registry's refusal", err)
	}
}

// An embedded registry opened on a file comes back with every id, version
// and compatibility level it had: an edited schema registered after a
// restart gets a new id, never the id records of the version before it
// carry.
func TestOpenEmbeddedRemembers(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "registry", "schemas.json")
	reg, err := avro.OpenEmbedded(path)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []struct{ subject, schema string }{{"s-value", schemaA}, {"b-value", schemaB}, {"s-value", schemaA2}} {
		if _, err := reg.Register(ctx, s.subject, s.schema); err != nil {
			t.Fatal(err)
		}
	}
	if err := reg.SetCompatibility("b-value", sr.CompatNone); err != nil {
		t.Fatal(err)
	}
	if _, err := reg.Register(ctx, "s-value", schemaAZ); !errors.Is(err, avro.ErrIncompatibleSchema) {
		t.Fatalf("incompatible version: got %v", err)
	}

	again, err := avro.OpenEmbedded(path)
	if err != nil {
		t.Fatal(err)
	}
	for id, want := range map[int]string{1: schemaA, 2: schemaB, 3: schemaA2} {
		if got, err := again.SchemaByID(ctx, id); err != nil || got != want {
			t.Errorf("after reopening, schema %d: got (%s, %v), want %s", id, got, err, want)
		}
	}
	if _, err := again.SchemaByID(ctx, 4); !errors.Is(err, avro.ErrUnknownSchema) {
		t.Errorf("schema 4: got %v, want unknown: the refused version was not kept", err)
	}
	// The binary's schemas registered again at start: the same ids.
	if id, err := again.Register(ctx, "s-value", schemaA2); err != nil || id != 3 {
		t.Errorf("latest version again: got (%d, %v), want 3", id, err)
	}
	edited := strings.Replace(schemaA2, `"default":""`, `"default":"none"`, 1)
	if id, err := again.Register(ctx, "s-value", edited); err != nil || id != 4 {
		t.Errorf("an edited schema: got (%d, %v), want a new id, 4", id, err)
	}
	if got := again.Compatibility("b-value"); got != sr.CompatNone {
		t.Errorf("b-value's level: got %v, want NONE", got)
	}
	if got := again.Compatibility("s-value"); got != sr.CompatBackward {
		t.Errorf("s-value's level: got %v, want BACKWARD", got)
	}
	if third, err := avro.OpenEmbedded(path); err != nil {
		t.Fatal(err)
	} else if got, err := third.SchemaByID(ctx, 4); err != nil || got != edited {
		t.Errorf("after a second reopening, schema 4: got (%s, %v)", got, err)
	}

	if err := os.WriteFile(path, []byte(`{"registrations":[{"subject":"s-value","schema":"nope"}]}`), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := avro.OpenEmbedded(path); err == nil {
		t.Error("a damaged file: opened, want an error")
	}
}
