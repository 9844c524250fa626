package e2e

import (
	"context"
	"fmt"
	"math/rand/v2"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/onceflow/onceflow/pipeline/pipelinetest"
)

// fencedErrors are what the transaction coordinator and the partition
// leaders answer a producer whose epoch another incarnation of its
// transactional id has bumped.
var fencedErrors = []string{"PRODUCER_FENCED", "INVALID_PRODUCER_EPOCH"}

// A processor paused past its transaction timeout while its supervisor
// starts another process with the same instance id (the same
// transactional id) — the classic zombie. The new process's producer
// fences the old one's: when the zombie resumes, its writes are refused
// (PRODUCER_FENCED or INVALID_PRODUCER_EPOCH from the coordinator or a
// partition leader), nothing it had sent becomes visible to a
// read_committed reader (every command has exactly one outcome, no event
// twice, versions 1..n; on Apache Kafka, no record of its fenced epoch),
// and on Apache Kafka it leaves rather than fence its successor in turn:
// it exits with an error naming the instance id, for its supervisor, while
// the successor serves on without a session restart (processor.ErrReplaced).
// On the embedded broker the zombie cannot learn that it was replaced; the
// test stops it, as its supervisor would, and checks the rest.
func TestZombieProcessorFencedByItsSuccessor(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	r := newProcRig(t, ctx)
	same := map[string]string{"ONCEFLOW_INSTANCE_ID": "zombie", "LOG_LEVEL": "debug"}
	old := r.startWith(ctx, "old", same)
	m := newProcModel(fmt.Sprintf("%x", rand.Uint32()), 30)
	r.opening(ctx, m)
	stop := make(chan struct{})
	loadDone := r.load(ctx, m, stop)

	// The old one is busy: pause it mid-batch.
	committed := func(c *Component) float64 {
		n, _ := c.Metric(ctx, `onceflow_processor_transactions_total{result="committed"}`)
		return n
	}
	before := committed(old)
	pipelinetest.Eventually(t, 30*time.Second, func() error {
		if n := committed(old); n < before+5 {
			return fmt.Errorf("old processor committed %v transactions under load", n-before)
		}
		return nil
	})
	old.Pause()
	paused := time.Now()
	t.Logf("%s SIGSTOP old", stamp())

	// Its supervisor starts another with the same instance id; it fences
	// the old producer at once and takes the partitions once the old
	// member's session has expired.
	successor := r.startWith(ctx, "new", same)
	pipelinetest.Eventually(t, 60*time.Second, func() error {
		if n := committed(successor); n < 1 {
			return fmt.Errorf("the successor has committed %v transactions", n)
		}
		return nil
	})
	if elapsed := time.Since(paused); elapsed < procSessionTimeout {
		t.Fatalf("the successor committed %s after the pause, before the old member's session (%s) could expire", elapsed, procSessionTimeout)
	}
	old.Resume()
	t.Logf("%s SIGCONT old, paused for %s", stamp(), time.Since(paused).Round(time.Millisecond))

	// The zombie's writes are refused as fenced, or (on Apache Kafka) its
	// transaction timed out in the pause and the coordinator refuses it.
	var fenced producerEpoch
	pipelinetest.Eventually(t, 60*time.Second, func() error {
		var ok bool
		if fenced, ok = fencedProducer(old.Log()); !ok {
			return fmt.Errorf("the zombie's log names none of %v: it was not refused as fenced:\n%s", fencedErrors, old.Tail(10))
		}
		return nil
	})
	if r.External {
		// Apache Kafka tells the zombie that another producer initialized
		// its transactional id since: it exits, and the successor serves on.
		pipelinetest.Eventually(t, 90*time.Second, func() error {
			if !old.Exited() {
				return fmt.Errorf("the zombie still runs:\n%s", old.Tail(5))
			}
			return nil
		})
		if log := old.Log(); !strings.Contains(log, `another process with instance id "zombie"`) {
			t.Errorf("the zombie's exit does not name the instance id its successor took:\n%s", old.Tail(20))
		}
	} else {
		// kfake re-initializes the id from the zombie's older epoch, so the
		// zombie cannot tell it was replaced: its next session fences the
		// successor, and the two take turns until its supervisor stops the
		// old one (docs/decisions/0055-apache-kafka-differences.md).
		old.Kill()
	}

	close(stop)
	if err := <-loadDone; err != nil {
		t.Fatalf("load: %v", err)
	}
	evs := r.waitSettled(ctx, m, 90*time.Second)
	r.check(evs, m)
	if successor.Exited() {
		t.Errorf("the successor exited:\n%s", successor.Tail(30))
	}
	if !r.External {
		return
	}
	// One epoch per transaction (KIP-890): the fenced epoch is the
	// zombie's transaction left open by the pause, and no record of it is
	// visible to a read_committed reader.
	for _, e := range evs {
		if e.rec.ProducerID == fenced.id && e.rec.ProducerEpoch == fenced.epoch {
			t.Errorf("event %s of the zombie's fenced transaction is visible read_committed", e.where())
		}
	}
	// The coordinator may take the zombie's check for a retry of the
	// successor's own epoch bump and accept it once (KIP-360), so the
	// successor may be fenced back once before the zombie's next check
	// refuses it (TestReplacedProcessorLeaves); twice would be the two
	// taking turns.
	if n, _ := successor.Metric(ctx, "onceflow_processor_session_restarts_total"); n > 1 {
		t.Errorf("the successor restarted %v sessions: the zombie fenced it back", n)
	}
}

// producerEpoch is a producer id and epoch.
type producerEpoch struct {
	id    int64
	epoch int16
}

// fencedLine is franz-go's debug line for a producer a broker refused as
// fenced.
var fencedLine = regexp.MustCompile(`producer ID failed due to a produce error.* id=(\d+) epoch=(\d+) err="(` + strings.Join(fencedErrors, "|") + `)`)

// leftLine is the processor's line when it leaves because the coordinator
// refused its producer (processor.ErrReplaced): a zombie whose open
// transaction timed out while it was paused learns that it was fenced
// there, having sent nothing a broker could refuse.
var leftLine = regexp.MustCompile(`another process runs with this instance id: leaving.* producer_id=(\d+) producer_epoch=(\d+) err="(` + strings.Join(fencedErrors, "|") + `)`)

// fencedProducer returns the first producer a process's log says was
// refused as fenced, by a broker or by the coordinator.
func fencedProducer(log string) (producerEpoch, bool) {
	m := fencedLine.FindStringSubmatch(log)
	if m == nil {
		m = leftLine.FindStringSubmatch(log)
	}
	if m == nil {
		return producerEpoch{}, false
	}
	id, _ := strconv.ParseInt(m[1], 10, 64)
	epoch, _ := strconv.ParseInt(m[2], 10, 16)
	return producerEpoch{id, int16(epoch)}, true
}
