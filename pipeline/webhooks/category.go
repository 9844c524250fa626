package webhooks

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"net"
	"strconv"

	"github.com/onceflow/onceflow/pipeline/jobs"
)

// Categories of a failed attempt, as the delivery log tells the tenant.
const (
	CategoryAddressNotAllowed = "address-not-allowed"
	CategoryDNS               = "dns"
	CategoryConnect           = "connect"
	CategoryTimeout           = "timeout"
	CategoryTLS               = "tls"
)

// Category is what the delivery log (webhook_deliveries.last_error, the
// tenant's to read) says of a failed attempt: address-not-allowed, dns,
// connect (refused, reset, closed before an answer), timeout, tls, or
// "http STATUS" for an answer. The transport's own text names what is
// inside the deployment's network — the address a name resolved to, the
// resolver, a host the guard refused — and goes to the operator only
// (river_job.errors, the worker's log).
func Category(err error) string {
	if ce, ok := jobs.AsCallError(err); ok && ce.Status != 0 {
		return "http " + strconv.Itoa(ce.Status)
	}
	var dns *net.DNSError
	var op *net.OpError
	var verify *tls.CertificateVerificationError
	var record tls.RecordHeaderError
	var alert tls.AlertError
	var unknown x509.UnknownAuthorityError
	var invalid x509.CertificateInvalidError
	var host x509.HostnameError
	var timeout interface{ Timeout() bool }
	switch {
	case errors.Is(err, ErrForbiddenAddress):
		return CategoryAddressNotAllowed
	case errors.As(err, &dns):
		return CategoryDNS
	case errors.As(err, &verify), errors.As(err, &record), errors.As(err, &alert), errors.As(err, &unknown),
		errors.As(err, &invalid), errors.As(err, &host), errors.As(err, &op) && op.Op == "remote error":
		return CategoryTLS
	case errors.Is(err, context.DeadlineExceeded), errors.As(err, &timeout) && timeout.Timeout():
		return CategoryTimeout
	}
	return CategoryConnect
}
