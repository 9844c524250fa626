package avro_test

import (
	"context"
	"encoding/pem"
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

	"github.com/onceflow/onceflow/pipeline/avro"
)

// tlsRegistry serves an embedded registry over TLS that answers 401 to any
// request without the basic auth user:pass. It returns the server and the
// path of a PEM file with its certificate.
func tlsRegistry(t *testing.T, user, pass string) (*httptest.Server, string) {
	t.Helper()
	h := avro.NewEmbedded().Handler()
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if u, p, ok := r.BasicAuth(); !ok || u != user || p != pass {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusUnauthorized)
			w.Write([]byte(`{"error_code":401,"message":"Unauthorized"}`))
			return
		}
		h.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	ca := filepath.Join(t.TempDir(), "ca.pem")
	b := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw})
	if err := os.WriteFile(ca, b, 0o600); err != nil {
		t.Fatal(err)
	}
	return srv, ca
}

// A registry behind TLS with a private CA and basic auth is reachable with
// SCHEMA_REGISTRY_CA_FILE and the credentials, given as options or in the
// URL; without the CA or with wrong credentials it is not, and no error
// quotes the password.
func TestClientTLSAndBasicAuth(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	srv, ca := tlsRegistry(t, "onceflow", "s3cret-pw")
	withUserinfo := strings.Replace(srv.URL, "https://", "https://onceflow:s3cret-pw@", 1)
	wrongUserinfo := strings.Replace(srv.URL, "https://", "https://onceflow:wrong-pw@", 1)

	for _, tc := range []struct {
		name string
		cfg  avro.ClientConfig
		ok   bool
	}{
		{"options", avro.ClientConfig{URL: srv.URL, User: "onceflow", Password: "s3cret-pw", CAFile: ca}, true},
		{"userinfo", avro.ClientConfig{URL: withUserinfo, CAFile: ca}, true},
		{"options win over userinfo", avro.ClientConfig{URL: wrongUserinfo, User: "onceflow", Password: "s3cret-pw", CAFile: ca}, true},
		{"no CA", avro.ClientConfig{URL: srv.URL, User: "onceflow", Password: "s3cret-pw"}, false},
		{"no credentials", avro.ClientConfig{URL: srv.URL, CAFile: ca}, false},
		{"wrong password", avro.ClientConfig{URL: wrongUserinfo, CAFile: ca}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := tc.cfg.NewClient()
			if err != nil {
				t.Fatal(err)
			}
			id, err := c.Register(ctx, "t-value", schemaA)
			if tc.ok != (err == nil) {
				t.Fatalf("Register: id %d, err %v; want success %v", id, err, tc.ok)
			}
			if err != nil && (strings.Contains(err.Error(), "s3cret") || strings.Contains(err.Error(), "wrong-pw")) {
				t.Errorf("the error quotes the password: %v", err)
			}
			if err == nil {
				if got, err := c.SchemaByID(ctx, id); err != nil || got == "" {
					t.Errorf("SchemaByID(%d): %q, %v", id, got, err)
				}
			}
		})
	}
}

func TestClientConfigRefuses(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		cfg  avro.ClientConfig
	}{
		{"credentials over http", avro.ClientConfig{URL: "http://registry.example:8081", User: "u", Password: "s3cret-pw"}},
		{"userinfo over http", avro.ClientConfig{URL: "http://u:s3cret-pw@registry.example:8081"}},
		{"CA file with http", avro.ClientConfig{URL: "http://registry.example:8081", CAFile: "/dev/null"}},
		{"not a URL", avro.ClientConfig{URL: "http://u:s3cret-pw@registry.example:80 81"}},
		{"no certificates", avro.ClientConfig{URL: "https://registry.example", CAFile: "/dev/null"}},
	} {
		_, err := tc.cfg.NewClient()
		if err == nil {
			t.Errorf("%s: NewClient succeeded", tc.name)
		} else if strings.Contains(err.Error(), "s3cret") {
			t.Errorf("%s: the error quotes the password: %v", tc.name, err)
		}
	}
	// A URL without a scheme is http, as it always was.
	srv := httptest.NewServer(avro.NewEmbedded().Handler())
	defer srv.Close()
	c, err := (avro.ClientConfig{URL: strings.TrimPrefix(srv.URL, "http://")}).NewClient()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Register(context.Background(), "t-value", schemaA); err != nil {
		t.Errorf("a registry URL without a scheme: %v", err)
	}
	// Basic auth to a registry on this machine (a sidecar, dev) may use http.
	if _, err := (avro.ClientConfig{URL: "http://127.0.0.1:8081", User: "u", Password: "p"}).NewClient(); err != nil {
		t.Errorf("credentials over http to loopback: %v", err)
	}
}

