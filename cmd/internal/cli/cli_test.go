package cli

import (
	"flag"
	"io"
	"log/slog"
	"strings"
	"testing"
)

// A malformed number in the environment stops the start with its name and
// value, rather than becoming 0 and an error about 0.
func TestMalformedNumericVariable(t *testing.T) {
	env := map[string]string{"ONCEFLOW_OUTBOX_SHARDS": "16x", "ONCEFLOW_PARTITIONS": "8"}
	fs := flag.NewFlagSet("test", flag.ContinueOnError)
	c := Register(fs, func(k string) string { return env[k] })
	if err := fs.Parse(nil); err != nil {
		t.Fatal(err)
	}
	_, err := c.Stack(slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err == nil || !strings.Contains(err.Error(), `ONCEFLOW_OUTBOX_SHARDS="16x"`) {
		t.Fatalf("Stack with ONCEFLOW_OUTBOX_SHARDS=16x: %v, want an error naming it", err)
	}
}
