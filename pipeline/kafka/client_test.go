package kafka

import (
	"strings"
	"testing"
)

// SASL without TLS is refused unless explicitly allowed: PLAIN would send
// the password in clear.
func TestSASLNeedsTLS(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		cfg     Config
		wantErr string
	}{
		{Config{SASLMechanism: "PLAIN", SASLUser: "u", SASLPassword: "s3cret"}, "KAFKA_ALLOW_PLAINTEXT_SASL"},
		{Config{SASLMechanism: "SCRAM-SHA-512", SASLUser: "u", SASLPassword: "s3cret"}, "KAFKA_ALLOW_PLAINTEXT_SASL"},
		{Config{SASLMechanism: "PLAIN", SASLUser: "u", SASLPassword: "s3cret", TLS: true}, ""},
		{Config{SASLMechanism: "PLAIN", SASLUser: "u", SASLPassword: "s3cret", AllowPlaintextSASL: true}, ""},
		{Config{SASLMechanism: "SCRAM-SHA-256", SASLUser: "u", SASLPassword: "s3cret", TLS: true}, ""},
		{Config{}, ""},
		{Config{TLSCAFile: "/etc/ssl/ca.pem"}, "KAFKA_TLS is not"},
		{Config{SASLMechanism: "GSSAPI", SASLUser: "u", TLS: true}, "unknown SASL mechanism"},
	} {
		_, err := tc.cfg.Opts()
		switch {
		case tc.wantErr == "" && err != nil:
			t.Errorf("%s TLS=%v allow=%v: %v, want no error", tc.cfg.SASLMechanism, tc.cfg.TLS, tc.cfg.AllowPlaintextSASL, err)
		case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
			t.Errorf("%s TLS=%v allow=%v: %v, want an error naming %s", tc.cfg.SASLMechanism, tc.cfg.TLS, tc.cfg.AllowPlaintextSASL, err, tc.wantErr)
		}
		if err != nil && strings.Contains(err.Error(), "s3cret") {
			t.Errorf("the error quotes the password: %v", err)
		}
	}
}
