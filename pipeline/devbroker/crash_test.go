package devbroker

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/onceflow/onceflow/pipeline/kafka"
	"github.com/twmb/franz-go/pkg/kgo"
)

// openTransaction starts a broker on dir, leaves a transaction with one
// record open on topic t/0, and returns the broker and the producer.
func openTransaction(t *testing.T, dir, topic string) (*Broker, *kgo.Client) {
	t.Helper()
	ctx := context.Background()
	b, err := Start(Config{Addr: "127.0.0.1:0", DataDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Cluster().CreateTopic(topic, 1, nil); err != nil {
		t.Fatal(err)
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(b.Addrs()...), kgo.TransactionalID("crash-test"),
		kgo.RecordPartitioner(kgo.ManualPartitioner()), kgo.RetryTimeout(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	if err := cl.BeginTransaction(); err != nil {
		t.Fatal(err)
	}
	if err := cl.ProduceSync(ctx, &kgo.Record{Topic: topic, Value: []byte("open")}).FirstErr(); err != nil {
		t.Fatal(err)
	}
	return b, cl
}

// committedValues reads topic/0 read_committed.
func committedValues(t *testing.T, addrs []string, topic string) []string {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(addrs...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	var out []string
	err = kafka.ReadPartition(context.Background(), cl, topic, 0, true, func(r *kgo.Record) error {
		out = append(out, string(r.Value))
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// A copy of the data directory taken while a transaction is open is what
// a crash leaves. Started on it, the broker writes the ABORT marker to
// disk before it listens, so no later replay can count the records as
// committed.
func TestCrashImageAbortsOpenTransactionOnDisk(t *testing.T) {
	t.Parallel()
	live, image := t.TempDir(), t.TempDir()
	b, _ := openTransaction(t, live, "crash")
	defer b.Close()
	if err := os.CopyFS(image, os.DirFS(live)); err != nil {
		t.Fatal(err)
	}
	open, err := scanOpenTransactions(image)
	if err != nil {
		t.Fatal(err)
	}
	if len(open) != 1 || open[0].topic != "crash" || open[0].partition != 0 {
		t.Fatalf("open transactions in the crash image: %+v, want one on crash/0", open)
	}

	b2, err := Start(Config{Addr: "127.0.0.1:0", DataDir: image})
	if err != nil {
		t.Fatal(err)
	}
	if got := committedValues(t, b2.Addrs(), "crash"); len(got) != 0 {
		t.Errorf("read_committed after the crash sees %q, want nothing", got)
	}
	b2.Close()
	if open, err := scanOpenTransactions(image); err != nil || len(open) != 0 {
		t.Errorf("after recovery the log still has open transactions %+v (%v): a later replay would decide them again", open, err)
	}
}

// A clean stop keeps an open transaction open: kfake restores it, the
// producer can still commit it after the restart, and the commit holds
// through a later crash (an ABORT marker written into the live
// transaction would have the next replay drop its first records).
func TestCleanStopKeepsOpenTransaction(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	b, cl := openTransaction(t, dir, "clean")
	addr := b.Addrs()[0]
	b.Close()
	if _, err := os.Stat(filepath.Join(dir, cleanStopFile)); err != nil {
		t.Fatalf("no clean-stop mark after Close: %v", err)
	}
	b2, err := Start(Config{Addr: addr, DataDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	defer b2.Close()
	if err := cl.EndTransaction(context.Background(), kgo.TryCommit); err != nil {
		t.Fatalf("commit after a clean restart: %v", err)
	}
	if got := committedValues(t, b2.Addrs(), "clean"); len(got) != 1 || got[0] != "open" {
		t.Fatalf("read_committed after the commit sees %q, want [open]", got)
	}
	image := t.TempDir()
	if err := os.CopyFS(image, os.DirFS(dir)); err != nil {
		t.Fatal(err)
	}
	b3, err := Start(Config{Addr: "127.0.0.1:0", DataDir: image})
	if err != nil {
		t.Fatal(err)
	}
	defer b3.Close()
	if got := committedValues(t, b3.Addrs(), "clean"); len(got) != 1 || got[0] != "open" {
		t.Fatalf("read_committed after a later crash sees %q, want [open]", got)
	}
}
