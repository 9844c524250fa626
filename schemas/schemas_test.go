package schemas_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/onceflow/onceflow/examples/ledger"
	"github.com/onceflow/onceflow/pipeline/avro"
	"github.com/onceflow/onceflow/schemas"
)

// The text the library wrote before its schemas moved here: a registry
// that has it keeps its ids, so the files must give it back exactly.
const (
	oldSnapshot = `{"type": "record", "name": "Snapshot", "namespace": "onceflow",
 "doc": "A processor's snapshot of one aggregate, written to {prefix}.state in the transaction that changed it.",
 "fields": [
   {"name": "version", "type": "long", "doc": "aggregate version of the last event evolved into state"},
   {"name": "processed", "doc": "command ids handled within the dedup window, with the command time (Unix ms)",
    "type": {"type": "array", "items": {"type": "record", "name": "Processed", "fields": [
      {"name": "command_id", "type": {"type": "fixed", "name": "UUID", "size": 16}},
      {"name": "at_ms", "type": "long"}]}}},
   {"name": "state", "type": [%s]}
 ]}`
	oldOutcomes = `{"type": "record", "name": "CommandRejected", "namespace": %[1]q,
   "doc": "A command refused for a domain reason. It does not change the aggregate, so it carries the aggregate's current version rather than a new one; command_status projects it.",
   "fields": [
     {"name": "command_type", "type": "string"},
     {"name": "reason", "type": "string"},
     {"name": "detail", "type": "string", "default": ""}]},
  {"type": "record", "name": "CommandFailed", "namespace": %[1]q,
   "doc": "A command that went to the DLQ instead of being decided (the dlq-reason is its reason). It does not change the aggregate: it carries the aggregate's current version; command_status projects it as failed.",
   "fields": [
     {"name": "command_type", "type": "string", "default": ""},
     {"name": "reason", "type": "string"},
     {"name": "detail", "type": "string", "default": ""}]}`
)

func TestSameTextAsBefore(t *testing.T) {
	if got, want := schemas.Snapshot(ledger.AccountSchema), fmt.Sprintf(oldSnapshot, strings.TrimSpace(ledger.AccountSchema)); got != want {
		t.Errorf("Snapshot(the ledger's account):\n%s\nwant\n%s", got, want)
	}
	if got, want := schemas.OutcomeRecords("onceflow.ledger"), fmt.Sprintf(oldOutcomes, "onceflow.ledger"); got != want {
		t.Errorf("OutcomeRecords:\n%s\nwant\n%s", got, want)
	}
}

// Each file is an Avro schema, and what the library builds from it is
// one: a snapshot of the ledger's account, the outcome records in a union.
func TestSchemasParse(t *testing.T) {
	for name, s := range map[string]string{
		"snapshot.avsc":         read(t, "snapshot.avsc"),
		"outcomes.avsc":         read(t, "outcomes.avsc"),
		"a snapshot":            schemas.Snapshot(ledger.AccountSchema),
		"the outcomes, a union": "[" + schemas.OutcomeRecords("x.y") + "]",
	} {
		if _, err := avro.RecordNames(s); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
}

// Every version of a schema here reads what each earlier one wrote
// (BACKWARD, the registries' default; docs/schemas.md#evolving-schemas):
// testdata/NAME.vN.avsc are the versions released, oldest first, and the
// current file is registered after them in a registry that checks.
func TestEveryVersionReadsTheEarlierOnes(t *testing.T) {
	for _, name := range []string{"snapshot", "outcomes"} {
		versions, err := filepath.Glob(filepath.Join("testdata", name+".v*.avsc"))
		if err != nil || len(versions) == 0 {
			t.Fatalf("no earlier versions of %s in testdata (%v)", name, err)
		}
		reg := avro.NewEmbedded()
		for _, v := range append(versions, name+".avsc") {
			if _, err := reg.Register(context.Background(), name+"-value", read(t, v)); err != nil {
				t.Errorf("%s: %v", v, err)
			}
		}
	}
}

func read(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
