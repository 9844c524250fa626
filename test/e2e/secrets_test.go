package e2e

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/onceflow/onceflow/pipeline/pipelinetest"
)

// secretEnv sets every variable that holds a secret to a value the test
// looks for in what the binaries print.
var secretEnv = map[string]string{
	"DATABASE_URL":             "postgres://onceflow:SECRET-DB@db.example:5432/onceflow",
	"KAFKA_SASL_MECHANISM":     "PLAIN",
	"KAFKA_SASL_USER":          "onceflow",
	"KAFKA_SASL_PASSWORD":      "SECRET-SASL",
	"SCHEMA_REGISTRY_URL":      "https://onceflow:SECRET-REGURL@registry.example",
	"SCHEMA_REGISTRY_PASSWORD": "SECRET-REGPW",
	"ONCEFLOW_ADMIN_TOKEN":     "SECRET-ADMIN",
	"ONCEFLOW_DEV_API_KEY":     "of_SECRET-KEY",
}

// The real binaries print no secret from their environment on stdout or
// stderr: not for -h, not for a flag error.
func TestBinariesHideSecrets(t *testing.T) {
	t.Parallel()
	for _, bin := range []string{"ingest", "relay", "processor", "projector", "onceflow"} {
		for _, args := range [][]string{{"-h"}, {"-no-such-flag"}, {"dev", "-h"}, {"dev", "-no-such-flag"}, {"migrate", "-partitions", "x"}} {
			if bin != "onceflow" && len(args) > 1 {
				continue
			}
			cmd := exec.Command(filepath.Join(binDir, bin), args...)
			cmd.Env = []string{"PATH=" + os.Getenv("PATH")}
			for k, v := range secretEnv {
				cmd.Env = append(cmd.Env, k+"="+v)
			}
			out, _ := cmd.CombinedOutput()
			if strings.Contains(string(out), "SECRET") {
				t.Errorf("%s %v prints a secret:\n%s", bin, args, out)
			}
		}
	}
}

// A component that cannot reach its database logs that, without the
// password of DATABASE_URL.
func TestFailedDatabaseConnectionLogsNoPassword(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-process end-to-end test; skipped with -short")
	}
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	pl := newPipeline(t, fmt.Sprintf("postgres://onceflow:SECRET-DB@127.0.0.1:%d/onceflow?sslmode=disable&connect_timeout=2", FreePort()))
	if _, err := pl.StartBroker(ctx); err != nil {
		t.Fatal(err)
	}
	for _, kind := range []string{"ingest", "relay", "projector"} {
		p, err := Start(filepath.Join(binDir, kind), kind, nil, map[string]string{
			"KAFKA_BROKERS": pl.BrokerAddr, "DATABASE_URL": pl.DatabaseURL, "SCHEMA_REGISTRY_URL": pl.RegistryURL,
			"ADMIN_ADDR": fmt.Sprintf("127.0.0.1:%d", FreePort()), "HTTP_ADDR": fmt.Sprintf("127.0.0.1:%d", FreePort()),
			"LOG_LEVEL": "debug",
		}, filepath.Join(pl.Dir, kind+".log"), "")
		if err != nil {
			t.Fatal(err)
		}
		pl.set(kind, p)
		pipelinetest.Eventually(t, time.Minute, func() error {
			if !strings.Contains(p.Tail(200), "database not reachable yet") {
				return errors.New("no failed connection logged yet")
			}
			return nil
		})
		p.Stop(10 * time.Second)
		log := p.Tail(1000)
		if strings.Contains(log, "SECRET") {
			t.Errorf("%s logs the database password:\n%s", kind, log)
		}
		if !strings.Contains(log, "connect") {
			t.Errorf("%s's log does not say what failed:\n%s", kind, log)
		}
	}

	// A URL pgx cannot parse, with an '@' in the password that pgx's own
	// redaction stops at: the error the relay exits with masks all of it.
	cmd := exec.CommandContext(ctx, filepath.Join(binDir, "relay"))
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "KAFKA_BROKERS=" + pl.BrokerAddr, "SCHEMA_REGISTRY_URL=" + pl.RegistryURL,
		fmt.Sprintf("ADMIN_ADDR=127.0.0.1:%d", FreePort()),
		"DATABASE_URL=postgres://onceflow:pw@SECRET-TAIL@127.0.0.1:1/onceflow?connect_timeout=x"}
	out, err := cmd.CombinedOutput()
	if err == nil || !strings.Contains(string(out), "connect_timeout") {
		t.Errorf("relay with a malformed DATABASE_URL: %v, want an exit naming connect_timeout:\n%s", err, out)
	}
	if strings.Contains(string(out), "SECRET") {
		t.Errorf("relay with a malformed DATABASE_URL prints its password:\n%s", out)
	}
}
