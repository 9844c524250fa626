package cli_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"net/http"
	"regexp"
	"strings"
	"testing"

	"github.com/onceflow/onceflow/examples/ledger/ledgerapp"
	"github.com/onceflow/onceflow/pipeline/apiclient"
	"github.com/onceflow/onceflow/pipeline/ingest"
	"github.com/onceflow/onceflow/pipeline/pipelinetest"
)

// Keys are created, listed and revoked by id; the list never shows a key;
// a revoked key stops working on the next request, a command and a read
// alike, even one that ingest has cached; the other keys go on working;
// ingest's log never carries a key.
func TestTenantsKeys(t *testing.T) {
	ctx := context.Background()
	pool, url := pipelinetest.Pool(t, ledgerMigrations)
	getenv := func(k string) string {
		if k == "DATABASE_URL" {
			return url
		}
		return ""
	}
	onceflow := func(args ...string) (string, error) {
		var out bytes.Buffer
		err := run(ctx, args, getenv, &out)
		return out.String(), err
	}
	keyRE, idRE := regexp.MustCompile(`api key (\S+)`), regexp.MustCompile(`key id (\d+)`)
	create := func(args ...string) (id, key string) {
		t.Helper()
		out, err := onceflow(args...)
		if err != nil {
			t.Fatal(err)
		}
		k, i := keyRE.FindStringSubmatch(out), idRE.FindStringSubmatch(out)
		if k == nil || i == nil {
			t.Fatalf("%v printed %q, want a key id and the key", args, out)
		}
		return i[1], k[1]
	}
	id1, key1 := create("tenants", "create", "acme")
	id2, key2 := create("tenants", "keys", "create", "-name", "ci", "acme")
	_, key3 := create("tenants", "keys", "create", "globex")
	id4, key4 := create("tenants", "keys", "create", "acme")

	list, err := onceflow("tenants", "keys", "list")
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{key1, key2, key3, key4} {
		if strings.Contains(list, k) {
			t.Fatalf("tenants keys list shows a key:\n%s", list)
		}
	}
	if n := strings.Count(list, "\n"); n != 5 {
		t.Errorf("tenants keys list: %d lines, want a header and 4 keys:\n%s", n, list)
	}
	acme, err := onceflow("tenants", "keys", "list", "-tenant", "acme")
	if err != nil {
		t.Fatal(err)
	}
	if !regexp.MustCompile(`(?m)^`+id2+`\s+acme\s+ci\s+\S+\s+-$`).MatchString(acme) || strings.Contains(acme, "globex") {
		t.Errorf("tenants keys list -tenant acme:\n%s\nwant keys %s and %s of acme, active", acme, id1, id2)
	}

	var logs pipelinetest.Buffer
	base := startIngest(t, pool, slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug})))
	c1 := ledgerapp.Client{Client: &apiclient.Client{BaseURL: base, APIKey: key1}}
	c2 := ledgerapp.Client{Client: &apiclient.Client{BaseURL: base, APIKey: key2}}
	c4 := ledgerapp.Client{Client: &apiclient.Client{BaseURL: base, APIKey: key4}}
	// Ingest now has key1 and key4 in its cache.
	acc, _, err := c1.OpenAccount(ctx, "open", "acc-1", "EUR")
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := c4.Deposit(ctx, "before", "acc-1", 1); err != nil {
		t.Fatal(err)
	}
	if _, err := c1.Command(ctx, acc.CommandID); err != nil {
		t.Fatal(err)
	}
	(ledgerapp.Client{Client: &apiclient.Client{BaseURL: base, APIKey: "of_not-a-key"}}).Deposit(ctx, "wrong", "acc-1", 1)

	for _, id := range []string{id1, id4} {
		if out, err := onceflow("tenants", "keys", "revoke", id); err != nil || !strings.Contains(out, "revoked key "+id+" of tenant acme") {
			t.Fatalf("tenants keys revoke %s: %q, %v", id, out, err)
		}
	}
	// A read and a command, each the first request after the revocation
	// with its key (a refusal drops the key from the cache).
	if _, err := c1.Command(ctx, acc.CommandID); !apiclient.IsStatus(err, http.StatusUnauthorized) {
		t.Errorf("a read with the key just revoked: %v, want 401", err)
	}
	if _, _, err := c4.Deposit(ctx, "after", "acc-1", 1); !apiclient.IsStatus(err, http.StatusUnauthorized) {
		t.Errorf("a command with the key just revoked: %v, want 401", err)
	}
	if _, _, err := c2.Deposit(ctx, "other-key", "acc-1", 1); err != nil {
		t.Errorf("acme's other key after the revocation: %v", err)
	}
	if _, err := onceflow("tenants", "keys", "revoke", id1); !errors.Is(err, ingest.ErrNoActiveKey) {
		t.Errorf("revoking a revoked key: %v, want ErrNoActiveKey", err)
	}
	if _, err := onceflow("tenants", "keys", "revoke", key2); err == nil || strings.Contains(err.Error(), key2) {
		t.Errorf("tenants keys revoke KEY: %v, want an error that does not echo the key", err)
	}
	if list, _ := onceflow("tenants", "keys", "list", "-tenant", "acme"); regexp.MustCompile(`(?m)^` + id1 + `\s.*\s-$`).MatchString(list) {
		t.Errorf("key %s still listed as active:\n%s", id1, list)
	}
	for _, k := range []string{key1, key2, key4, "of_not-a-key"} {
		if strings.Contains(logs.String(), k) {
			t.Errorf("ingest logged a key:\n%s", logs.String())
		}
	}
}
