package webhooks

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"syscall"
	"time"
)

// ErrForbiddenAddress is the dial error for an address the guard refuses.
var ErrForbiddenAddress = errors.New("webhooks: address not allowed")

// Guard decides which addresses a delivery may connect to: public ones,
// and those of the Allow networks.
type Guard struct {
	// Allow are networks deliveries may reach although the guard refuses
	// them otherwise (a receiver on the same network, the NAT64 prefix of
	// an IPv6-only network; ONCEFLOW_WEBHOOK_ALLOW_NETWORKS). An allowed
	// network never opens an IPv4 address through an IPv6 address that
	// embeds it: that IPv4 address is checked too.
	Allow []netip.Prefix
}

// refusedRange is a network no delivery may reach unless allowed, and
// why.
type refusedRange struct {
	prefix netip.Prefix
	name   string
}

func refuse(prefix, name string) refusedRange {
	return refusedRange{netip.MustParsePrefix(prefix), name}
}

// refusedRanges are every entry of IANA's IPv4 and IPv6 Special-Purpose
// Address Registries (whether or not the registry calls it globally
// reachable: no receiver of webhooks lives in an anycast service, a
// benchmarking or documentation network), the multicast ranges, the
// deprecated IPv6 ranges that reach further than they look, and cloud
// endpoints outside them (metadata services inside them are covered:
// 169.254.169.254, 100.100.100.200, fd00:ec2::254). Most specific first,
// so the error names the narrowest.
var refusedRanges = []refusedRange{
	// IPv4 Special-Purpose Address Registry.
	refuse("0.0.0.0/32", "this host on this network (RFC 1122)"),
	refuse("0.0.0.0/8", "this network (RFC 791)"),
	refuse("10.0.0.0/8", "private-use (RFC 1918)"),
	refuse("100.64.0.0/10", "shared address space, carrier-grade NAT (RFC 6598)"),
	refuse("127.0.0.0/8", "loopback (RFC 1122)"),
	refuse("169.254.0.0/16", "link-local, cloud metadata (RFC 3927)"),
	refuse("172.16.0.0/12", "private-use (RFC 1918)"),
	refuse("192.0.0.0/29", "IPv4 service continuity prefix (RFC 7335)"),
	refuse("192.0.0.8/32", "IPv4 dummy address (RFC 7600)"),
	refuse("192.0.0.9/32", "port control protocol anycast (RFC 7723)"),
	refuse("192.0.0.10/32", "TURN anycast (RFC 8155)"),
	refuse("192.0.0.170/31", "NAT64/DNS64 discovery (RFC 7050)"),
	refuse("192.0.0.0/24", "IETF protocol assignments (RFC 6890)"),
	refuse("192.0.2.0/24", "documentation, TEST-NET-1 (RFC 5737)"),
	refuse("192.31.196.0/24", "AS112-v4 (RFC 7535)"),
	refuse("192.52.193.0/24", "AMT (RFC 7450)"),
	refuse("192.88.99.2/32", "6a44 relay anycast (RFC 6751)"),
	refuse("192.88.99.0/24", "deprecated 6to4 relay anycast (RFC 7526)"),
	refuse("192.168.0.0/16", "private-use (RFC 1918)"),
	refuse("192.175.48.0/24", "AS112 direct delegation (RFC 7534)"),
	refuse("198.18.0.0/15", "benchmarking (RFC 2544)"),
	refuse("198.51.100.0/24", "documentation, TEST-NET-2 (RFC 5737)"),
	refuse("203.0.113.0/24", "documentation, TEST-NET-3 (RFC 5737)"),
	refuse("255.255.255.255/32", "limited broadcast (RFC 919)"),
	refuse("240.0.0.0/4", "reserved (RFC 1112)"),
	refuse("224.0.0.0/4", "multicast (RFC 5771)"),
	refuse("168.63.129.16/32", "Azure platform endpoint (WireServer)"),
	// IPv6 Special-Purpose Address Registry.
	refuse("::1/128", "loopback (RFC 4291)"),
	refuse("::/128", "unspecified (RFC 4291)"),
	// ::ffff:0:0/96, IPv4-mapped: Check takes the IPv4 address.
	refuse("::/96", "IPv4-compatible, deprecated (RFC 4291)"),
	refuse("64:ff9b::/96", "IPv4-IPv6 translation, NAT64 (RFC 6052)"),
	refuse("64:ff9b:1::/48", "local-use IPv4-IPv6 translation (RFC 8215)"),
	refuse("100::/64", "discard-only (RFC 6666)"),
	refuse("100:0:0:1::/64", "dummy IPv6 prefix (RFC 9780)"),
	refuse("2001::/32", "Teredo (RFC 4380)"),
	refuse("2001:1::1/128", "port control protocol anycast (RFC 7723)"),
	refuse("2001:1::2/128", "TURN anycast (RFC 8155)"),
	refuse("2001:1::3/128", "DNS-SD service registration protocol anycast (RFC 9665)"),
	refuse("2001:2::/48", "benchmarking (RFC 5180)"),
	refuse("2001:3::/32", "AMT (RFC 7450)"),
	refuse("2001:4:112::/48", "AS112-v6 (RFC 7535)"),
	refuse("2001:10::/28", "deprecated ORCHID (RFC 4843)"),
	refuse("2001:20::/28", "ORCHIDv2 (RFC 7343)"),
	refuse("2001:30::/28", "drone remote ID entity tags (RFC 9374)"),
	refuse("2001::/23", "IETF protocol assignments (RFC 2928)"),
	refuse("2001:db8::/32", "documentation (RFC 3849)"),
	refuse("2002::/16", "6to4 (RFC 3056)"),
	refuse("2620:4f:8000::/48", "AS112 direct delegation (RFC 7534)"),
	refuse("3fff::/20", "documentation (RFC 9637)"),
	refuse("5f00::/16", "segment routing SIDs (RFC 9602)"),
	refuse("fc00::/7", "unique local, cloud metadata (RFC 4193)"),
	refuse("fe80::/10", "link-local (RFC 4291)"),
	refuse("fec0::/10", "site-local, deprecated (RFC 3879)"),
	refuse("ff00::/8", "multicast (RFC 4291)"),
}

