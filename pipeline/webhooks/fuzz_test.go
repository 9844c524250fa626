package webhooks_test

import (
	"errors"
	"net/http"
	"net/netip"
	"net/url"
	"testing"
	"time"

	"github.com/onceflow/onceflow/pipeline/stdwebhooks"
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
		h.Set(stdwebhooks.HeaderID, id)
		h.Set(stdwebhooks.HeaderTimestamp, ts)
		h.Set(stdwebhooks.HeaderSignature, sig)
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

// The guard's classification of any address: it never panics, refuses
// with ErrForbiddenAddress, classifies an address the same with a zone or
// IPv4-mapped, lets through only global unicast addresses outside the
// special ranges, and judges an address that carries an IPv4 one (NAT64,
// 6to4) by that IPv4 address even when its own range is allowed.
func FuzzGuard(f *testing.F) {
	for _, a := range []string{"127.0.0.1", "8.8.8.8", "::1", "64:ff9b::7f00:1", "2002:a9fe:a9fe::", "2001:0:808:808::f7f7:f7f7", "fe80::1", "2606:4700::1"} {
		b := netip.MustParseAddr(a).As16()
		f.Add(b[:], uint8(0))
	}
	zero := webhooks.Guard{}
	embedding := webhooks.Guard{Allow: []netip.Prefix{netip.MustParsePrefix("64:ff9b::/96"), netip.MustParsePrefix("2002::/16")}}
	ipv4Special := []netip.Prefix{netip.MustParsePrefix("0.0.0.0/8"), netip.MustParsePrefix("240.0.0.0/4"), netip.MustParsePrefix("198.18.0.0/15"), netip.MustParsePrefix("192.0.0.0/24")}
	ipv6Special := []netip.Prefix{netip.MustParsePrefix("2001::/23"), netip.MustParsePrefix("2001:db8::/32"), netip.MustParsePrefix("2002::/16"), netip.MustParsePrefix("3fff::/20")}
	within := func(ps []netip.Prefix, ip netip.Addr) bool {
		for _, p := range ps {
			if p.Contains(ip) {
				return true
			}
		}
		return false
	}
	f.Fuzz(func(t *testing.T, b []byte, low uint8) {
		var a16 [16]byte
		copy(a16[:], b)
		v6 := netip.AddrFrom16(a16)
		v4 := netip.AddrFrom4([4]byte(a16[12:16]))
		for _, g := range []webhooks.Guard{zero, embedding} {
			for _, ip := range []netip.Addr{v6, v4} {
				if err := g.Check(ip); err != nil && !errors.Is(err, webhooks.ErrForbiddenAddress) {
					t.Fatalf("Check(%s): %v, not ErrForbiddenAddress", ip, err)
				}
			}
			if (g.Check(v6) == nil) != (g.Check(v6.WithZone("eth0")) == nil) {
				t.Fatalf("%s and %s classified apart", v6, v6.WithZone("eth0"))
			}
			if (g.Check(v4) == nil) != (g.Check(netip.AddrFrom16(v4.As16())) == nil) {
				t.Fatalf("%s and its IPv4-mapped form classified apart", v4)
			}
		}
		if zero.Check(v4) == nil && (v4.IsLoopback() || v4.IsPrivate() || v4.IsLinkLocalUnicast() || v4.IsMulticast() || v4.IsUnspecified() || within(ipv4Special, v4)) {
			t.Fatalf("%s allowed", v4)
		}
		if v6.Is4In6() {
			return
		}
		if zero.Check(v6) == nil && (!netip.MustParsePrefix("2000::/3").Contains(v6) || within(ipv6Special, v6)) {
			t.Fatalf("%s allowed", v6)
		}
		// The NAT64 and 6to4 forms of v4, their own ranges allowed.
		nat := a16
		copy(nat[:12], netip.MustParseAddr("64:ff9b::").AsSlice()[:12])
		six := [16]byte{0x20, 0x02, a16[12], a16[13], a16[14], a16[15], low, low, 0, 0, 0, 0, 0, 0, 0, low}
		want := embedding.Check(v4) == nil
		for _, via := range []netip.Addr{netip.AddrFrom16(nat), netip.AddrFrom16(six)} {
			if got := embedding.Check(via) == nil; got != want {
				t.Fatalf("%s: allowed %v, but %s it reaches: allowed %v", via, got, v4, want)
			}
		}
	})
}
