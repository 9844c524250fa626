package onceflow_test

import (
	"log/slog"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/onceflow/onceflow"
	"github.com/onceflow/onceflow/onceflowtest"
	"github.com/onceflow/onceflow/pipeline/kafka"
	"github.com/onceflow/onceflow/pipeline/pipelinetest"
)

// `onceflow dev` prints the database URL with its password masked and does
// not echo an API key it was given; nothing it logs while starting and
// stopping carries either.
func TestDevOutputHidesSecrets(t *testing.T) {
	u, err := url.Parse(pipelinetest.DatabaseURL(t, ledgerMigrations))
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.UserPassword(u.User.Username(), "SECRET-DB") // the test server trusts 127.0.0.1: any password does
	var out pipelinetest.Buffer
	logger := slog.New(slog.NewTextHandler(&out, &slog.HandlerOptions{Level: slog.LevelDebug}))
	_, stop := onceflowtest.Dev(t, onceflow.DevConfig{
		RunConfig: onceflow.RunConfig{
			Config: onceflow.Config{
				Domains:     ledgerDomains(),
				Kafka:       kafka.Config{Logger: logger},
				Topics:      kafka.Topics{Prefix: "ledger", Partitions: 1},
				DatabaseURL: u.String(),
				Logger:      logger,
			},
			ShutdownTimeout: 20 * time.Second,
		},
		APIKey: "of_SECRET-KEY",
		Out:    &out,
	})
	stop() // what it logs while stopping too
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
