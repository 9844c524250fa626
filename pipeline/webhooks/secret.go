package webhooks

import (
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/onceflow/onceflow/pipeline/stdwebhooks"
)

// NewSecret returns a new signing secret: whsec_ and 24 random bytes in
// base64.
func NewSecret() string {
	var b [24]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(fmt.Sprintf("webhooks: read random bytes: %v", err)) // crypto/rand never fails on Linux
	}
	return stdwebhooks.SecretPrefix + base64.StdEncoding.EncodeToString(b[:])
}

// secretKeys are the HMAC keys of secrets; a secret is whsec_ and at least
// 16 bytes in base64.
func secretKeys(secrets []string) ([][]byte, error) {
	keys := make([][]byte, 0, len(secrets))
	for _, s := range secrets {
		if !strings.HasPrefix(s, stdwebhooks.SecretPrefix) {
			return nil, errors.New("a secret starts with " + stdwebhooks.SecretPrefix)
		}
		k, err := stdwebhooks.Key(s)
		if err != nil || len(k) < 16 {
			return nil, errors.New("a secret is " + stdwebhooks.SecretPrefix + " and at least 16 bytes in base64")
		}
		keys = append(keys, k)
	}
	return keys, nil
}

// ValidSecret reports whether secret can sign.
func ValidSecret(secret string) error {
	_, err := secretKeys([]string{secret})
	return err
}

// Sign sets the Standard Webhooks headers of a delivery of body with id at
// at, signed with every one of secrets (space-separated signatures; a
// receiver accepts any one it knows, which is how a rotation keeps working
// on both sides).
func Sign(h http.Header, secrets []string, id string, at time.Time, body []byte) error {
	keys, err := secretKeys(secrets)
	if err != nil {
		return err
	}
	stdwebhooks.Sign(h, keys, id, at, body)
	return nil
}

// ErrSignature is Verify's error for a delivery no secret signed, or one
// whose timestamp is outside the tolerance.
var ErrSignature = errors.New("webhooks: no valid signature")

// Verify checks a delivery as a receiver does: its timestamp within
// tolerance of now, and one of its signatures made with one of secrets.
func Verify(h http.Header, secrets []string, body []byte, now time.Time, tolerance time.Duration) error {
	id, ts := h.Get(stdwebhooks.HeaderID), h.Get(stdwebhooks.HeaderTimestamp)
	sec, err := strconv.ParseInt(ts, 10, 64)
	if id == "" || err != nil {
		return ErrSignature
	}
	if d := now.Sub(time.Unix(sec, 0)); d > tolerance || d < -tolerance {
		return fmt.Errorf("%w: timestamp %s is %s from now", ErrSignature, ts, d)
	}
	keys, err := secretKeys(secrets)
	if err != nil {
		return err
	}
	if !stdwebhooks.Signed(keys, id, ts, h.Get(stdwebhooks.HeaderSignature), body) {
		return ErrSignature
	}
	return nil
}
