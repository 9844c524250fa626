package avro

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"strings"
	"sync"

	"github.com/twmb/franz-go/pkg/sr"
)

// Client is a Registry backed by a Confluent-compatible schema registry over
// HTTP, through franz-go's sr client. It caches what it learns, forever:
// ids and the schemas behind them are immutable. Errors and unknown ids are
// not cached.
type Client struct {
	cl *sr.Client

	mu      sync.RWMutex
	ids     map[subjectSchema]int
	schemas map[int]string
}

type subjectSchema struct{ subject, schema string }

// NewClient returns a Client for the registry at url (for example
// http://localhost:8081). opts are passed to sr.NewClient after sr.URLs(url),
// for authentication, TLS or an *http.Client with other timeouts.
func NewClient(url string, opts ...sr.ClientOpt) (*Client, error) {
	cl, err := sr.NewClient(append([]sr.ClientOpt{sr.URLs(url)}, opts...)...)
	if err != nil {
		return nil, fmt.Errorf("schema registry client: %w", err)
	}
	return &Client{cl: cl, ids: map[subjectSchema]int{}, schemas: map[int]string{}}, nil
}

// ClientConfig is how to reach a Confluent-compatible registry over HTTP.
type ClientConfig struct {
	// URL is the registry's base URL (SCHEMA_REGISTRY_URL); without a
	// scheme it is http. A user and
	// password in it (https://user:pass@registry:8081) are taken out of the
	// URL and sent as HTTP basic auth.
	URL string
	// User and Password authenticate with HTTP basic auth
	// (SCHEMA_REGISTRY_USER, SCHEMA_REGISTRY_PASSWORD); set, they win over
	// the URL's. Credentials are refused over plain http to another
	// machine: use https.
	User, Password string
	// CAFile is a PEM bundle of CAs trusted for an https URL besides the
	// system's (SCHEMA_REGISTRY_CA_FILE).
	CAFile string
}

// NewClient returns a Client for the registry c describes.
func (c ClientConfig) NewClient() (*Client, error) {
	raw := c.URL
	if !strings.Contains(raw, "://") {
		raw = "http://" + raw // as sr.URLs does: "registry:8081" has always worked
	}
	u, err := url.Parse(raw)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		// url.Parse's error quotes the URL, password included.
		return nil, errors.New("schema registry URL: want http(s)://host[:port]")
	}
	user, pass := c.User, c.Password
	if u.User != nil {
		if user == "" && pass == "" {
			user = u.User.Username()
			pass, _ = u.User.Password()
		}
		u.User = nil
	}
	var opts []sr.ClientOpt
	if user != "" || pass != "" {
		if u.Scheme == "http" && !isLoopback(u.Hostname()) {
			return nil, fmt.Errorf("schema registry %s: credentials over plain http would cross the network in clear; use https", u.Redacted())
		}
		opts = append(opts, sr.BasicAuth(user, pass))
	}
	if c.CAFile != "" {
		if u.Scheme != "https" {
			return nil, fmt.Errorf("schema registry %s: a CA file needs an https URL", u.Redacted())
		}
		pem, err := os.ReadFile(c.CAFile)
		if err != nil {
			return nil, fmt.Errorf("schema registry CA file: %w", err)
		}
		roots, err := x509.SystemCertPool()
		if err != nil {
			roots = x509.NewCertPool()
		}
		if !roots.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("schema registry CA file %s: no certificates", c.CAFile)
		}
		opts = append(opts, sr.DialTLSConfig(&tls.Config{MinVersion: tls.VersionTLS12, RootCAs: roots}))
	}
	return NewClient(u.String(), opts...)
}

