package onceflow

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/onceflow/onceflow/pipeline/kafka"
	"github.com/onceflow/onceflow/pipeline/pipelinetest"
)

// syncBuffer is a bytes.Buffer safe for a writer and a reader at once.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// `onceflow dev` prints the database URL with its password masked and does
// not echo an API key it was given; nothing it logs while starting and
// stopping carries either.
func TestDevOutputHidesSecrets(t *testing.T) {
	u, err := url.Parse(pipelinetest.DatabaseURL(t))
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.UserPassword(u.User.Username(), "SECRET-DB") // the test server trusts 127.0.0.1: any password does
	var out syncBuffer
	logger := slog.New(slog.NewTextHandler(&out, &slog.HandlerOptions{Level: slog.LevelDebug}))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- RunDev(ctx, DevConfig{
			RunConfig: RunConfig{
				Config: Config{
					Kafka:       kafka.Config{Logger: logger},
					Topics:      kafka.Topics{Prefix: "ledger", Partitions: 1},
					DatabaseURL: u.String(),
					Logger:      logger,
				},
				HTTPAddr: "127.0.0.1:0", AdminAddr: "127.0.0.1:0", ShutdownTimeout: 20 * time.Second,
			},
			DataDir: t.TempDir(), BrokerAddr: "127.0.0.1:0", RegistryAddr: "127.0.0.1:0",
			APIKey: "of_SECRET-KEY",
			Out:    &out,
		})
	}()
	pipelinetest.Eventually(t, 60*time.Second, func() error {
		select {
		case err := <-done:
			t.Fatalf("dev stopped: %v\n%s", err, out.String())
		default:
		}
		if !strings.Contains(out.String(), "onceflow dev is running") {
			return errors.New("no banner yet")
		}
		return nil
	})
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	text := out.String()
	if strings.Contains(text, "SECRET") {
		t.Errorf("dev prints a secret:\n%s", text)
	}
	for _, want := range []string{"postgres://postgres:xxxxx@127.0.0.1:", "Bearer $ONCEFLOW_DEV_API_KEY"} {
		if !strings.Contains(text, want) {
			t.Errorf("dev's output lacks %q:\n%s", want, text)
		}
	}
}

// The dev stack's admin server and schema registry listen on loopback
// unless told otherwise.
func TestDevListensOnLoopback(t *testing.T) {
	t.Parallel()
	var dc DevConfig
	dc.setDefaults()
	if dc.AdminAddr != "127.0.0.1:9090" || dc.RegistryAddr != "127.0.0.1:8081" || dc.BrokerAddr != "127.0.0.1:9092" {
		t.Errorf("dev defaults: admin %q registry %q broker %q, want each on 127.0.0.1", dc.AdminAddr, dc.RegistryAddr, dc.BrokerAddr)
	}
	dc = DevConfig{RunConfig: RunConfig{AdminAddr: ":9999"}}
	dc.setDefaults()
	if dc.AdminAddr != ":9999" {
		t.Errorf("ADMIN_ADDR=:9999 became %q", dc.AdminAddr)
	}
}

// A database on another machine reached without verified TLS gets a
// warning at start; a local one does not.
func TestWarnPlaintextDatabase(t *testing.T) {
	t.Setenv("PGSSLMODE", "")
	for _, tc := range []struct {
		url  string
		warn bool
	}{
		{"postgres://u:SECRET@db.example:5432/x?sslmode=disable", true},
		{"postgres://u:SECRET@db.example:5432/x", true},
		{"postgres://u:SECRET@db.example:5432/x?sslmode=verify-full", false},
		{"postgres://u:SECRET@127.0.0.1:5432/x?sslmode=disable", false},
	} {
		var out syncBuffer
		ctx, cancel := context.WithCancel(context.Background())
		cancel() // OpenDatabase warns, then stops at the canceled context
		OpenDatabase(ctx, Config{DatabaseURL: tc.url, Logger: slog.New(slog.NewTextHandler(&out, nil))}, 1)
		if got := strings.Contains(out.String(), "sslmode=verify-full"); got != tc.warn {
			t.Errorf("%s: warned %v, want %v:\n%s", tc.url, got, tc.warn, out.String())
		}
		if strings.Contains(out.String(), "SECRET") {
			t.Errorf("the warning quotes the password:\n%s", out.String())
		}
	}
}
