package webhooks_test

import (
	"errors"
	"net/netip"
	"testing"

	"github.com/onceflow/onceflow/pipeline/webhooks"
)

// specialPurpose is every range of IANA's IPv4 and IPv6 Special-Purpose
// Address Registries, the other ranges no delivery may reach (multicast,
// deprecated site-local and IPv4-compatible addresses, what IPv6 keeps
// outside its global unicast space), and named cloud endpoints, each with
// addresses inside it: the first, the last, and a named one where there is
// one. The guard refuses every one of them.
var specialPurpose = []struct {
	name  string
	addrs []string
}{
	// IPv4 Special-Purpose Address Registry.
	{"this network 0.0.0.0/8", []string{"0.0.0.0", "0.0.0.1", "0.255.255.255"}},
	{"private 10.0.0.0/8", []string{"10.0.0.0", "10.255.255.255"}},
	{"shared address space 100.64.0.0/10", []string{"100.64.0.0", "100.127.255.255", "100.100.100.200" /* Alibaba Cloud metadata */}},
	{"loopback 127.0.0.0/8", []string{"127.0.0.1", "127.255.255.255"}},
	{"link local 169.254.0.0/16", []string{"169.254.0.0", "169.254.169.254" /* AWS, GCP, Azure, OCI metadata */, "169.254.170.2" /* AWS ECS task metadata */, "169.254.255.255"}},
	{"private 172.16.0.0/12", []string{"172.16.0.0", "172.31.255.255"}},
	{"IETF protocol assignments 192.0.0.0/24", []string{"192.0.0.0", "192.0.0.8", "192.0.0.9", "192.0.0.10", "192.0.0.170", "192.0.0.171", "192.0.0.192" /* Oracle Cloud Classic metadata */, "192.0.0.255"}},
	{"documentation 192.0.2.0/24", []string{"192.0.2.0", "192.0.2.255"}},
	{"AS112-v4 192.31.196.0/24", []string{"192.31.196.0", "192.31.196.255"}},
	{"AMT 192.52.193.0/24", []string{"192.52.193.0", "192.52.193.255"}},
	{"6to4 relay anycast 192.88.99.0/24", []string{"192.88.99.0", "192.88.99.1", "192.88.99.2", "192.88.99.255"}},
	{"private 192.168.0.0/16", []string{"192.168.0.0", "192.168.255.255"}},
	{"AS112 192.175.48.0/24", []string{"192.175.48.0", "192.175.48.255"}},
	{"benchmarking 198.18.0.0/15", []string{"198.18.0.0", "198.19.255.255"}},
	{"documentation 198.51.100.0/24", []string{"198.51.100.0", "198.51.100.255"}},
	{"documentation 203.0.113.0/24", []string{"203.0.113.0", "203.0.113.255"}},
	{"reserved 240.0.0.0/4", []string{"240.0.0.0", "254.255.255.255"}},
	{"limited broadcast 255.255.255.255/32", []string{"255.255.255.255"}},
	// IPv6 Special-Purpose Address Registry.
	{"loopback ::1/128", []string{"::1"}},
	{"unspecified ::/128", []string{"::"}},
	{"IPv4-mapped ::ffff:0:0/96 of a refused IPv4", []string{"::ffff:127.0.0.1", "::ffff:10.0.0.1", "::ffff:169.254.169.254", "::ffff:0.0.0.0"}},
	{"IPv4-IPv6 translation 64:ff9b::/96", []string{"64:ff9b::", "64:ff9b::808:808", "64:ff9b::ffff:ffff"}},
	{"local-use IPv4-IPv6 translation 64:ff9b:1::/48", []string{"64:ff9b:1::", "64:ff9b:1::808:808", "64:ff9b:1:ffff:ffff:ffff:ffff:ffff"}},
	{"discard-only 100::/64", []string{"100::", "100::ffff:ffff:ffff:ffff"}},
	{"dummy prefix 100:0:0:1::/64", []string{"100:0:0:1::", "100:0:0:1:ffff:ffff:ffff:ffff"}},
	{"IETF protocol assignments 2001::/23", []string{"2001:1::1", "2001:1::2", "2001:1::3", "2001:2::", "2001:3::", "2001:4:112::", "2001:10::", "2001:20::", "2001:30::", "2001:1ff:ffff:ffff:ffff:ffff:ffff:ffff"}},
	{"Teredo 2001::/32", []string{"2001::", "2001:0:808:808::f7f7:f7f7", "2001:0:ffff:ffff:ffff:ffff:ffff:ffff"}},
	{"documentation 2001:db8::/32", []string{"2001:db8::", "2001:db8:ffff:ffff:ffff:ffff:ffff:ffff"}},
	{"6to4 2002::/16", []string{"2002::", "2002:808:808::1", "2002:ffff:ffff:ffff:ffff:ffff:ffff:ffff"}},
	{"AS112 2620:4f:8000::/48", []string{"2620:4f:8000::", "2620:4f:8000:ffff:ffff:ffff:ffff:ffff"}},
	{"documentation 3fff::/20", []string{"3fff::", "3fff:fff:ffff:ffff:ffff:ffff:ffff:ffff"}},
	{"segment routing SIDs 5f00::/16", []string{"5f00::", "5f00:ffff:ffff:ffff:ffff:ffff:ffff:ffff"}},
	{"unique local fc00::/7", []string{"fc00::", "fd00:ec2::254" /* AWS metadata */, "fd20:ce::254" /* GCP metadata */, "fdff:ffff:ffff:ffff:ffff:ffff:ffff:ffff"}},
	{"link local fe80::/10", []string{"fe80::", "fe80::1", "febf:ffff:ffff:ffff:ffff:ffff:ffff:ffff"}},
	// The other ranges no delivery may reach.
	{"multicast 224.0.0.0/4", []string{"224.0.0.0", "224.0.0.1", "239.255.255.255"}},
	{"multicast ff00::/8", []string{"ff00::", "ff02::1", "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff"}},
	{"site local fec0::/10 (deprecated)", []string{"fec0::", "feff:ffff:ffff:ffff:ffff:ffff:ffff:ffff"}},
	{"IPv4-compatible ::/96 (deprecated)", []string{"::2", "::808:808", "::7f00:1", "::ffff:ffff"}},
	{"outside IPv6 global unicast 2000::/3", []string{"::1:0:0:0", "1::", "1fff:ffff:ffff:ffff:ffff:ffff:ffff:ffff", "4000::", "8000::", "e000::"}},
	// Named cloud endpoints outside the ranges above.
	{"Azure WireServer 168.63.129.16", []string{"168.63.129.16"}},
	// The same addresses with an IPv6 zone, which netip's prefixes do
	// not contain.
	{"zoned", []string{"fe80::1%eth0", "fd00::1%1", "64:ff9b::7f00:1%eth0", "::1%lo"}},
}

