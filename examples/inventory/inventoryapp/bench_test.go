package inventoryapp_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"sort"
	"strconv"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/onceflow/onceflow"
	"github.com/onceflow/onceflow/examples/inventory"
	"github.com/onceflow/onceflow/examples/inventory/inventoryapp"
	"github.com/onceflow/onceflow/pipeline"
	"github.com/onceflow/onceflow/pipeline/avro"
	"github.com/onceflow/onceflow/pipeline/kafka"
	"github.com/onceflow/onceflow/pipeline/pipelinetest"
	"github.com/onceflow/onceflow/pipeline/postgres"
)

// BenchmarkSaga measures orders per second through the saga — PlaceOrder
// on the order's processor, ReserveStock sent in its transaction to the
// item's topic and decided by the item's processor, ConfirmOrder sent back
// and decided by the order's: three decisions in three Kafka transactions
// of two processors — against the single-aggregate baseline measured on
// the same processors in the same run: AddStock, one decision per command
// with no command sent on. Both are timed from the first command produced
// straight to its commands topic to the last outcome read (read_committed)
// on inventory.events. Runs go in ABBA order so a neighbour's load falls
// on both alike; each figure is the median of its runs.
// ONCEFLOW_BENCH_ORDERS sets the commands per run (default 20000).
func BenchmarkSaga(b *testing.B) {
	n := 20000
	if v := os.Getenv("ONCEFLOW_BENCH_ORDERS"); v != "" {
		var err error
		if n, err = strconv.Atoi(v); err != nil || n < 1 {
			b.Fatalf("ONCEFLOW_BENCH_ORDERS=%q: want a positive number", v)
		}
	}
	const items = 256
	ctx := context.Background()
	brokers := pipelinetest.Broker(b).Addrs()
	url := pipelinetest.DatabaseURL(b, postgres.Migrations{Name: inventoryapp.Name, FS: inventoryapp.Migrations})
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	reg := avro.NewEmbedded()
	d := inventoryapp.Domain()
	topics := kafka.Topics{Partitions: 8}
	runCtx, cancel := context.WithCancel(ctx)
	started := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		done <- onceflow.RunComponents(runCtx, onceflow.RunConfig{
			Config: onceflow.Config{
				Domains: []*onceflow.Domain{d}, Kafka: kafka.Config{Brokers: brokers, Logger: logger},
				Topics: topics, DatabaseURL: url, Logger: logger,
			},
			Components: onceflow.Components{Processor: true},
			Registry:   reg, AdminAddr: "127.0.0.1:0",
			Started: func(onceflow.Addrs) { close(started) },
		})
	}()
	defer func() {
		cancel()
		if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
			b.Errorf("processors: %v", err)
		}
	}()
	select {
	case <-started:
	case err := <-done:
		done <- err // for the deferred stop
		b.Fatalf("processors stopped: %v", err)
	}
	orderSerdes, err := onceflow.NewSerdes(ctx, reg, d, "order", topics)
	if err != nil {
		b.Fatal(err)
	}
	itemSerdes, err := onceflow.NewSerdes(ctx, reg, d, "item", topics)
	if err != nil {
		b.Fatal(err)
	}
	cl := pipelinetest.Client(b, brokers, kgo.ProducerLinger(5*time.Millisecond), kgo.MaxBufferedRecords(1<<20))
	item := func(i int) string { return fmt.Sprintf("item-%03d", i%items) }

	// run produces n commands and returns how many per second reached
	// their outcome on the events topic.
	run := func(name string, topic string, encode func(context.Context, any) ([]byte, error), cmd func(i int) (string, pipeline.Message), outcome map[string]bool) float64 {
		b.Helper()
		ends, err := kadm.NewClient(cl).ListEndOffsets(ctx, "inventory.events")
		if err != nil {
			b.Fatal(err)
		}
		from := map[string]map[int32]kgo.Offset{"inventory.events": {}}
		ends.Each(func(o kadm.ListedOffset) { from["inventory.events"][o.Partition] = kgo.NewOffset().At(o.Offset) })
		consumer := pipelinetest.Client(b, brokers, kgo.ConsumePartitions(from), kgo.FetchIsolationLevel(kgo.ReadCommitted()))
		values := map[pipeline.Message][]byte{}
		t0 := time.Now()
		promise := kgo.AbortingFirstErrPromise(cl)
		for i := range n {
			agg, payload := cmd(i)
			value, ok := values[payload]
			if !ok {
				if value, err = encode(ctx, payload); err != nil {
					b.Fatal(err)
				}
				values[payload] = value
			}
			rec, err := kafka.CommandRecord(topic, agg, pipeline.NewCommandID(), payload.MessageType(), value, time.Time{}, "")
			if err != nil {
				b.Fatal(err)
			}
			cl.Produce(ctx, rec, promise.Promise())
		}
		if err := promise.Err(); err != nil {
			b.Fatal(err)
		}
		wctx, wcancel := context.WithTimeout(ctx, 5*time.Minute)
		defer wcancel()
		for seen := 0; seen < n; {
			fs := consumer.PollFetches(wctx)
			if err := wctx.Err(); err != nil {
				b.Fatalf("%s: %d of %d outcomes after %s", name, seen, n, time.Since(t0))
			}
			fs.EachRecord(func(r *kgo.Record) {
				for _, h := range r.Headers {
					if h.Key == pipeline.HeaderEventType && outcome[string(h.Value)] {
						seen++
					}
				}
			})
		}
		return float64(n) / time.Since(t0).Seconds()
	}
	addStock := func(q int64) func(i int) (string, pipeline.Message) {
		return func(i int) (string, pipeline.Message) {
			return pipeline.AggregateID("acme", item(i)), inventory.AddStock{Quantity: q}
		}
	}
	stockAdded := map[string]bool{"StockAdded": true}
	// Stock enough for every order of every run.
	run("stock", "inventory.item.commands", itemSerdes.Commands.Encode, func(i int) (string, pipeline.Message) {
		return pipeline.AggregateID("acme", item(i)), inventory.AddStock{Quantity: inventory.MaxQuantity}
	}, stockAdded)

	for range b.N {
		var saga, single []float64
		for r, isSaga := range []bool{true, false, false, true, true, false, false, true} {
			if isSaga {
				saga = append(saga, run("saga", "inventory.order.commands", orderSerdes.Commands.Encode, func(i int) (string, pipeline.Message) {
					return pipeline.AggregateID("acme", fmt.Sprintf("r%d-o%d", r, i)), inventory.PlaceOrder{ItemID: item(i), Quantity: 1}
				}, map[string]bool{"OrderConfirmed": true, "OrderRejected": true}))
			} else {
				single = append(single, run("single", "inventory.item.commands", itemSerdes.Commands.Encode, addStock(1), stockAdded))
			}
		}
		s, a := median(saga), median(single)
		b.ReportMetric(s, "saga_orders/s")
		b.ReportMetric(a, "single_cmds/s")
		b.ReportMetric(s/a, "saga/single")
		b.ReportMetric(3*s/a, "saga_decisions/single")
		b.Logf("%d commands per run to %d items, 8 partitions: saga %.0f orders/s (%.0f decisions/s), single aggregate %.0f commands/s", n, items, s, 3*s, a)
	}
}

func median(xs []float64) float64 {
	s := append([]float64(nil), xs...)
	sort.Float64s(s)
	if len(s)%2 == 0 {
		return (s[len(s)/2-1] + s[len(s)/2]) / 2
	}
	return s[len(s)/2]
}
