package cli_test

import (
	"bytes"
	"context"
	"regexp"
	"strings"
	"testing"

	"github.com/onceflow/onceflow/pipeline/pipelinetest"
)

// `onceflow migrate version` tells where the database stands on every
// set of migrations the binary carries, the domains' as well as
// onceflow's, and says when some are pending; `onceflow migrate` applies
// them all and says what each set is at.
func TestMigrateVersionNamesEverySet(t *testing.T) {
	t.Parallel()
	url := pipelinetest.EmptyDatabaseURL(t)
	cli := func(args ...string) string {
		t.Helper()
		var out bytes.Buffer
		if err := run(context.Background(), args, func(k string) string {
			return map[string]string{"DATABASE_URL": url}[k]
		}, &out); err != nil {
			t.Fatalf("onceflow %s: %v\n%s", strings.Join(args, " "), err, out.String())
		}
		return out.String()
	}
	line := regexp.MustCompile(`(?m)^(\w+): database at version (\d+); this binary has up to (\d+)$`)
	versions := func(out string) map[string][2]string {
		got := map[string][2]string{}
		for _, m := range line.FindAllStringSubmatch(out, -1) {
			got[m[1]] = [2]string{m[2], m[3]}
		}
		return got
	}

	before := cli("migrate", "version")
	got := versions(before)
	for _, set := range []string{"onceflow", "ledger"} {
		if v, ok := got[set]; !ok || v[0] != "0" || v[1] == "0" {
			t.Errorf("before migrating, %s: %v (%v), want at 0 of more:\n%s", set, v, ok, before)
		}
	}
	if !strings.Contains(before, "pending migrations") {
		t.Errorf("before migrating, no word of pending migrations:\n%s", before)
	}

	migrated := cli("migrate")
	if !regexp.MustCompile(`(?m)^onceflow: migrated to version [1-9]\d*$`).MatchString(migrated) ||
		!regexp.MustCompile(`(?m)^ledger: migrated to version [1-9]\d*$`).MatchString(migrated) {
		t.Errorf("onceflow migrate:\n%s", migrated)
	}

	after := cli("migrate", "version")
	got = versions(after)
	for _, set := range []string{"onceflow", "ledger"} {
		if v := got[set]; v[0] != v[1] || v[0] == "0" {
			t.Errorf("after migrating, %s: %v, want at the newest", set, v)
		}
	}
	if strings.Contains(after, "pending") {
		t.Errorf("after migrating, still pending:\n%s", after)
	}
}
