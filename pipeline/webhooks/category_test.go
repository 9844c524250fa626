package webhooks_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"strings"
	"testing"
	"time"
	"unicode"

	"github.com/onceflow/onceflow/pipeline/jobs"
	"github.com/onceflow/onceflow/pipeline/pipelinetest"
	"github.com/onceflow/onceflow/pipeline/webhooks"
)

// What a failed attempt tells the tenant is its category, whatever the
// transport's error says and however it is wrapped.
func TestCategory(t *testing.T) {
	t.Parallel()
	op := func(err error) error {
		return &url.Error{Op: "Post", URL: "https://hooks.example/x", Err: &net.OpError{Op: "dial", Net: "tcp", Err: err}}
	}
	for _, c := range []struct {
		err  error
		want string
	}{
		{&jobs.CallError{Err: op(fmt.Errorf("%w: 10.0.0.7 is in 10.0.0.0/8", webhooks.ErrForbiddenAddress))}, "address-not-allowed"},
		{&jobs.CallError{Err: op(&net.DNSError{Err: "no such host", Name: "internal.corp", Server: "10.0.0.2:53", IsNotFound: true})}, "dns"},
		{&jobs.CallError{Err: op(&net.DNSError{Err: "i/o timeout", Name: "internal.corp", IsTimeout: true})}, "dns"},
		{&jobs.CallError{Err: op(errors.New("connect: connection refused"))}, "connect"},
		{&jobs.CallError{Err: &url.Error{Op: "Post", URL: "u", Err: errors.New("EOF")}}, "connect"},
		{&jobs.CallError{Err: op(context.DeadlineExceeded)}, "timeout"},
		{&jobs.CallError{Err: &url.Error{Op: "Post", URL: "u", Err: &tls.CertificateVerificationError{Err: x509.UnknownAuthorityError{}}}}, "tls"},
		{&jobs.CallError{Err: &url.Error{Op: "Post", URL: "u", Err: x509.HostnameError{Certificate: &x509.Certificate{}, Host: "10.0.0.7"}}}, "tls"},
		{&jobs.CallError{Err: &url.Error{Op: "Post", URL: "u", Err: tls.RecordHeaderError{Msg: "first record does not look like a TLS handshake"}}}, "tls"},
		{&jobs.CallError{Err: &net.OpError{Op: "remote error", Err: errors.New("tls: handshake failure")}}, "tls"},
		{&jobs.CallError{Status: 503, Body: "upstream 10.0.0.7 down"}, "http 503"},
		{fmt.Errorf("wrapped: %w", &jobs.CallError{Status: 404}), "http 404"},
	} {
		if got := webhooks.Category(c.err); got != c.want {
			t.Errorf("Category(%v) = %q, want %q", c.err, got, c.want)
		}
	}
}

// A receiver's answers and the transport's failures reach the tenant's
// delivery log as a category only (no address, host name or body), and
// the operator's record (River's errors, the attempt's note) without a
// control character of what the receiver sent.
func TestDeliveryLogTellsCategories(t *testing.T) {
	t.Parallel()
	e := newEnv(t, jobs.Config{MaxAttempts: 1})
	hostile := "internal 10.9.8.7 \x1b[2J\x1b]0;pwned\x07 \u202eevil\r\nX-Injected: 1"
	status := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(http.StatusBadGateway)
		fmt.Fprint(w, hostile)
	}))
	t.Cleanup(status.Close)
	stop := make(chan struct{})
	hang := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-r.Context().Done():
		case <-stop:
		}
	}))
	t.Cleanup(hang.Close)
	t.Cleanup(func() { close(stop) })
	tlsSrv := httptest.NewUnstartedServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	tlsSrv.Config.ErrorLog = log.New(io.Discard, "", 0) // the handshake the worker refuses
	tlsSrv.StartTLS()
	t.Cleanup(tlsSrv.Close)
	closed, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	refused := "http://" + closed.Addr().String() + "/hook"
	closed.Close()

	subs := map[string]string{
		status.URL + "/hook":  "http 502",
		hang.URL + "/hook":    "timeout",
		tlsSrv.URL + "/hook":  "tls",
		refused:               "connect",
		"http://[::1]:1/hook": "address-not-allowed", // loopback, not allowed below
	}
	for u := range subs {
		e.subscribe("acme", u)
	}
	// A timeout well above a TLS handshake under load (make test at load 60
	// under the race detector took more than 2 s for it), below the attempt.
	e.work(webhooks.Config{Allow: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}, Timeout: 10 * time.Second}, "w1")
	e.project(deposit("acme", 1))
	got := e.waitStatus("acme", len(subs), 60*time.Second, "dead")
	ids := map[string]string{}
	for _, s := range mustList(t, e) {
		ids[s.ID.String()] = s.URL
	}
	for _, d := range got {
		want := subs[ids[d.SubscriptionID.String()]]
		if d.LastError == nil || *d.LastError != want {
			t.Errorf("delivery to %s: last error %v, want %q", ids[d.SubscriptionID.String()], deref(d.LastError), want)
		}
	}
	pipelinetest.Eventually(t, 10*time.Second, func() error {
		var n int
		err := e.pool.QueryRow(context.Background(), `SELECT count(*) FROM river_job WHERE kind = 'webhook_delivery' AND finalized_at IS NOT NULL`).Scan(&n)
		if err == nil && n != len(subs) {
			err = fmt.Errorf("%d jobs finished, want %d", n, len(subs))
		}
		return err
	})
	rows, err := e.pool.Query(context.Background(), `SELECT coalesce(metadata->'output'->>'note', ''), coalesce(errors[1]->>'error', '') FROM river_job
		WHERE kind = 'webhook_delivery'`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	n := 0
	for rows.Next() {
		var note, text string
		if err := rows.Scan(&note, &text); err != nil {
			t.Fatal(err)
		}
		n++
		for _, s := range []string{note, text} {
			if strings.ContainsFunc(s, func(r rune) bool { return unicode.IsControl(r) || unicode.Is(unicode.Cf, r) }) {
				t.Errorf("operator's record %q holds a control character", s)
			}
		}
	}
	if n != len(subs) {
		t.Errorf("%d jobs, want %d", n, len(subs))
	}
}

func mustList(t *testing.T, e *env) []webhooks.Subscription {
	t.Helper()
	subs, err := webhooks.List(context.Background(), e.pool, "acme")
	if err != nil {
		t.Fatal(err)
	}
	return subs
}
