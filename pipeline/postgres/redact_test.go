package postgres

import (
	"context"
	"strings"
	"testing"
	"time"
)

func TestRedact(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ in, want string }{
		{"postgres://onceflow:s3cret@db:5432/onceflow?sslmode=verify-full", "postgres://onceflow:xxxxx@db:5432/onceflow?sslmode=verify-full"},
		{"postgresql://u:p%40ss@db/x", "postgresql://u:xxxxx@db/x"},
		{"postgres://postgres@127.0.0.1:54329/onceflow?sslmode=disable", "postgres://postgres@127.0.0.1:54329/onceflow?sslmode=disable"},
		{"postgres://u@db/x?password=s3cret&sslmode=require", "postgres://u@db/x?password=xxxxx&sslmode=require"},
		{"postgres://u@db/x?sslpassword=s3cret", "postgres://u@db/x?sslpassword=xxxxx"},
		{"host=db user=u password=s3cret dbname=x", "host=db user=u password=xxxxx dbname=x"},
		{"host=db password='s3 cret' dbname=x", "host=db password=xxxxx dbname=x"},
		// Not a valid URL: '@' unescaped in the password.
		{"postgres://u:SEC@RET@db/x?connect_timeout=x", "postgres://u:xxxxx@db/x?connect_timeout=x"},
	} {
		if got := Redact(tc.in); got != tc.want {
			t.Errorf("Redact(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

// Connecting with a URL that does not parse, that names no server, or
// that pgx's own redaction gets wrong returns errors without the password,
// and the error still classifies.
func TestConnectErrorsHideThePassword(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, url := range []string{
		"postgres://u:SEC@RET@127.0.0.1:1/x?connect_timeout=x",
		"postgres://u:SECRET@127.0.0.1:badport/x",
		"postgres://u:SECRET@127.0.0.1:1/x?sslmode=bogus",
		"host=127.0.0.1 port=1 password=SECRET sslmode=bogus",
		"postgres://u:SECRET@127.0.0.1:1/x?connect_timeout=1&sslmode=disable",
	} {
		_, err := Connect(ctx, url, 1)
		if err == nil {
			t.Fatalf("Connect(%s) succeeded", url)
		}
		if strings.Contains(err.Error(), "SEC") || strings.Contains(err.Error(), "RET") {
			t.Errorf("Connect error quotes the password: %v", err)
		}
		for _, f := range []func() error{
			func() error { return Reachable(ctx, url, time.Second) },
			func() error { return Migrate(ctx, url, nil) },
			func() error { _, err := MigrationVersions(ctx, url); return err },
		} {
			if err := f(); err == nil || strings.Contains(err.Error(), "SEC") {
				t.Errorf("got %v, want an error without the password", err)
			}
		}
	}
	_, err := Connect(ctx, "postgres://u:SECRET@127.0.0.1:1/x?connect_timeout=1&sslmode=disable", 1)
	if !IsUnavailable(err) {
		t.Errorf("refused connection: IsUnavailable(%v) = false, want true", err)
	}
}

func TestPlaintextRemote(t *testing.T) {
	t.Setenv("PGSSLMODE", "")
	for _, tc := range []struct {
		url  string
		want bool
	}{
		{"postgres://u@db.example:5432/x", true}, // pgx's default, prefer
		{"postgres://u@db.example/x?sslmode=prefer", true},
		{"postgres://u@db.example/x?sslmode=allow", true},
		{"postgres://u@db.example/x?sslmode=disable", true},
		{"postgres://u@db.example/x?sslmode=require", false},
		{"postgres://u@db.example/x?sslmode=verify-full", false},
		{"host=10.0.0.7 dbname=x sslmode=disable", true},
		{"postgres://u@127.0.0.1:54329/x?sslmode=disable", false},
		{"postgres://u@localhost/x?sslmode=disable", false},
		{"postgres://u@[::1]:5432/x?sslmode=disable", false},
		{"host=/var/run/postgresql dbname=x", false},
		{"postgres://u@127.0.0.1,db.example/x?sslmode=disable", true},
		{"postgres://u@db.example:bad/x", false}, // does not parse: connecting says so
	} {
		if _, got := PlaintextRemote(tc.url); got != tc.want {
			t.Errorf("PlaintextRemote(%q) = %v, want %v", tc.url, got, tc.want)
		}
	}
}
