package devbroker

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// How the embedded broker survives its own crashes.
//
// kfake keeps a partition's log as Kafka record batches on disk and, after
// a crash, rebuilds each partition's transaction state by replaying it: a
// producer's transactional batches that no marker follows were open when
// the process died, and kfake aborts them. But that abort lives in memory
// only. The next replay after another crash sees the same batches, then
// the producer's next transaction on that partition and its COMMIT marker,
// and counts everything from the first open batch to that marker as one
// committed transaction: records the producer was told were aborted, and
// wrote again, come back to read_committed readers.
//
// So after an unclean stop the broker first writes the missing ABORT
// markers (WriteTxnMarkers, the request a coordinator sends to partition
// leaders) on a private port, saves, and only then opens its address to
// clients. A clean stop (Close) leaves cleanStopFile behind; kfake then
// restores open transactions itself and nothing is aborted.

// cleanStopFile marks a data directory whose broker stopped with Close.
const cleanStopFile = "onceflow-clean-stop"

// openTxn is a producer's transaction left open on one partition.
type openTxn struct {
	topic      string
	partition  int32
	producerID int64
	epoch      int16
}

// abortLeftOpen writes ABORT markers for the transactions a killed broker
// left open in dataDir and returns how many partitions it closed. opts
// configure the broker apart from its address and data directory.
func abortLeftOpen(dataDir string, opts []kfake.Opt) (int, error) {
	clean := filepath.Join(dataDir, cleanStopFile)
	if err := os.Remove(clean); err == nil {
		return 0, nil
	} else if !errors.Is(err, os.ErrNotExist) {
		return 0, err
	}
	open, err := scanOpenTransactions(dataDir)
	if err != nil || len(open) == 0 {
		return 0, err
	}
	c, err := kfake.NewCluster(append(slices.Clone(opts), kfake.DataDir(dataDir))...)
	if err != nil {
		return 0, fmt.Errorf("load the data directory: %w", err)
	}
	defer c.Close() // saves: the markers and the fenced epochs are on disk before clients come
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...))
	if err != nil {
		return 0, err
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	req := kmsg.NewPtrWriteTxnMarkersRequest()
	for _, o := range open {
		m := kmsg.NewWriteTxnMarkersRequestMarker()
		m.ProducerID, m.ProducerEpoch, m.Committed = o.producerID, o.epoch, false
		t := kmsg.NewWriteTxnMarkersRequestMarkerTopic()
		t.Topic, t.Partitions = o.topic, []int32{o.partition}
		m.Topics = append(m.Topics, t)
		req.Markers = append(req.Markers, m)
	}
	resp, err := req.RequestWith(ctx, cl)
	if err != nil {
		return 0, fmt.Errorf("write abort markers: %w", err)
	}
	var written int
	for _, m := range resp.Markers {
		for _, t := range m.Topics {
			for _, p := range t.Partitions {
				switch err := kerr.ErrorForCode(p.ErrorCode); {
				case err == nil:
					written++
				case errors.Is(err, kerr.UnknownTopicOrPartition):
					// A deleted topic's leftover directory: nobody reads it.
				default:
					return 0, fmt.Errorf("abort marker for producer %d on %s/%d: %w", m.ProducerID, t.Topic, p.Partition, err)
				}
			}
		}
	}
	return written, nil
}

// scanOpenTransactions reads kfake's partition logs
// (DIR/partitions/TOPIC-PARTITION/BASE.dat, record batches in the Kafka
// wire format) and returns, per partition, the producers whose last
// transactional batch no control batch follows.
func scanOpenTransactions(dataDir string) ([]openTxn, error) {
	root := filepath.Join(dataDir, "partitions")
	dirs, err := os.ReadDir(root)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []openTxn
	for _, d := range dirs {
		i := strings.LastIndexByte(d.Name(), '-')
		if !d.IsDir() || i < 0 {
			continue
		}
		topic, err := url.PathUnescape(d.Name()[:i])
		if err != nil {
			continue
		}
		part, err := strconv.ParseInt(d.Name()[i+1:], 10, 32)
		if err != nil {
			continue
		}
		open, err := scanPartition(filepath.Join(root, d.Name()))
		if err != nil {
			return nil, fmt.Errorf("%s: %w", d.Name(), err)
		}
		for pid, epoch := range open {
			out = append(out, openTxn{topic: topic, partition: int32(part), producerID: pid, epoch: epoch})
		}
	}
	return out, nil
}

// scanPartition returns the producers with an open transaction in one
// partition's segments, and their epochs.
func scanPartition(dir string) (map[int64]int16, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var bases []int64
	for _, e := range entries {
		if base, ok := strings.CutSuffix(e.Name(), ".dat"); ok {
			if n, err := strconv.ParseInt(base, 10, 64); err == nil {
				bases = append(bases, n)
			}
		}
	}
	slices.Sort(bases)
	open := map[int64]int16{}
	for _, base := range bases {
		raw, err := os.ReadFile(filepath.Join(dir, strconv.FormatInt(base, 10)+".dat")) // #nosec G304 -- a segment of the broker's own data directory
		if err != nil {
			return nil, err
		}
		for pos := 0; pos+12 <= len(raw); {
			length := int(binary.BigEndian.Uint32(raw[pos+8:])) // after the base offset
			end := pos + 12 + length
			if length <= 0 || end > len(raw) {
				break // a torn tail: kfake truncates it too
			}
			var b kmsg.RecordBatch
			if err := b.ReadFrom(raw[pos:end]); err != nil {
				break
			}
			pos = end
			const transactional, control = 0x10, 0x20
			switch {
			case b.Attributes&control != 0:
				delete(open, b.ProducerID)
			case b.Attributes&transactional != 0:
				open[b.ProducerID] = b.ProducerEpoch
			}
		}
	}
	return open, nil
}

// CrashAtNextRequest makes the process exit as a crash would (status 137:
// nothing flushed, no snapshot, open transactions left open) when the
// broker takes its next request, so between two requests and never inside
// one. A real broker logs a commit decision before it writes the markers
// and finishes writing them after a crash; kfake has no such log, and a
// process killed while it writes one transaction's markers leaves that
// transaction committed on some partitions and aborted on the others.
// Tests that restart the broker hard crash it with this (onceflow dev
// does on SIGUSR1), so they test onceflow and not that gap.
func (b *Broker) CrashAtNextRequest() {
	b.cluster.Control(func(kmsg.Request) (kmsg.Response, error, bool) {
		os.Exit(137)
		return nil, nil, true
	})
	// Make sure a request comes even if every client is idle.
	go func() {
		cl, err := kgo.NewClient(kgo.SeedBrokers(b.Addrs()...))
		if err != nil {
			return
		}
		kmsg.NewPtrMetadataRequest().RequestWith(context.Background(), cl)
	}()
}
