// Package stdwebhooks signs and checks Standard Webhooks
// (standardwebhooks.com, used by Svix and others), the one scheme onceflow
// both receives (pipeline/ingest's inbound providers, docs/inbound.md) and
// sends (pipeline/webhooks' deliveries, docs/webhooks.md). A delivery
// carries three headers: webhook-id, webhook-timestamp (Unix seconds) and
// webhook-signature, a space-separated list of "v1,<base64>", each the
// HMAC-SHA256 of "{id}.{timestamp}.{body}" under one key; a secret is
// "whsec_" and the base64 of its key. Several signatures are how a secret
// is rotated without a gap: the sender signs with the old and the new, and
// a receiver accepts any one it knows.
//
// What a secret must be, and what a caller says when a check fails (and
// whether the timestamp is looked at before the signature or after), are
// the callers': this package holds only the scheme.
package stdwebhooks

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// The headers of a delivery.
const (
	HeaderID        = "webhook-id"
	HeaderTimestamp = "webhook-timestamp"
	HeaderSignature = "webhook-signature"
)

// SecretPrefix starts a secret.
const SecretPrefix = "whsec_"

// Key returns a secret's HMAC key: the base64 after SecretPrefix (a secret
// without the prefix is read as the base64 alone).
func Key(secret string) ([]byte, error) {
	return base64.StdEncoding.DecodeString(strings.TrimPrefix(secret, SecretPrefix))
}

// Sign sets the headers of a delivery of body with id at at, signed with
// each of keys.
func Sign(h http.Header, keys [][]byte, id string, at time.Time, body []byte) {
	ts := strconv.FormatInt(at.Unix(), 10)
	sigs := make([]string, 0, len(keys))
	for _, k := range keys {
		sigs = append(sigs, "v1,"+base64.StdEncoding.EncodeToString(mac(k, id, ts, body)))
	}
	h.Set(HeaderID, id)
	h.Set(HeaderTimestamp, ts)
	h.Set(HeaderSignature, strings.Join(sigs, " "))
}

// Signed reports whether one of the v1 signatures in sigs (a
// webhook-signature header) is body's with id and ts under one of keys.
// Signatures of other versions, and ones that are not base64, are passed
// over; each comparison takes constant time.
func Signed(keys [][]byte, id, ts, sigs string, body []byte) bool {
	want := make([][]byte, 0, len(keys))
	for _, k := range keys {
		want = append(want, mac(k, id, ts, body))
	}
	for _, s := range strings.Fields(sigs) {
		version, sig, ok := strings.Cut(s, ",")
		if !ok || version != "v1" {
			continue
		}
		got, err := base64.StdEncoding.DecodeString(sig)
		if err != nil {
			continue
		}
		for _, w := range want {
			if hmac.Equal(got, w) {
				return true
			}
		}
	}
	return false
}

func mac(key []byte, id, ts string, body []byte) []byte {
	m := hmac.New(sha256.New, key)
	m.Write([]byte(id + "." + ts + "."))
	m.Write(body)
	return m.Sum(nil)
}
