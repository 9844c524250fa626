// Command franzgo-commit-abort reproduces, with franz-go and its embedded
// broker (kfake) alone, the fault described in
// docs/decisions/0026-relay-commit-waits-for-partitions.md: a transactional
// producer's first transaction, whose records are its first produce to a
// topic, is acknowledged, then EndTransaction(TryCommit) sends an abort and
// returns nil.
//
// The window is a few instructions wide and is hit under load; run.sh
// widens it with a sleep (widen.patch) in a copy of franz-go, so the
// fault shows in every run. The program exits 1 when a transaction it
// was told had committed is not read back read_committed.
package main

import (
	"context"
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
)

// abortSpy counts franz-go's log line for a commit it turned into an abort.
type abortSpy struct{ n *atomic.Int64 }

func (a abortSpy) Level() kgo.LogLevel { return kgo.LogLevelInfo }
func (a abortSpy) Log(_ kgo.LogLevel, msg string, _ ...any) {
	if strings.HasPrefix(msg, "no produce succeeded") {
		a.n.Add(1)
	}
}

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

func run() error {
	c, err := kfake.NewCluster(kfake.NumBrokers(1))
	if err != nil {
		return err
	}
	defer c.Close()
	ctx := context.Background()
	adm, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...))
	if err != nil {
		return err
	}
	defer adm.Close()
	if _, err := kadm.NewClient(adm).CreateTopic(ctx, 4, 1, nil, "t"); err != nil {
		return err
	}

	// 16 producers at once, each new (its first produce to "t" is in its
	// first transaction), each committing two records, twice over.
	var aborted, committed atomic.Int64
	var wg sync.WaitGroup
	for g := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 2 {
				if commit(ctx, c.ListenAddrs(), fmt.Sprintf("tx-%d-%d", g, i), &aborted) {
					committed.Add(2)
				}
			}
		}()
	}
	wg.Wait()

	rd, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...), kgo.ConsumeTopics("t"),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		return err
	}
	defer rd.Close()
	var read int64
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline) && read < committed.Load(); {
		fctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
		read += int64(rd.PollFetches(fctx).NumRecords())
		cancel()
	}
	fmt.Printf("records told committed %d, read back read_committed %d; commits franz-go turned into aborts: %d\n",
		committed.Load(), read, aborted.Load())
	if read != committed.Load() {
		return fmt.Errorf("lost %d records of transactions EndTransaction(TryCommit) reported committed", committed.Load()-read)
	}
	return nil
}

// commit runs one producer's first transaction and reports whether
// EndTransaction said it committed.
func commit(ctx context.Context, seeds []string, txnID string, aborted *atomic.Int64) bool {
	cl, err := kgo.NewClient(kgo.SeedBrokers(seeds...), kgo.TransactionalID(txnID),
		kgo.ProducerLinger(0), kgo.WithLogger(abortSpy{aborted}))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return false
	}
	defer cl.Close()
	if err := cl.BeginTransaction(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return false
	}
	if err := cl.ProduceSync(ctx,
		&kgo.Record{Topic: "t", Key: []byte(txnID), Value: []byte("0")},
		&kgo.Record{Topic: "t", Key: []byte(txnID), Value: []byte("1")},
	).FirstErr(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return false
	}
	return cl.EndTransaction(ctx, kgo.TryCommit) == nil
}
