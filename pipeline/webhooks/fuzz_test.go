package webhooks_test

import (
	"net/http"
	"net/url"
	"testing"
	"time"

	"github.com/onceflow/onceflow/pipeline/webhooks"
)

// A subscription's URL and event types come from a tenant: Check never
// panics, and what it accepts is an absolute http(s) URL with a host and
// no user info, within the limits.
func FuzzCheck(f *testing.F) {
	for _, s := range []string{"https://example.com/hooks", "http://10.0.0.1:8080/x?y=1", "ftp://x", "https://u:p@h", "//h/p", "https://h/#f", "\x00", ""} {
		f.Add(s, "Deposited")
	}
	f.Fuzz(func(t *testing.T, raw, typ string) {
		if len(webhooks.Check(raw, []string{typ})) > 0 {
			return
		}
		u, err := url.Parse(raw)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.User != nil || len(raw) > webhooks.MaxURLLen {
			t.Fatalf("Check accepted %q (%v)", raw, err)
		}
		if typ == "" || len(typ) > webhooks.MaxEventTypeLen {
			t.Fatalf("Check accepted event type %q", typ)
		}
	})
}

// Verify reads headers a sender controls: it never panics, accepts what
// Sign made for the body, and refuses the body changed by a byte.
func FuzzVerify(f *testing.F) {
	secret := webhooks.NewSecret()
	f.Add("evt-1", "1764640000", "v1,abc", []byte(`{"type":"Deposited"}`))
	f.Add("", "x", "", []byte{})
	f.Fuzz(func(t *testing.T, id, ts, sig string, body []byte) {
		now := time.Unix(1764640000, 0)
		h := http.Header{}
		h.Set(webhooks.HeaderID, id)
		h.Set(webhooks.HeaderTimestamp, ts)
		h.Set(webhooks.HeaderSignature, sig)
		_ = webhooks.Verify(h, []string{secret}, body, now, 5*time.Minute)
		if id == "" {
			return
		}
		signed := http.Header{}
		if err := webhooks.Sign(signed, []string{secret}, id, now, body); err != nil {
			t.Fatal(err)
		}
		if err := webhooks.Verify(signed, []string{secret}, body, now, 5*time.Minute); err != nil {
			t.Fatalf("a signed delivery does not verify: %v", err)
		}
		if err := webhooks.Verify(signed, []string{secret}, append(append([]byte(nil), body...), 'x'), now, 5*time.Minute); err == nil {
			t.Fatal("a changed body verifies")
		}
	})
}
