package projector_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"

	"github.com/onceflow/onceflow/pipeline/kafka"
	"github.com/onceflow/onceflow/pipeline/pipelinetest"
	"github.com/onceflow/onceflow/pipeline/projector"
)

// waitParked waits until every partition of parts is parked for reason,
// and returns the parks.
func (e *env) waitParked(reason string, parts ...int32) map[int32]projector.ParkedPartition {
	e.t.Helper()
	out := map[int32]projector.ParkedPartition{}
	pipelinetest.Eventually(e.t, 30*time.Second, func() error {
		parked, err := projector.Parked(context.Background(), e.pool)
		if err != nil {
			return err
		}
		clear(out)
		for _, p := range parked {
			if p.Reason == reason {
				out[p.Partition] = p
			}
		}
		for _, part := range parts {
			if _, ok := out[part]; !ok {
				return fmt.Errorf("partition %d not parked for %s: %+v", part, reason, parked)
			}
		}
		return nil
	})
	return out
}

// lagRows measures the projector's lag as `onceflow lag` does.
func (e *env) lagRows() []kafka.PartitionLag {
	e.t.Helper()
	rows, err := kafka.Lag(context.Background(), pipelinetest.Client(e.t, e.brokers), []kafka.LagSource{projector.LagSource(e.pool, projector.DefaultConsumer, e.topics.Events())})
	if err != nil {
		e.t.Fatal(err)
	}
	return rows
}

// reset answers every parked partition with projector.Reset, from the
// start of the topic as it is now.
func (e *env) reset() []projector.ResetDone {
	e.t.Helper()
	done, err := projector.Reset(context.Background(), e.pool, pipelinetest.Client(e.t, e.brokers), projector.Resetting{
		Consumer: projector.DefaultConsumer, Topic: e.topics.Events(), From: projector.FromStart,
		Note: "moved to another broker", Operator: "test"})
	if err != nil {
		e.t.Fatal(err)
	}
	return done
}

// The scenario: offsets stored against one broker's topic, then
// the projector started against another broker whose topic has the same
// name, with the same database. Every partition parks (topic-changed),
// nothing of the new topic is applied or skipped, the lag counts the whole
// new log, and once the operator resets the partitions to the start every
// event of the new topic is applied once.
func TestOffsetsOfAnotherBrokerPark(t *testing.T) {
	t.Parallel()
	pipelinetest.EmbeddedOnly(t, "second broker in the test", "test/e2e TestMoveFromEmbeddedToApacheKafka")
	e := newEnv(t, 2)
	_, evs := ledgerStreams("acme", 6, 40)
	r := e.start(projector.Config{})
	e.emit(evs...)
	e.waitOffsets(projector.DefaultConsumer, e.endOffsets(), 30*time.Second)
	r.stop()

	// Another broker, the same topics by name, fewer events.
	other := *e
	other.brokers = pipelinetest.Broker(t).Addrs()
	if err := kafka.Provision(context.Background(), kadm.NewClient(pipelinetest.Client(t, other.brokers)), e.topics); err != nil {
		t.Fatal(err)
	}
	other.prod = pipelinetest.Client(t, other.brokers)
	wantB, evsB := ledgerStreams("beta", 2, 4)
	other.emit(evsB...)

	r2 := other.start(projector.Config{ParkCheckInterval: 100 * time.Millisecond})
	parks := other.waitParked("topic-changed", 0, 1)
	if d := parks[0].Detail; !strings.Contains(d, "counts another log") || !strings.Contains(d, "cluster onceflow-dev, topic id") {
		t.Errorf("detail %q: want what changed", d)
	}
	time.Sleep(500 * time.Millisecond) // nothing may be applied meanwhile
	if n := e.count(`SELECT count(*) FROM audit_log WHERE tenant = 'beta'`); n != 0 {
		t.Errorf("%d events of the new topic applied on the old offsets, want 0", n)
	}
	wantCount(t, r2, "onceflow_projector_parked_partitions", 2)
	var lag int64
	for _, row := range other.lagRows() {
		if !row.Foreign || row.Lag != row.LastStable-row.LogStart {
			t.Errorf("lag row %+v: want foreign, lag of the whole log", row)
		}
		lag += row.Lag
	}
	if lag == 0 {
		t.Errorf("lag 0 with the whole new topic unread")
	}
	if _, err := projector.Unpark(context.Background(), e.pool, projector.DefaultConsumer, e.topics.Events(), nil); err != nil {
		t.Fatal(err)
	}
	if n := e.count(`SELECT count(*) FROM projector_parked`); n != 2 {
		t.Errorf("unpark ended %d parks of a changed topic, want none", 2-n)
	}

	done := other.reset()
	if len(done) != 2 {
		t.Fatalf("reset %v, want both partitions", done)
	}
	other.waitOffsets(projector.DefaultConsumer, other.endOffsets(), 30*time.Second)
	checkBalances(t, e, "beta", wantB)
	if n := e.count(`SELECT count(*) FROM audit_log WHERE tenant = 'beta'`); n != int64(len(evsB)) {
		t.Errorf("audit_log has %d events of the new topic, want %d", n, len(evsB))
	}
	if n := e.count(`SELECT count(*) FROM projector_resets WHERE operator = 'test' AND from_topic_id <> to_topic_id`); n != 2 {
		t.Errorf("projector_resets has %d rows, want 2", n)
	}
	if n := e.count(`SELECT count(*) FROM projector_parked`); n != 0 {
		t.Errorf("%d partitions still parked", n)
	}
}

