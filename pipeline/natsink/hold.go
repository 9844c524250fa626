package natsink

import (
	"errors"
	"os"
	"path/filepath"
	"time"
)

// Hold is a test hook: the sink calls it at each crash point of a batch,
// so a test can stop the process exactly there (and kill it with SIGKILL)
// instead of hoping a kill lands at the right moment. Production leaves it
// nil.
type Hold func(point string)

// The crash points of a batch.
const (
	// HoldAcked: JetStream acknowledged every record of the batch; the
	// offsets are not committed yet.
	HoldAcked = "acked"
)

// HoldEnv names the environment variable the sink's binary reads to
// install HoldInDir: test-only, unset in production.
const HoldEnv = "ONCEFLOW_TEST_NATSINK_HOLD_DIR"

// HoldInDir returns a Hold driven by files in dir. A test arms a point by
// creating dir/POINT.arm; the next batch to reach it removes that file,
// creates dir/POINT.held and waits until the test removes it. An unarmed
// point costs one failed unlink.
func HoldInDir(dir string) Hold {
	return func(point string) {
		if err := os.Remove(filepath.Join(dir, point+".arm")); err != nil {
			return // not armed
		}
		held := filepath.Join(dir, point+".held")
		if os.WriteFile(held, nil, 0o600) != nil {
			return
		}
		for {
			if _, err := os.Stat(held); errors.Is(err, os.ErrNotExist) {
				return
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
}
