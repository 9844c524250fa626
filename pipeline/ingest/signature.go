package ingest

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/onceflow/onceflow/pipeline/stdwebhooks"
)

// The signature schemes an inbound provider may use (docs/inbound.md).
const (
	// SchemeStandardWebhooks is Standard Webhooks (standardwebhooks.com,
	// used by Svix and others): headers webhook-id, webhook-timestamp
	// (Unix seconds) and webhook-signature, a space-separated list of
	// "v1,<base64 HMAC-SHA256 of id.timestamp.body>"; the secret is
	// "whsec_" and the base64 of the key.
	SchemeStandardWebhooks = "standard-webhooks"
	// SchemeStripe is Stripe's: header Stripe-Signature
	// "t=<Unix seconds>,v1=<hex HMAC-SHA256 of t.body>[,v1=…]"; the
	// secret's bytes, "whsec_" included, are the key.
	SchemeStripe = "stripe"
)

// errSignature and errStale are what a delivery that fails verification
// is refused with; the detail never says which secret or signature was
// close.
var (
	errSignature = errors.New("no signature matches")
	errStale     = errors.New("timestamp outside the tolerance")
)

// verifier checks one provider's deliveries.
type verifier struct {
	scheme    string
	keys      [][]byte // HMAC keys, one per secret (rotation: any may match)
	tolerance time.Duration
}

func newVerifier(scheme string, secrets []string, tolerance time.Duration) (verifier, error) {
	v := verifier{scheme: scheme, tolerance: tolerance}
	if len(secrets) == 0 {
		return v, errors.New("no secrets")
	}
	for i, s := range secrets {
		switch scheme {
		case SchemeStandardWebhooks:
			k, err := stdwebhooks.Key(s)
			if err != nil || len(k) == 0 {
				return v, fmt.Errorf("secret %d: want whsec_ and base64", i+1)
			}
			v.keys = append(v.keys, k)
		case SchemeStripe:
			if s == "" {
				return v, fmt.Errorf("secret %d is empty", i+1)
			}
			v.keys = append(v.keys, []byte(s))
		default:
			return v, fmt.Errorf("scheme %q: want %s or %s", scheme, SchemeStandardWebhooks, SchemeStripe)
		}
	}
	return v, nil
}

// verify checks a delivery's signature and timestamp against now. It
// returns errSignature, errStale, or a *Problem for missing headers.
func (v verifier) verify(h http.Header, body []byte, now time.Time) error {
	switch v.scheme {
	case SchemeStandardWebhooks:
		return v.standard(h, body, now)
	default:
		return v.stripe(h, body, now)
	}
}

func (v verifier) fresh(ts string, now time.Time) error {
	sec, err := strconv.ParseInt(ts, 10, 64)
	if err != nil {
		return errSignature
	}
	d := now.Sub(time.Unix(sec, 0))
	if d > v.tolerance || d < -v.tolerance {
		return errStale
	}
	return nil
}

func (v verifier) standard(h http.Header, body []byte, now time.Time) error {
	id, ts, sigs := h.Get(stdwebhooks.HeaderID), h.Get(stdwebhooks.HeaderTimestamp), h.Get(stdwebhooks.HeaderSignature)
	if id == "" || ts == "" || sigs == "" {
		return missingHeaders("webhook-id, webhook-timestamp and webhook-signature")
	}
	// The signature first: a stale timestamp is only worth saying to a
	// sender who holds the secret.
	if !stdwebhooks.Signed(v.keys, id, ts, sigs, body) {
		return errSignature
	}
	return v.fresh(ts, now)
}

func (v verifier) stripe(h http.Header, body []byte, now time.Time) error {
	header := h.Get("Stripe-Signature")
	if header == "" {
		return missingHeaders("Stripe-Signature")
	}
	var ts string
	var sigs [][]byte
	for _, part := range strings.Split(header, ",") {
		k, val, _ := strings.Cut(strings.TrimSpace(part), "=")
		switch k {
		case "t":
			ts = val
		case "v1":
			if b, err := hex.DecodeString(val); err == nil {
				sigs = append(sigs, b)
			}
		}
	}
	if ts == "" || len(sigs) == 0 {
		return errSignature
	}
	for _, k := range v.keys {
		w := stripeMAC(k, ts, body)
		for _, got := range sigs {
			if hmac.Equal(got, w) {
				return v.fresh(ts, now)
			}
		}
	}
	return errSignature
}

func stripeMAC(key []byte, ts string, body []byte) []byte {
	m := hmac.New(sha256.New, key)
	m.Write([]byte(ts + "."))
	m.Write(body)
	return m.Sum(nil)
}

func missingHeaders(which string) *Problem {
	return problem(http.StatusBadRequest, "inbound-signature-missing", "Signature headers missing",
		"this provider signs with "+which)
}

// SignStandardWebhooks returns the headers a Standard Webhooks sender
// sets for body (tests, benchmarks and `onceflow` examples sign with it).
func SignStandardWebhooks(secret, id string, at time.Time, body []byte) (http.Header, error) {
	k, err := stdwebhooks.Key(secret)
	if err != nil {
		return nil, fmt.Errorf("secret: want whsec_ and base64: %w", err)
	}
	h := http.Header{}
	stdwebhooks.Sign(h, [][]byte{k}, id, at, body)
	return h, nil
}

// SignStripe returns the Stripe-Signature header for body.
func SignStripe(secret string, at time.Time, body []byte) http.Header {
	ts := strconv.FormatInt(at.Unix(), 10)
	h := http.Header{}
	h.Set("Stripe-Signature", "t="+ts+",v1="+hex.EncodeToString(stripeMAC([]byte(secret), ts, body)))
	return h
}