// recorder wraps a registry's handler and records each request as
// "METHOD /path?query".
type recorder struct {
	h    http.Handler
	mu   sync.Mutex
	reqs []string
}

func (r *recorder) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	r.mu.Lock()
	r.reqs = append(r.reqs, req.Method+" "+req.URL.RequestURI())
	r.mu.Unlock()
	r.h.ServeHTTP(w, req)
}

// take returns the requests recorded since the last call.
func (r *recorder) take() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := r.reqs
	r.reqs = nil
	return out
}

// At start, the client asks the registry whether its schema may follow the
// subject's latest version before registering it; a schema the registry
// calls incompatible is never registered, and the error says why, in the
// registry's words. An earlier version (an older binary during a rolling
// upgrade) is found and used.
func TestClientChecksCompatibilityBeforeRegistering(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	rec := &recorder{h: avro.NewEmbedded().Handler()}
	srv := httptest.NewServer(rec)
	t.Cleanup(srv.Close)
	newClient := func() *avro.Client {
		c, err := avro.NewClient(srv.URL)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	c := newClient()

	if _, err := c.Register(ctx, "s-value", schemaA); err != nil {
		t.Fatal(err)
	}
	want := []string{"POST /compatibility/subjects/s-value/versions/latest", "POST /subjects/s-value/versions"}
	if got := rec.take(); !slices.Equal(got, want) {
		t.Errorf("first version: requests %q, want %q", got, want)
	}

	_, err := c.Register(ctx, "s-value", schemaAZ)
	var ie *avro.IncompatibleError
	if !errors.As(err, &ie) || !errors.Is(err, avro.ErrIncompatibleSchema) {
		t.Fatalf("incompatible version: got %v, want an *IncompatibleError", err)
	}
	if ie.Subject != "s-value" || len(ie.Problems) != 1 || !strings.Contains(ie.Problems[0], "record t.A, field z") {
		t.Errorf("incompatible version: got %+v, want the registry's reason naming record t.A, field z", ie)
	}
	want = []string{
		"POST /compatibility/subjects/s-value/versions/latest",
		"POST /subjects/s-value", // an earlier version?
		"POST /compatibility/subjects/s-value/versions/latest?verbose=true",
	}
	if got := rec.take(); !slices.Equal(got, want) {
		t.Errorf("incompatible version: requests %q, want %q (never a registration)", got, want)
	}

	// A rolling upgrade: the new binary registers a version with another
	// union branch; an old binary starting meanwhile gets its own id back.
	if _, err := c.Register(ctx, "u-value", unionV1); err != nil {
		t.Fatal(err)
	}
	if _, err := newClient().Register(ctx, "u-value", unionV2); err != nil {
		t.Fatal(err)
	}
	rec.take()
	id, err := newClient().Register(ctx, "u-value", unionV1)
	if err != nil || id != 2 {
		t.Errorf("an earlier version: got (%d, %v), want its id 2", id, err)
	}
}

// confluentAnswer is what a Confluent registry answers to one request.
type confluentAnswer struct {
	status int
	body   string
}

// TestClientWithConfluentAnswers: answers of Confluent's registry the
// embedded one does not give, as Confluent's registry words them.
func TestClientWithConfluentAnswers(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	const (
		compat   = "POST /compatibility/subjects/s-value/versions/latest"
		verbose  = "POST /compatibility/subjects/s-value/versions/latest?verbose=true"
		lookup   = "POST /subjects/s-value"
		register = "POST /subjects/s-value/versions"
	)
	notFound := confluentAnswer{404, `{"error_code":40401,"message":"Subject 's-value' not found."}`}
	registered := confluentAnswer{200, `{"id":7}`}
	for _, tc := range []struct {
		name    string
		answers map[string]confluentAnswer
		wantErr string // "" for id 7
		want    []string
	}{
		{
			name:    "a registry before 6.1: latest of a new subject is not found",
			answers: map[string]confluentAnswer{compat: notFound, register: registered},
			want:    []string{compat, register},
		},
		{
			name: "incompatible, with Confluent's reasons",
			answers: map[string]confluentAnswer{
				compat:  {200, `{"is_compatible":false}`},
				lookup:  {404, `{"error_code":40403,"message":"Schema not found"}`},
				verbose: {200, `{"is_compatible":false,"messages":["{errorType:'READER_FIELD_MISSING_DEFAULT_VALUE', description:'The field 'z' at path '/fields/1' in the new schema has no default value and is missing in the old schema', additionalInfo:'z'}","{oldSchemaVersion: 1}","{validateFields: 'false', compatibility: 'BACKWARD'}"]}`},
			},
			wantErr: "schema incompatible with an earlier version of s-value: {errorType:'READER_FIELD_MISSING_DEFAULT_VALUE', description:'The field 'z'",
			want:    []string{compat, lookup, verbose},
		},
		{
			name: "refused at registration (a transitive level)",
			answers: map[string]confluentAnswer{
				compat:   {200, `{"is_compatible":true}`},
				register: {409, `{"error_code":40901,"message":"Schema being registered is incompatible with an earlier schema for subject \"s-value\", details: [{errorType:'READER_FIELD_MISSING_DEFAULT_VALUE', description:'...', additionalInfo:'z'}, {oldSchemaVersion: 1}]"}`},
			},
			wantErr: `schema incompatible with an earlier version of s-value: Schema being registered is incompatible with an earlier schema for subject "s-value"`,
			want:    []string{compat, register},
		},
		{
			name: "no permission to ask: the registry checks at registration",
			answers: map[string]confluentAnswer{
				compat:   {403, `{"error_code":40301,"message":"User cannot access the resource."}`},
				register: registered,
			},
			want: []string{compat, register},
		},
		{
			name:    "the registry fails: nothing is registered",
			answers: map[string]confluentAnswer{compat: {500, `{"error_code":50001,"message":"Error while getting compatibility level for subject s-value"}`}},
			wantErr: "check compatibility of the schema under s-value",
			want:    []string{compat},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			rec := &recorder{h: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				a, ok := tc.answers[r.Method+" "+r.URL.RequestURI()]
				if !ok {
					a = confluentAnswer{404, `{"error_code":404,"message":"HTTP 404 Not Found"}`}
				}
				w.Header().Set("Content-Type", "application/vnd.schemaregistry.v1+json")
				w.WriteHeader(a.status)
				io.WriteString(w, a.body)
			})}
			srv := httptest.NewServer(rec)
			t.Cleanup(srv.Close)
			c, err := avro.NewClient(srv.URL)
			if err != nil {
				t.Fatal(err)
			}
			id, err := c.Register(ctx, "s-value", schemaAZ)
			switch {
			case tc.wantErr == "" && (err != nil || id != 7):
				t.Errorf("got (%d, %v), want id 7", id, err)
			case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
				t.Errorf("got (%d, %v), want an error saying %q", id, err, tc.wantErr)
			}
			if got := rec.take(); !slices.Equal(got, tc.want) {
				t.Errorf("requests %q, want %q", got, tc.want)
			}
		})
	}
}
