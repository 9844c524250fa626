package avro_test

import (
	"context"
	"encoding/pem"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
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
