package ledgerapp_test

import (
	"bytes"
	"flag"
	"os"
	"testing"

	"github.com/onceflow/onceflow/examples/ledger/ledgerapp"
	"github.com/onceflow/onceflow/pipeline/ingest"
)

var update = flag.Bool("update", false, "write openapi.json from the routes")

// openapi.json is the document the ledger's ingest serves, kept in the
// repository for readers: `go test ./examples/ledger/ledgerapp -update`
// writes it again after a route changes.
func TestOpenAPIDocumentIsCurrent(t *testing.T) {
	got, err := ingest.OpenAPI(ledgerapp.Routes(), ledgerapp.Queries())
	if err != nil {
		t.Fatal(err)
	}
	got = append(got, '\n')
	if *update {
		if err := os.WriteFile("openapi.json", got, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile("openapi.json")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatal("openapi.json is not the document the routes make: run go test ./examples/ledger/ledgerapp -update")
	}
}
