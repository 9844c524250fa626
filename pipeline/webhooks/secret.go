package webhooks

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// SecretPrefix starts every signing secret (Standard Webhooks).
const SecretPrefix = "whsec_"

// NewSecret returns a new signing secret: whsec_ and 24 random bytes in
// base64.
func NewSecret() string {
	var b [24]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(fmt.Sprintf("webhooks: read random bytes: %v", err)) // crypto/rand never fails on Linux
	}
	return SecretPrefix + base64.StdEncoding.EncodeToString(b[:])
}

// secretKey is a secret's HMAC key.
func secretKey(secret string) ([]byte, error) {
	if !strings.HasPrefix(secret, SecretPrefix) {
		return nil, errors.New("a secret starts with " + SecretPrefix)
	}
	k, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(secret, SecretPrefix))
	if err != nil || len(k) < 16 {
		return nil, errors.New("a secret is " + SecretPrefix + " and at least 16 bytes in base64")
	}
	return k, nil
}

// ValidSecret reports whether secret can sign.
func ValidSecret(secret string) error {
	_, err := secretKey(secret)
	return err
}

func signature(key []byte, id, ts string, body []byte) string {
	m := hmac.New(sha256.New, key)
	m.Write([]byte(id + "." + ts + "."))
	m.Write(body)
	return "v1," + base64.StdEncoding.EncodeToString(m.Sum(nil))
}

// Headers names of Standard Webhooks.
const (
	HeaderID        = "webhook-id"
	HeaderTimestamp = "webhook-timestamp"
	HeaderSignature = "webhook-signature"
)

// Sign sets the Standard Webhooks headers of a delivery of body with id at
// at, signed with every one of secrets (space-separated signatures; a
// receiver accepts any one it knows, which is how a rotation keeps working
// on both sides).
func Sign(h http.Header, secrets []string, id string, at time.Time, body []byte) error {
	ts := strconv.FormatInt(at.Unix(), 10)
	sigs := make([]string, 0, len(secrets))
	for _, s := range secrets {
		k, err := secretKey(s)
		if err != nil {
			return err
		}
		sigs = append(sigs, signature(k, id, ts, body))
	}
	h.Set(HeaderID, id)
	h.Set(HeaderTimestamp, ts)
	h.Set(HeaderSignature, strings.Join(sigs, " "))
	return nil
}

// ErrSignature is Verify's error for a delivery no secret signed, or one
// whose timestamp is outside the tolerance.
var ErrSignature = errors.New("webhooks: no valid signature")

// Verify checks a delivery as a receiver does: its timestamp within
// tolerance of now, and one of its signatures made with one of secrets.
func Verify(h http.Header, secrets []string, body []byte, now time.Time, tolerance time.Duration) error {
	id, ts := h.Get(HeaderID), h.Get(HeaderTimestamp)
	sec, err := strconv.ParseInt(ts, 10, 64)
	if id == "" || err != nil {
		return ErrSignature
	}
	if d := now.Sub(time.Unix(sec, 0)); d > tolerance || d < -tolerance {
		return fmt.Errorf("%w: timestamp %s is %s from now", ErrSignature, ts, d)
	}
	for _, s := range secrets {
		k, err := secretKey(s)
		if err != nil {
			return err
		}
		want := signature(k, id, ts, body)
		for _, got := range strings.Fields(h.Get(HeaderSignature)) {
			if hmac.Equal([]byte(got), []byte(want)) {
				return nil
			}
		}
	}
	return ErrSignature
}