func isLoopback(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// Register implements Registry. It asks the registry first whether the
// schema may follow the subject's latest version (POST
// /compatibility/subjects/{subject}/versions/latest, under the level the
// registry has for the subject) and returns an *IncompatibleError with the
// registry's reasons when it may not, so a binary whose schema the
// registry refuses stops at start, saying why. An earlier version of the
// subject passes (a binary older than the latest version, during a rolling
// upgrade: readers of the latest read its records). Then it registers with
// one POST /subjects/{subject}/versions, which adds a version unless the
// subject already has the schema. When the registry does not let this
// client register (401, 403, or read-only mode) it looks the schema up
// instead, so a schema registered by a deployment step still resolves.
// A schema the registry rejects as invalid returns an error wrapping
// ErrInvalidSchema.
func (c *Client) Register(ctx context.Context, subject, schema string) (int, error) {
	key := subjectSchema{subject, schema}
	c.mu.RLock()
	id, ok := c.ids[key]
	c.mu.RUnlock()
	if ok {
		return id, nil
	}
	s := sr.Schema{Schema: schema, Type: sr.TypeAvro}
	if err := c.checkCompatible(ctx, subject, s); err != nil {
		return 0, err
	}
	id, err := c.cl.RegisterSchema(ctx, subject, s, -1, -1)
	var re *sr.ResponseError
	if errors.As(err, &re) && (re.StatusCode == http.StatusUnauthorized || re.StatusCode == http.StatusForbidden || re.ErrorCode == codeNotPermitted) {
		// Registries where producers may not register (read-only mode, no
		// write permission) still answer a lookup of a registered schema.
		ss, lerr := c.cl.LookupSchema(ctx, subject, s)
		if lerr != nil {
			return 0, fmt.Errorf("register schema under %s: %w (lookup: %v)", subject, err, lerr)
		}
		id, err = ss.ID, nil
	}
	if err != nil {
		switch {
		case errors.As(err, &re) && re.ErrorCode == codeInvalidSchema:
			return 0, fmt.Errorf("register schema under %s: %w: %v", subject, ErrInvalidSchema, err)
		case errors.As(err, &re) && re.StatusCode == http.StatusConflict:
			// Checked against more versions than the latest (a transitive
			// level), or another version registered meanwhile.
			return 0, &IncompatibleError{Subject: subject, Problems: []string{re.Message}}
		}
		return 0, fmt.Errorf("register schema under %s: %w", subject, err)
	}
	if id <= 0 {
		return 0, fmt.Errorf("register schema under %s: registry answered id %d", subject, id)
	}
	c.mu.Lock()
	c.ids[key] = id
	c.mu.Unlock()
	return id, nil
}

// checkCompatible asks the registry whether s may follow subject's latest
// version. The first question is not verbose: asked verbosely, Confluent's
// registry calls an invalid schema incompatible instead of invalid.
func (c *Client) checkCompatible(ctx context.Context, subject string, s sr.Schema) error {
	res, err := c.cl.CheckCompatibility(ctx, subject, -1, s)
	var re *sr.ResponseError
	switch {
	case err == nil && res.Is:
		return nil
	case err == nil:
		if ss, lerr := c.cl.LookupSchema(ctx, subject, s); lerr == nil && ss.ID > 0 {
			return nil // an earlier version: registering it adds nothing
		}
		res, err = c.cl.CheckCompatibility(sr.WithParams(ctx, sr.Verbose), subject, -1, s)
		if err == nil && res.Is { // a version registered meanwhile made room
			return nil
		}
		ie := &IncompatibleError{Subject: subject, Problems: res.Messages}
		if err != nil {
			ie.Problems = []string{"the registry says so (asked why: " + err.Error() + ")"}
		}
		return ie
	case errors.As(err, &re) && (re.ErrorCode == codeSubjectNotFound || re.ErrorCode == codeVersionNotFound):
		return nil // no version yet: Confluent registries before 6.1 answer 404 for "latest"
	case errors.As(err, &re) && (re.StatusCode == http.StatusUnauthorized || re.StatusCode == http.StatusForbidden):
		return nil // may not ask: registering (or looking up) is checked by the registry itself
	case errors.As(err, &re) && re.ErrorCode == codeInvalidSchema:
		return fmt.Errorf("register schema under %s: %w: %v", subject, ErrInvalidSchema, err)
	}
	return fmt.Errorf("check compatibility of the schema under %s: %w", subject, err)
}

// SchemaByID implements Registry with GET /schemas/ids/{id}.
func (c *Client) SchemaByID(ctx context.Context, id int) (string, error) {
	c.mu.RLock()
	s, ok := c.schemas[id]
	c.mu.RUnlock()
	if ok {
		return s, nil
	}
	if id <= 0 { // not a registry id: spare the request
		return "", fmt.Errorf("schema id %d: %w", id, ErrUnknownSchema)
	}
	got, err := c.cl.SchemaByID(ctx, id)
	if err != nil {
		var re *sr.ResponseError
		if errors.As(err, &re) && (re.ErrorCode == codeSchemaNotFound || re.StatusCode == http.StatusNotFound) {
			return "", fmt.Errorf("schema id %d: %w: %v", id, ErrUnknownSchema, err)
		}
		return "", fmt.Errorf("fetch schema id %d: %w", id, err)
	}
	if got.Type != sr.TypeAvro {
		return "", fmt.Errorf("schema id %d is a %s schema, not AVRO", id, got.Type)
	}
	c.mu.Lock()
	c.schemas[id] = got.Schema
	c.mu.Unlock()
	return got.Schema, nil
}