// public are addresses the guard lets through, next to the edges of the
// ranges above.
var public = []string{
	"1.1.1.1", "8.8.8.8", "9.255.255.255", "11.0.0.0", "100.63.255.255", "100.128.0.0", "126.255.255.255", "128.0.0.0",
	"168.63.129.15", "168.63.129.17", "169.253.255.255", "169.255.0.0", "172.15.255.255", "172.32.0.0",
	"192.0.1.0", "192.0.3.0", "192.88.98.255", "192.88.100.0", "192.167.255.255", "192.169.0.0",
	"198.17.255.255", "198.20.0.0", "223.255.255.255", "::ffff:8.8.8.8",
	"2000::", "2001:200::", "2001:4860:4860::8888", "2001:db7:ffff:ffff:ffff:ffff:ffff:ffff", "2001:db9::",
	"2003::", "2606:4700:4700::1111", "2620:4f:7fff:ffff:ffff:ffff:ffff:ffff", "2620:4f:8001::", "3ffe:ffff::", "3fff:1000::",
}

// The guard refuses every special-purpose range and what it embeds,
// whatever the form of the address, and names the range in its error.
func TestGuardRefusesSpecialPurposeRanges(t *testing.T) {
	t.Parallel()
	var g webhooks.Guard
	for _, r := range specialPurpose {
		for _, a := range r.addrs {
			err := g.Check(netip.MustParseAddr(a))
			if err == nil {
				t.Errorf("%s: %s allowed, want refused", r.name, a)
				continue
			}
			if !errors.Is(err, webhooks.ErrForbiddenAddress) {
				t.Errorf("%s: %s: %v, want ErrForbiddenAddress", r.name, a, err)
			}
		}
	}
	for _, a := range public {
		if err := g.Check(netip.MustParseAddr(a)); err != nil {
			t.Errorf("%s: %v, want allowed", a, err)
		}
	}
}

