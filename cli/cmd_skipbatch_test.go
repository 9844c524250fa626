package cli_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/onceflow/onceflow/pipeline"
	"github.com/onceflow/onceflow/pipeline/kafka"
	"github.com/onceflow/onceflow/pipeline/pipelinetest"
	"github.com/onceflow/onceflow/pipeline/processor"
)

// A producer writes a batch of a few hundred bytes that decompresses to 8
// MiB to the commands topic; the processor component, bounded at 1 MiB,
// stops that partition. `onceflow lag` marks it and names the command that
// skips it; `onceflow commands skip-batch` asks the processor's admin
// address: refused without the right token, nothing skipped at another
// offset (a non-zero exit saying where to look), and at the batch's
// offset the partition moves past it, recorded in the DLQ with who and
// why, and the command behind it is decided.
func TestCommandsSkipBatch(t *testing.T) {
	t.Parallel()
	e := newCLIEnv(t)
	ctx := context.Background()
	admin := fmt.Sprintf("127.0.0.1:%d", pipelinetest.FreePort(t))
	for k, v := range map[string]string{"ADMIN_ADDR": admin, "ONCEFLOW_ADMIN_TOKEN": "op-token",
		"KAFKA_MAX_DECOMPRESS_BATCH_BYTES": fmt.Sprint(1 << 20), "ONCEFLOW_PROCESSOR_SESSION_TIMEOUT": "2s", "LOG_LEVEL": "error"} {
		e.env[k] = v
	}
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		done <- run(runCtx, []string{"processor"}, func(k string) string { return e.env[k] }, io.Discard)
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("processor: %v", err)
		}
	})
	blocked := func(want float64) error {
		resp, err := http.Get("http://" + admin + "/metrics")
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		if line := fmt.Sprintf("onceflow_processor_blocked_partitions %v\n", want); !strings.Contains(string(b), line) {
			return fmt.Errorf("/metrics has no %q", line)
		}
		return nil
	}
	pipelinetest.Eventually(t, 60*time.Second, func() error { return blocked(0) })

	// The partition has a committed offset before the bomb, as a live one
	// has, so `onceflow lag` can look at what is behind it.
	const acc = "acme/acc-1"
	out, err := e.run("produce", "-aggregate", acc, "-type", "OpenAccount", `{"currency":"EUR"}`)
	if err != nil {
		t.Fatalf("produce: %v\n%s", err, out)
	}
	var part int32
	var opened int64
	if _, err := fmt.Sscanf(out[strings.LastIndex(out, "/")+1:], "%d@%d", &part, &opened); err != nil {
		t.Fatalf("produce's output %q: %v", out, err)
	}
	pipelinetest.Eventually(t, 60*time.Second, func() error { return committed(t, e, part, opened+1) })
	bomb, err := kafka.CommandRecord(e.topics.Commands(), acc, pipeline.NewCommandID(), "Deposit", []byte{0}, time.Now(), "")
	if err != nil {
		t.Fatal(err)
	}
	bomb.Value = make([]byte, 8<<20)
	bomber := pipelinetest.Client(t, e.kcfg.Brokers, kgo.ProducerBatchCompression(kgo.ZstdCompression()), kgo.ProducerBatchMaxBytes(64<<20))
	got, err := bomber.ProduceSync(ctx, bomb).First()
	if err != nil {
		t.Fatal(err)
	}
	if got.Partition != part {
		t.Fatalf("the bomb went to partition %d, the account's is %d", got.Partition, part)
	}
	if out, err := e.run("produce", "-aggregate", acc, "-type", "Deposit", `{"amount":5}`); err != nil {
		t.Fatalf("produce: %v\n%s", err, out)
	}
	pipelinetest.Eventually(t, 60*time.Second, func() error { return blocked(1) })
	mark := fmt.Sprintf("batch-too-large@%d", got.Offset)
	if out, err := e.run("lag", "-group", "onceflow-processor"); err != nil || !strings.Contains(out, mark) ||
		!strings.Contains(out, "onceflow commands skip-batch -note WHY -admin-addr HOST:PORT PARTITION OFFSET") {
		t.Errorf("lag does not mark %s and name the command that skips it (%v):\n%s", mark, err, out)
	}

	at := fmt.Sprint(got.Offset)
	for _, bad := range []struct {
		env  map[string]string
		args []string
		want string
	}{
		{nil, []string{"-note", "zeros", fmt.Sprint(part), fmt.Sprint(got.Offset + 1)}, "nothing skipped: no processor of this process is blocked on"},
		{map[string]string{"ONCEFLOW_ADMIN_TOKEN": "wrong"}, []string{"-note", "zeros", fmt.Sprint(part), at}, "refused (401 Unauthorized): unauthorized: send Authorization"},
		{map[string]string{"ONCEFLOW_ADMIN_TOKEN": ""}, []string{"-note", "zeros", fmt.Sprint(part), at}, "ONCEFLOW_ADMIN_TOKEN (or ONCEFLOW_ADMIN_TOKEN_FILE) is required"},
		{nil, []string{fmt.Sprint(part), at}, "usage: onceflow commands skip-batch -note WHY"},
		{nil, []string{"-note", "zeros", "x", at}, "want two numbers"},
	} {
		env := map[string]string{}
		for k, v := range e.env {
			env[k] = v
		}
		for k, v := range bad.env {
			env[k] = v
		}
		var out strings.Builder
		err := run(ctx, append([]string{"commands", "skip-batch", "-operator", "alice"}, bad.args...), func(k string) string { return env[k] }, &out)
		if err == nil || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("skip-batch %v: %v, want an error with %q\n%s", bad.args, err, bad.want, out.String())
		}
	}
	if err := blocked(1); err != nil {
		t.Fatalf("a refused skip skipped: %v", err)
	}

	out, err = e.run("commands", "skip-batch", "-note", "8 MiB of zeros from a test producer", "-operator", "alice", fmt.Sprint(part), at)
	if want := fmt.Sprintf("skipped %s partition %d from %d to %d; the DLQ has its record (reason batch-too-large), skipped by admin-token (operator says \"alice\"): 8 MiB of zeros", e.topics.Commands(), got.Partition, got.Offset, got.Offset+1); err != nil || !strings.Contains(out, want) {
		t.Fatalf("skip-batch: %v, want %q in:\n%s", err, want, out)
	}
	pipelinetest.Eventually(t, 60*time.Second, func() error { return blocked(0) })
	pipelinetest.Eventually(t, 60*time.Second, func() error {
		out, err := e.run("dlq", "list", "-reason", processor.ReasonBatchTooLarge)
		if err != nil || !strings.Contains(out, "\n1 record\n") || !strings.Contains(out, `skipped by admin-token (operator says \"alice\"): 8 MiB of zeros from a test producer`) ||
			!strings.Contains(out, fmt.Sprintf("%s/%d@%d", e.topics.Commands(), got.Partition, got.Offset)) {
			return fmt.Errorf("dlq list (%v):\n%s", err, out)
		}
		return nil
	})
	// The command behind the batch is decided: the processor's offset is
	// past it.
	pipelinetest.Eventually(t, 60*time.Second, func() error { return committed(t, e, part, got.Offset+2) })
}

// committed is nil once the processor's group has committed offset at
// partition of the commands topic, as `onceflow lag -o json` reads it.
func committed(t *testing.T, e *cliEnv, partition int32, offset int64) error {
	t.Helper()
	out, err := e.run("lag", "-o", "json", "-group", "onceflow-processor")
	if err != nil {
		return fmt.Errorf("lag: %v\n%s", err, out)
	}
	var doc struct {
		Partitions []struct {
			Topic     string `json:"topic"`
			Partition int32  `json:"partition"`
			Current   int64  `json:"current_offset"`
		} `json:"partitions"`
	}
	if err := json.Unmarshal([]byte(out), &doc); err != nil {
		return fmt.Errorf("lag -o json: %v\n%s", err, out)
	}
	for _, p := range doc.Partitions {
		if p.Topic == e.topics.Commands() && p.Partition == partition && p.Current == offset {
			return nil
		}
	}
	return fmt.Errorf("the processor has not committed %d on partition %d: %+v", offset, partition, doc.Partitions)
}
