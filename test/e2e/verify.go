package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"time"
)

// Verify runs `onceflow verify -since since` (the real binary; the app's
// when App is set) against the deployment, with the environment its
// components get (the database, the cluster and its credentials, the
// topic prefix, Env), and returns what it printed. Its error is the
// command's: it exits non-zero when anything was lost or doubled
// (docs/operations.md#verify) or it could not verify. The end-to-end
// tests call it after their own checks; the chaos harness calls it at
// the end of a run the same way, with since covering the run.
func (pl *Pipeline) Verify(ctx context.Context, since time.Duration) (string, error) {
	env := []string{"PATH=" + os.Getenv("PATH"), "HOME=" + os.Getenv("HOME"),
		"KAFKA_BROKERS=" + pl.BrokerAddr, "DATABASE_URL=" + pl.DatabaseURL, "SCHEMA_REGISTRY_URL=" + pl.RegistryURL,
		"ONCEFLOW_TOPIC_PREFIX=" + pl.Prefix}
	for k, v := range pl.Env {
		env = append(env, k+"="+v)
	}
	for k, v := range pl.OperatorEnv { // later values win (os/exec)
		env = append(env, k+"="+v)
	}
	bin, args := filepath.Join(pl.Bin, "onceflow"), []string{"verify", "-since", since.String()}
	if pl.App != "" {
		bin = filepath.Join(pl.Bin, pl.App)
	}
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = env
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("onceflow verify -since %s: %w", since, err)
	}
	return string(out), nil
}
