package e2e

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/onceflow/onceflow/pipeline"
	"github.com/onceflow/onceflow/pipeline/apiclient"
	"github.com/onceflow/onceflow/pipeline/kafka"
	"github.com/onceflow/onceflow/pipeline/pipelinetest"
	"github.com/onceflow/onceflow/pipeline/processor"
)

// smallBombs is how many bombs TestManySmallDecompressionBombs writes,
// and smallBombBytes what each decompresses to: under the bound of one
// batch (16 MiB), about 2 KiB each on the wire, so one fetch of a
// partition holds all of them, 4.4 GiB decompressed.
const smallBombs, smallBombBytes = 300, 15 << 20

// An attacker with write access to the commands topic writes hundreds of
// zstd batches of 15 MiB of zeros each, every one under the bound of one
// batch, while the processor is away; it comes back to a partition whose
// next fetch holds all of them (docs/security.md, "many small bombs").
// The processor decompresses no more than its poll budget between two
// polls: its peak resident memory stays far below what the bombs add up
// to, it is never restarted, each bomb goes to the DLQ as too large, and
// the deposits behind them, on the same partition and on another, are
// applied.
func TestManySmallDecompressionBombs(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	d := deploy(t, ctx)
	run, acct, other := twoAccountsApart(t, ctx, d)

	// The processor is away while the bombs are written, so that its next
	// fetch of the partition holds them all.
	if err := d.comps["processor"].Stop(30 * time.Second); err != nil {
		t.Fatal(err)
	}
	bomber := pipelinetest.Client(t, []string{d.BrokerAddr}, kgo.ProducerBatchCompression(kgo.ZstdCompression()), kgo.ProducerBatchMaxBytes(64<<20))
	zeros := make([]byte, smallBombBytes)
	for range smallBombs {
		bomb, err := kafka.CommandRecord(d.Prefix+".commands", pipeline.AggregateID("acme", acct), pipeline.NewCommandID(), "Deposit", zeros, time.Now(), "")
		if err != nil {
			t.Fatal(err)
		}
		if err := bomber.ProduceSync(ctx, bomb).FirstErr(); err != nil { // one batch each
			t.Fatal(err)
		}
	}
	behind, _, err := send(ctx, d.client, "dep-behind-"+run, func(k string) (apiclient.Accepted, *apiclient.Response, error) {
		return d.client.Deposit(ctx, k, acct, 5)
	})
	if err != nil {
		t.Fatal(err)
	}
	elsewhere, _, err := send(ctx, d.client, "dep-other-"+run, func(k string) (apiclient.Accepted, *apiclient.Response, error) {
		return d.client.Deposit(ctx, k, other, 3)
	})
	if err != nil {
		t.Fatal(err)
	}
	proc, err := d.StartComponent(ctx, "processor", "processor", nil)
	if err != nil {
		t.Fatal(err)
	}
	d.comps["processor"] = proc

	for _, id := range []string{elsewhere.CommandID, behind.CommandID} {
		if cmd, err := d.client.WaitCommand(ctx, id); err != nil || cmd.Status != "accepted" {
			t.Errorf("the deposit %s: %+v %v, want accepted", id, cmd, err)
		}
	}
	if proc.Exited() {
		t.Fatalf("the processor exited: %v", proc.Wait(ctx))
	}
	peak := peakResidentBytes(t, proc.Pid())
	const most = 1 << 30
	t.Logf("the processor's peak resident memory: %d MiB, against %d MiB of bombs", peak>>20, smallBombs*smallBombBytes>>20)
	if peak > most {
		t.Errorf("the processor's peak resident memory %d MiB, want at most %d MiB", peak>>20, most>>20)
	}
	tooLarge := 0
	for _, r := range readEvents(t, ctx, d.BrokerAddr, d.Prefix+".commands.dlq") {
		if header(r, pipeline.HeaderDLQReason) == processor.ReasonTooLarge {
			tooLarge++
		}
	}
	if tooLarge != smallBombs {
		t.Errorf("%d too-large records in the DLQ, want one for each of the %d bombs", tooLarge, smallBombs)
	}
}

// peakResidentBytes is a process's peak resident set size (VmHWM).
func peakResidentBytes(t *testing.T, pid int) int64 {
	t.Helper()
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "VmHWM:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			if err != nil {
				t.Fatalf("VmHWM %q: %v", rest, err)
			}
			return kb << 10
		}
	}
	t.Fatalf("no VmHWM in /proc/%d/status", pid)
	return 0
}
