package kafka

import (
	"log/slog"
	"strings"
	"testing"

	"github.com/twmb/franz-go/pkg/kgo"
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

// franz-go's info messages (joins, rebalances, transactions ended) reach
// the log only at LOG_LEVEL=debug, as debug lines; its warnings always.
func TestFranzGoLogLevelFollowsTheLogger(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		level     slog.Level
		wantLevel kgo.LogLevel
		wantInfo  bool
	}{
		{slog.LevelDebug, kgo.LogLevelInfo, true},
		{slog.LevelInfo, kgo.LogLevelWarn, false},
		{slog.LevelWarn, kgo.LogLevelWarn, false},
	} {
		var buf strings.Builder
		l := kgoLogger{slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: tc.level}))}
		if got := l.Level(); got != tc.wantLevel {
			t.Errorf("logger at %s: franz-go level %v, want %v", tc.level, got, tc.wantLevel)
		}
		if l.Level() >= kgo.LogLevelInfo {
			l.Log(kgo.LogLevelInfo, "joined", "group", "g")
		}
		l.Log(kgo.LogLevelWarn, "heartbeat failed")
		out := buf.String()
		if got := strings.Contains(out, `level=DEBUG msg=joined group=g`); got != tc.wantInfo {
			t.Errorf("logger at %s: info message logged at debug %v, want %v:\n%s", tc.level, got, tc.wantInfo, out)
		}
		if !strings.Contains(out, `level=WARN msg="heartbeat failed"`) {
			t.Errorf("logger at %s: the warning is missing:\n%s", tc.level, out)
		}
	}
}
