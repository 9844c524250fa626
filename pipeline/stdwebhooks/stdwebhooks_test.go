package stdwebhooks_test

import (
	"net/http"
	"testing"
	"time"

	"github.com/onceflow/onceflow/pipeline/stdwebhooks"
)

// The example of the Standard Webhooks specification
// (github.com/standard-webhooks/standard-webhooks, spec/standard-webhooks.md).
const (
	specSecret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
	specID     = "msg_p5jXN8AQM9LWM0D4loKWxJek"
	specBody   = `{"test": 2432232314}`
	specSig    = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="
)

var specAt = time.Unix(1614265330, 0)

func key(t *testing.T, secret string) []byte {
	t.Helper()
	k, err := stdwebhooks.Key(secret)
	if err != nil {
		t.Fatalf("Key(%q): %v", secret, err)
	}
	return k
}

func TestSignMatchesTheSpecification(t *testing.T) {
	h := http.Header{}
	stdwebhooks.Sign(h, [][]byte{key(t, specSecret)}, specID, specAt, []byte(specBody))
	for name, want := range map[string]string{
		stdwebhooks.HeaderID:        specID,
		stdwebhooks.HeaderTimestamp: "1614265330",
		stdwebhooks.HeaderSignature: specSig,
	} {
		if got := h.Get(name); got != want {
			t.Errorf("%s: got %q, want %q", name, got, want)
		}
	}
}

func TestSignWithSeveralKeys(t *testing.T) {
	other := key(t, "whsec_"+"c2Vjb25kIGtleSBvZiBhIHJvdGF0aW9u")
	h := http.Header{}
	stdwebhooks.Sign(h, [][]byte{key(t, specSecret), other}, specID, specAt, []byte(specBody))
	sigs := h.Get(stdwebhooks.HeaderSignature)
	for _, keys := range [][][]byte{{key(t, specSecret)}, {other}} {
		if !stdwebhooks.Signed(keys, specID, "1614265330", sigs, []byte(specBody)) {
			t.Errorf("%q: not signed by one of the two keys", sigs)
		}
	}
}

func TestSigned(t *testing.T) {
	k := key(t, specSecret)
	for _, c := range []struct {
		name, id, ts, sigs, body string
		keys                     [][]byte
		want                     bool
	}{
		{"the specification's", specID, "1614265330", specSig, specBody, [][]byte{k}, true},
		{"among others", specID, "1614265330", "v2,abc v1,bm90IGl0 " + specSig, specBody, [][]byte{k}, true},
		{"by the second key", specID, "1614265330", specSig, specBody, [][]byte{[]byte("old"), k}, true},
		{"another body", specID, "1614265330", specSig, specBody + " ", [][]byte{k}, false},
		{"another id", specID + "x", "1614265330", specSig, specBody, [][]byte{k}, false},
		{"another timestamp", specID, "1614265331", specSig, specBody, [][]byte{k}, false},
		{"another key", specID, "1614265330", specSig, specBody, [][]byte{[]byte("other")}, false},
		{"no key", specID, "1614265330", specSig, specBody, nil, false},
		{"another version", specID, "1614265330", "v2" + specSig[2:], specBody, [][]byte{k}, false},
		{"not base64", specID, "1614265330", specSig[:len(specSig)-1] + "!", specBody, [][]byte{k}, false},
		{"no signature", specID, "1614265330", "", specBody, [][]byte{k}, false},
	} {
		if got := stdwebhooks.Signed(c.keys, c.id, c.ts, c.sigs, []byte(c.body)); got != c.want {
			t.Errorf("%s: got %v, want %v", c.name, got, c.want)
		}
	}
}

func TestKey(t *testing.T) {
	with, without := key(t, specSecret), key(t, specSecret[len(stdwebhooks.SecretPrefix):])
	if string(with) != string(without) || len(with) != 24 {
		t.Errorf("got %x with the prefix and %x without, want the same 24 bytes", with, without)
	}
	if _, err := stdwebhooks.Key("whsec_not base64"); err == nil {
		t.Error("got no error for a secret that is not base64")
	}
}
