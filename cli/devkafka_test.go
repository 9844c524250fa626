package cli_test

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/onceflow/onceflow/pipeline/pipelinetest"
)

// KAFKA_BROKERS makes `onceflow dev` run on that cluster instead of
// embedding a broker (make kafka-up): where nothing answers, dev stops
// with an error that says so and how to get one, and has started no
// broker of its own there.
func TestDevOnKafkaBrokersThatDoNotAnswer(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	env := map[string]string{
		"KAFKA_BROKERS": addr, "DATABASE_URL": pipelinetest.DatabaseURL(t, ledgerMigrations),
		"ONCEFLOW_DATA_DIR": t.TempDir(), "HTTP_ADDR": "127.0.0.1:0", "ADMIN_ADDR": "127.0.0.1:0",
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var out pipelinetest.Buffer
	err = run(ctx, []string{"dev", "-registry-addr", "127.0.0.1:0"}, func(k string) string { return env[k] }, &out)
	if err == nil || !strings.Contains(err.Error(), "no Kafka answers at KAFKA_BROKERS="+addr) || !strings.Contains(err.Error(), "make kafka-up") {
		t.Fatalf("dev on a KAFKA_BROKERS that does not answer: %v, want an error naming it and make kafka-up\n%s", err, out.String())
	}
	if c, err := net.Dial("tcp", addr); err == nil {
		c.Close()
		t.Fatalf("something listens at %s: dev started a broker of its own there", addr)
	}
}