// Addresses that carry an IPv4 address (NAT64, 6to4, Teredo, IPv4-mapped
// and -compatible) are checked on the IPv4 address they reach too: an
// operator who allows the translation range (an IPv6-only network behind
// NAT64) does not open loopback, private networks or cloud metadata
// through it.
func TestGuardChecksEmbeddedIPv4(t *testing.T) {
	t.Parallel()
	g := webhooks.Guard{Allow: []netip.Prefix{
		netip.MustParsePrefix("64:ff9b::/96"), netip.MustParsePrefix("64:ff9b:1::/48"),
		netip.MustParsePrefix("2002::/16"), netip.MustParsePrefix("2001::/32"), netip.MustParsePrefix("::/96"),
	}}
	for addr, want := range map[string]bool{
		"64:ff9b::808:808":   true,  // 8.8.8.8
		"64:ff9b::7f00:1":    false, // 127.0.0.1
		"64:ff9b::a9fe:a9fe": false, // 169.254.169.254
		"64:ff9b::a00:1":     false, // 10.0.0.1
		"64:ff9b::a83f:8110": false, // 168.63.129.16
		"64:ff9b:1::808:808": true,
		"64:ff9b:1::c0a8:1":  false, // 192.168.0.1
		"2002:808:808::1":    true,  // 6to4 of 8.8.8.8
		"2002:7f00:1::1":     false, // 6to4 of 127.0.0.1
		"2002:a9fe:a9fe::":   false, // 6to4 of 169.254.169.254
		// Teredo: the server's address in bits 32-63, the client's
		// inverted in the last 32.
		"2001:0:808:808:0:0:f7f7:f7f7": true,  // server 8.8.8.8, client 8.8.8.8
		"2001:0:7f00:1:0:0:f7f7:f7f7":  false, // server 127.0.0.1
		"2001:0:808:808:0:0:80ff:fffe": false, // client 127.0.0.1
		"::808:808":                    true,  // IPv4-compatible 8.8.8.8
		"::7f00:1":                     false, // IPv4-compatible 127.0.0.1
		"::ffff:a9fe:a9fe":             false, // IPv4-mapped 169.254.169.254
	} {
		err := g.Check(netip.MustParseAddr(addr))
		if got := err == nil; got != want {
			t.Errorf("Check(%s): %v, want allowed %v", addr, err, want)
		}
	}
	// Allowing the embedded IPv4 network opens it through every form.
	g.Allow = append(g.Allow, netip.MustParsePrefix("10.1.0.0/16"))
	for _, a := range []string{"64:ff9b::a01:203", "2002:a01:203::", "::ffff:10.1.2.3", "10.1.2.3"} {
		if err := g.Check(netip.MustParseAddr(a)); err != nil {
			t.Errorf("Check(%s) with 10.1.0.0/16 allowed: %v", a, err)
		}
	}
}

// The guard's cost per connection (it runs once per dial, not per
// request), next to the rule it replaced (netip's loopback, private,
// link-local, multicast and unspecified predicates and 100.64.0.0/10) as
// the baseline, over the table's addresses and the public ones.
func BenchmarkGuard(b *testing.B) {
	var addrs []netip.Addr
	for _, r := range specialPurpose {
		for _, a := range r.addrs {
			addrs = append(addrs, netip.MustParseAddr(a))
		}
	}
	for _, a := range public {
		addrs = append(addrs, netip.MustParseAddr(a))
	}
	cgnat := netip.MustParsePrefix("100.64.0.0/10")
	b.Run("baseline=previous-rule", func(b *testing.B) {
		n := 0
		for i := 0; b.Loop(); i++ {
			ip := addrs[i%len(addrs)].Unmap()
			if !(ip.IsLoopback() || ip.IsPrivate() || ip.IsLinkLocalUnicast() || ip.IsLinkLocalMulticast() ||
				ip.IsInterfaceLocalMulticast() || ip.IsMulticast() || ip.IsUnspecified() || cgnat.Contains(ip)) {
				n++
			}
		}
		b.ReportMetric(float64(n)/float64(b.N), "allowed/op")
	})
	b.Run("guard", func(b *testing.B) {
		g := webhooks.Guard{Allow: []netip.Prefix{netip.MustParsePrefix("10.1.0.0/16")}}
		n := 0
		for i := 0; b.Loop(); i++ {
			if g.Check(addrs[i%len(addrs)]) == nil {
				n++
			}
		}
		b.ReportMetric(float64(n)/float64(b.N), "allowed/op")
	})
}