// A topic deleted and created again under a running projector: the
// partitions park (topic-changed) instead of waiting at the old offsets,
// and a reset to the start applies the new topic's events once.
func TestTopicRecreatedUnderRunningProjector(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 2)
	_, evs := ledgerStreams("acme", 6, 30)
	e.start(projector.Config{ParkCheckInterval: 100 * time.Millisecond})
	e.emit(evs...)
	e.waitOffsets(projector.DefaultConsumer, e.endOffsets(), 30*time.Second)

	ctx := context.Background()
	adm := kadm.NewClient(pipelinetest.Client(t, e.brokers))
	if _, err := adm.DeleteTopic(ctx, e.topics.Events()); err != nil {
		t.Fatal(err)
	}
	pipelinetest.Eventually(t, 10*time.Second, func() error {
		return kafka.Provision(ctx, adm, e.topics)
	})
	e.prod = pipelinetest.Client(t, e.brokers)
	wantB, evsB := ledgerStreams("beta", 2, 4)
	e.emit(evsB...)

	e.waitParked("topic-changed", 0, 1)
	if n := e.count(`SELECT count(*) FROM audit_log WHERE tenant = 'beta'`); n != 0 {
		t.Errorf("%d events of the new topic applied, want 0", n)
	}
	e.reset()
	e.waitOffsets(projector.DefaultConsumer, e.endOffsets(), 30*time.Second)
	checkBalances(t, e, "beta", wantB)
	if n := e.count(`SELECT count(*) FROM audit_log WHERE tenant = 'beta'`); n != int64(len(evsB)) {
		t.Errorf("audit_log has %d events of the new topic, want %d", n, len(evsB))
	}
}

// A plain restart parks nothing and records the topic's identity beside
// offsets that had none (rows written before it was kept); an offset past
// the log's end on the same topic (a truncated log) parks its partition,
// offset-out-of-range, with the offsets in the detail, and its lag is not 0.
func TestOffsetPastLogEndParks(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 1)
	_, evs := ledgerStreams("acme", 2, 6)
	r := e.start(projector.Config{})
	e.emit(evs...)
	e.waitOffsets(projector.DefaultConsumer, e.endOffsets(), 30*time.Second)
	r.stop()
	ctx := context.Background()
	if _, err := e.pool.Exec(ctx, `UPDATE consumer_offsets SET cluster_id = NULL, topic_id = NULL`); err != nil {
		t.Fatal(err)
	}
	r = e.start(projector.Config{})
	pipelinetest.Eventually(t, 10*time.Second, func() error {
		if n := e.count(`SELECT count(*) FROM consumer_offsets WHERE cluster_id IS NULL OR topic_id IS NULL`); n != 0 {
			return fmt.Errorf("%d offsets without their identity", n)
		}
		return nil
	})
	if n := e.count(`SELECT count(*) FROM projector_parked`); n != 0 {
		t.Fatalf("a plain restart parked %d partitions", n)
	}
	r.stop()

	end := e.endOffsets()[0]
	if _, err := e.pool.Exec(ctx, `UPDATE consumer_offsets SET next_offset = $1`, end+50); err != nil {
		t.Fatal(err)
	}
	e.start(projector.Config{})
	pk := e.waitParked("offset-out-of-range", 0)[0]
	if want := fmt.Sprintf("stored offset %d is past the end of partition 0's log (0 to %d)", end+50, end); !strings.Contains(pk.Detail, want) {
		t.Errorf("detail %q, want it to say %q", pk.Detail, want)
	}
	for _, row := range e.lagRows() {
		if row.Lag == 0 || !row.Foreign {
			t.Errorf("lag row %+v: want the whole log as lag", row)
		}
	}
}