// globalUnicast is the IPv6 space IANA allocates for global unicast;
// the rest is reserved by the IETF (and the special ranges above).
var globalUnicast = netip.MustParsePrefix("2000::/3")

// Prefixes that carry an IPv4 address: where a connection to them ends up.
var (
	nat64      = netip.MustParsePrefix("64:ff9b::/96")
	nat64Local = netip.MustParsePrefix("64:ff9b:1::/48")
	sixToFour  = netip.MustParsePrefix("2002::/16")
	teredo     = netip.MustParsePrefix("2001::/32")
	compatible = netip.MustParsePrefix("::/96")
)

// embedded returns the IPv4 addresses an IPv6 address reaches through a
// translator or tunnel: NAT64's (RFC 6052: the last 32 bits; RFC 8215's
// local-use prefix taken the same way), 6to4's (bits 16-47), Teredo's
// server (bits 32-63) and client (the last 32, inverted), and an
// IPv4-compatible address's.
func embedded(ip netip.Addr) []netip.Addr {
	if !ip.Is6() {
		return nil
	}
	b := ip.As16()
	last := netip.AddrFrom4([4]byte(b[12:16]))
	switch {
	case nat64.Contains(ip), nat64Local.Contains(ip):
		return []netip.Addr{last}
	case sixToFour.Contains(ip):
		return []netip.Addr{netip.AddrFrom4([4]byte(b[2:6]))}
	case teredo.Contains(ip):
		return []netip.Addr{netip.AddrFrom4([4]byte(b[4:8])), netip.AddrFrom4([4]byte{^b[12], ^b[13], ^b[14], ^b[15]})}
	case compatible.Contains(ip) && ip.Compare(netip.IPv6Loopback()) > 0:
		return []netip.Addr{last}
	}
	return nil
}

// Check returns nil if a connection to ip may be made, else an error
// wrapping ErrForbiddenAddress that names the range that refuses it.
func (g Guard) Check(ip netip.Addr) error {
	// A zone (fe80::1%eth0) hides an address from netip's prefixes; a
	// mapped IPv4 address is dialled as the IPv4 one.
	ip = ip.WithZone("").Unmap()
	if !ip.IsValid() {
		return fmt.Errorf("%w: not an IP address", ErrForbiddenAddress)
	}
	for _, v4 := range embedded(ip) {
		if why := g.refusal(v4); why != "" {
			return fmt.Errorf("%w: %s reaches %s, %s", ErrForbiddenAddress, ip, v4, why)
		}
	}
	if why := g.refusal(ip); why != "" {
		return fmt.Errorf("%w: %s is %s", ErrForbiddenAddress, ip, why)
	}
	return nil
}

// refusal says which range refuses ip, "" if none does or an Allow
// network holds it.
func (g Guard) refusal(ip netip.Addr) string {
	for _, p := range g.Allow {
		if p.Contains(ip) {
			return ""
		}
	}
	for _, r := range refusedRanges {
		if r.prefix.Contains(ip) {
			return "in " + r.prefix.String() + ", " + r.name
		}
	}
	if ip.Is6() && !globalUnicast.Contains(ip) {
		return "outside IPv6 global unicast " + globalUnicast.String()
	}
	return ""
}

// Allowed reports whether a connection to ip may be made.
func (g Guard) Allowed(ip netip.Addr) bool { return g.Check(ip) == nil }

// control runs at dial time, on the address the name resolved to: the one
// actually connected to, so a name that resolves differently later (DNS
// rebinding) is checked on what it resolves to now.
func (g Guard) control(_, address string, _ syscall.RawConn) error {
	ap, err := netip.ParseAddrPort(address)
	if err != nil {
		return fmt.Errorf("%w: %q is not an address", ErrForbiddenAddress, address)
	}
	if err := g.Check(ap.Addr()); err != nil {
		return fmt.Errorf("%w (allow it with ONCEFLOW_WEBHOOK_ALLOW_NETWORKS)", err)
	}
	return nil
}

// Client returns an HTTP client whose every connection the guard checked,
// that follows no redirect, and whose requests time out after timeout.
func (g Guard) Client(timeout time.Duration) *http.Client {
	d := &net.Dialer{Timeout: timeout, KeepAlive: 30 * time.Second, Control: g.control}
	t := &http.Transport{
		Proxy: nil, // a proxy would dial for us, past the guard
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			return d.DialContext(ctx, network, addr)
		},
		MaxIdleConns:          256,
		MaxIdleConnsPerHost:   64, // a worker's deliveries to one endpoint at once, mostly
		IdleConnTimeout:       90 * time.Second,
		TLSHandshakeTimeout:   timeout,
		ResponseHeaderTimeout: timeout,
		ForceAttemptHTTP2:     true,
	}
	return &http.Client{
		Transport:     t,
		Timeout:       timeout,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
}
