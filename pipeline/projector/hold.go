package projector

import (
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"time"
)

// Hold is a test hook: the projector calls it at each crash point of a
// batch, so a test can stop the process exactly there (and kill it with
// SIGKILL, or terminate its Postgres backend) instead of hoping a kill lands
// at the right moment. backendPID is the Postgres backend running the
// batch's transaction at HoldInTx, 0 elsewhere. Production leaves it nil.
type Hold func(point string, backendPID uint32)

// The crash points of a batch.
const (
	HoldBeforeTx    = "before-tx"    // records polled, no transaction yet
	HoldInTx        = "in-tx"        // inbox, projections and offsets written, not committed
	HoldAfterCommit = "after-commit" // committed, offsets not yet committed to Kafka
)

// HoldEnv names the environment variable the projector binary reads to
// install HoldInDir: test-only, unset in production.
const HoldEnv = "ONCEFLOW_TEST_PROJECTOR_HOLD_DIR"

// HoldInDir returns a Hold driven by files in dir. A test arms a point by
// creating dir/POINT.arm; the next batch to reach it removes that file,
// writes dir/POINT.held holding the backend pid, and waits until the test
// removes dir/POINT.held. An unarmed point costs one stat call.
func HoldInDir(dir string) Hold {
	return func(point string, pid uint32) {
		arm := filepath.Join(dir, point+".arm")
		if err := os.Remove(arm); err != nil {
			return // not armed
		}
		held := filepath.Join(dir, point+".held")
		tmp := held + ".tmp"
		if os.WriteFile(tmp, []byte(strconv.FormatUint(uint64(pid), 10)), 0o600) != nil || os.Rename(tmp, held) != nil {
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
