package processor_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/onceflow/onceflow/examples/ledger"
	"github.com/onceflow/onceflow/pipeline"
	"github.com/onceflow/onceflow/pipeline/pipelinetest"
	"github.com/onceflow/onceflow/pipeline/processor"
)

// A producer writes a batch of a few hundred bytes that decompresses to 8
// MiB (the broker measures batches compressed): the processor, bounded at
// 1 MiB, does not decompress it. Its partition stops there and says so
// (Blocked, onceflow_processor_blocked_partitions); the other partition
// goes on. An operator skips it on purpose, at that offset only: the
// partition moves past it in a transaction with a DLQ record naming the
// batch's offsets, who and why (batch-too-large, not redrivable), and the
// commands after it are applied. The skip is committed: a processor that
// takes the partition over afterwards is not blocked again.
func TestDecompressionBombBlocksItsPartitionUntilSkipped(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 2)
	e.kcfg.MaxDecompressBatchBytes = 1 << 20
	p := e.start("p1", nil)
	acc, other := "acme/acc-1", "acme/acc-2"
	if partitionOfKey(acc, 2) == partitionOfKey(other, 2) {
		other = "acme/acc-3"
	}
	opens := []cmd{newCmd(acc, ledger.OpenAccount{Currency: "EUR"}), newCmd(other, ledger.OpenAccount{Currency: "EUR"})}
	e.send(opens...)
	e.waitOutcomes(30*time.Second, opens[0].id, opens[1].id)

	bomber := pipelinetest.Client(t, e.kcfg.Brokers, kgo.ProducerBatchCompression(kgo.ZstdCompression()), kgo.ProducerBatchMaxBytes(64<<20))
	bomb := e.record(newCmd(acc, ledger.Deposit{Amount: 1}))
	bomb.Value = make([]byte, 8<<20)
	got, err := bomber.ProduceSync(context.Background(), bomb).First()
	if err != nil {
		t.Fatal(err)
	}
	after, elsewhere := newCmd(acc, ledger.Deposit{Amount: 5}), newCmd(other, ledger.Deposit{Amount: 7})
	e.send(after, elsewhere)
	e.waitOutcomes(30*time.Second, elsewhere.id)
	pipelinetest.Eventually(t, 30*time.Second, func() error {
		b := p.Blocked()
		if len(b) != 1 || b[0].Partition != got.Partition || b[0].Offset != got.Offset || b[0].NextOffset != got.Offset+1 {
			return fmt.Errorf("blocked %+v, want partition %d at %d", b, got.Partition, got.Offset)
		}
		return nil
	})
	if n := p.metric(t, "onceflow_processor_blocked_partitions"); n != 1 {
		t.Errorf("blocked partitions gauge %v, want 1", n)
	}
	p.waitBalance(t, other, 7)
	p.waitBalance(t, acc, 0) // nothing after the bomb

	ctx := context.Background()
	if _, err := p.SkipBatch(ctx, e.topics.Commands(), got.Partition, got.Offset+1, "wrong offset", "alice"); !errors.Is(err, processor.ErrNotBlocked) {
		t.Errorf("a skip at another offset: %v, want ErrNotBlocked", err)
	}
	to, err := p.SkipBatch(ctx, e.topics.Commands(), got.Partition, got.Offset, "8 MiB of zeros from a test producer", "alice")
	if err != nil || to != got.Offset+1 {
		t.Fatalf("SkipBatch: %d, %v", to, err)
	}
	p.waitBalance(t, acc, 5)
	if b := p.Blocked(); len(b) != 0 {
		t.Errorf("still blocked after the skip: %+v", b)
	}
	var audit *kgo.Record
	for _, r := range e.read(e.topics.DLQ(), true) {
		if headers(r)[pipeline.HeaderDLQReason] == processor.ReasonBatchTooLarge {
			audit = r
		}
	}
	if audit == nil {
		t.Fatal("no batch-too-large record in the DLQ")
	}
	h := headers(audit)
	if h[pipeline.HeaderDLQSourceOffset] != fmt.Sprint(got.Offset) || h[processor.HeaderDLQSkippedTo] != fmt.Sprint(got.Offset+1) ||
		!strings.Contains(h[processor.HeaderDLQDetail], "alice") || !strings.Contains(h[processor.HeaderDLQDetail], "8 MiB of zeros") {
		t.Errorf("the skip's DLQ record: %v", h)
	}
	if _, err := processor.DeadLetterOf(audit).Redrive(e.topics.Commands(), time.Now()); !errors.Is(err, processor.ErrIncomplete) {
		t.Errorf("redrive of the skip's record: %v, want ErrIncomplete", err)
	}

	// The skip was committed: another processor takes the partitions over
	// and is not blocked.
	p.stop(t)
	p2 := e.start("p2", nil)
	last := newCmd(acc, ledger.Deposit{Amount: 11})
	e.send(last)
	p2.waitBalance(t, acc, 16)
	if b := p2.Blocked(); len(b) != 0 {
		t.Errorf("the next owner is blocked: %+v", b)
	}
}
