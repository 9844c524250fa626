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
	// Allow are networks deliveries may reach although they are loopback,
	// private or link-local (a receiver on the same network;
	// ONCEFLOW_WEBHOOK_ALLOW_NETWORKS).
	Allow []netip.Prefix
}

// cgnat is the shared address space of carrier-grade NAT (RFC 6598),
// private in all but name.
var cgnat = netip.MustParsePrefix("100.64.0.0/10")

// Allowed reports whether a connection to ip may be made.
func (g Guard) Allowed(ip netip.Addr) bool {
	ip = ip.Unmap()
	for _, p := range g.Allow {
		if p.Contains(ip) {
			return true
		}
	}
	return !(ip.IsLoopback() || ip.IsPrivate() || ip.IsLinkLocalUnicast() || ip.IsLinkLocalMulticast() ||
		ip.IsInterfaceLocalMulticast() || ip.IsMulticast() || ip.IsUnspecified() || cgnat.Contains(ip) || !ip.IsValid())
}

// control runs at dial time, on the address the name resolved to: the one
// actually connected to, so a name that resolves differently later (DNS
// rebinding) is checked on what it resolves to now.
func (g Guard) control(_, address string, _ syscall.RawConn) error {
	ap, err := netip.ParseAddrPort(address)
	if err != nil {
		return fmt.Errorf("%w: %s", ErrForbiddenAddress, address)
	}
	if !g.Allowed(ap.Addr()) {
		return fmt.Errorf("%w: %s is loopback, private, link-local or otherwise not public (allow it with ONCEFLOW_WEBHOOK_ALLOW_NETWORKS)", ErrForbiddenAddress, ap.Addr())
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
