package statuspage

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/onceflow/onceflow"
	"github.com/onceflow/onceflow/pipeline"
	"github.com/onceflow/onceflow/pipeline/admin"
	"github.com/onceflow/onceflow/pipeline/admin/status"
	"github.com/onceflow/onceflow/pipeline/apiclient"
	"github.com/onceflow/onceflow/pipeline/kafka"
	"github.com/onceflow/onceflow/pipeline/pipelinetest"
)

// BenchmarkStatus measures what the status page costs a process, next to
// the baseline it is built on, a scrape of /metrics, in the same run, on
// the embedded default (8 partitions, every component, cluster lag) after
// a workload of 2,000 commands and a poison in the DLQ:
//
//   - metrics: GET /metrics, the baseline;
//   - status.json: GET /status.json, the page's poll (its DLQ reading
//     reused for 10 s, as in a process);
//   - build, DLQ read each time: the answer built with the DLQ topic read
//     on at every build (a fetch per partition that finds nothing new);
//   - gather: the registry gathered, nothing encoded, the floor of both;
//   - sample: one tick of the sampler (gather the registry, keep the
//     tracked series in the ring of 91 samples), paid every
//     StatusInterval whether or not anyone looks; cpu-%-at-10s is its
//     share of one core at the default interval.
//
// The lag collector measures at most every 5 s and the relay counts the
// outbox at most every 10 s whoever asks, so in a loop the figures are
// those of the gathering and encoding; both endpoints share those costs.
func BenchmarkStatus(b *testing.B) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	reg := admin.NewRegistry()
	s := startDev(b, 8, reg, 10*time.Second)
	for i := range 8 {
		a, _, err := s.api.OpenAccount(ctx, fmt.Sprintf("open-%d", i), fmt.Sprintf("acc-%d", i), "EUR")
		if err != nil {
			b.Fatal(err)
		}
		if _, err := s.api.WaitCommand(ctx, a.CommandID); err != nil {
			b.Fatal(err)
		}
	}
	var last apiclient.Accepted
	for i := range 2000 {
		var err error
		if last, _, err = s.api.Deposit(ctx, fmt.Sprintf("dep-%d", i), fmt.Sprintf("acc-%d", i%8), 1); err != nil {
			b.Fatal(err)
		}
	}
	if _, err := s.api.WaitCommand(ctx, last.CommandID); err != nil {
		b.Fatal(err)
	}
	cl := pipelinetest.Client(b, []string{s.addrs.Kafka})
	poison, err := kafka.CommandRecord("ledger.commands", onceflow.DemoTenant+"/acc-0", pipeline.NewCommandID(), "Deposit", []byte("not avro"), time.Time{}, "")
	if err != nil {
		b.Fatal(err)
	}
	if err := cl.ProduceSync(ctx, poison).FirstErr(); err != nil {
		b.Fatal(err)
	}
	pipelinetest.Eventually(b, time.Minute, func() error {
		if v, _ := s.metrics(b).value("onceflow_dlq_records_total"); v != 1 {
			return fmt.Errorf("%v DLQ records", v)
		}
		return nil
	})

	get := func(b *testing.B, path string) {
		var n int64
		for b.Loop() {
			resp, err := http.Get("http://" + s.addrs.Admin + path)
			if err != nil {
				b.Fatal(err)
			}
			n, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				b.Fatalf("GET %s: %d", path, resp.StatusCode)
			}
		}
		b.ReportMetric(float64(n), "bytes/answer")
	}
	b.Run("metrics", func(b *testing.B) { get(b, "/metrics") })
	b.Run("status.json", func(b *testing.B) { get(b, "/status.json") })

	page, err := status.New(status.Config{
		Gatherer: reg, Pool: s.pool, Kafka: cl, DLQInterval: time.Nanosecond,
		DLQs:          []status.DLQTopicConfig{{Topic: dlqTopic, Commands: "ledger.commands"}},
		CommandTopics: []string{"ledger.commands"}, EventTopics: []string{events},
	})
	if err != nil {
		b.Fatal(err)
	}
	for range 91 { // a full ring: 15 minutes at 10 s
		page.Sample()
	}
	b.Run("build, DLQ read each time", func(b *testing.B) {
		for b.Loop() {
			page.Build(ctx)
		}
	})
	b.Run("sample", func(b *testing.B) {
		for b.Loop() {
			page.Sample()
		}
		b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(10*time.Second)*100, "cpu-%-at-10s")
		samples, series := page.Kept()
		b.ReportMetric(float64(series), "series")
		b.ReportMetric(float64(samples*series*8), "ring-bytes")
	})
	b.Run("gather", func(b *testing.B) {
		for b.Loop() {
			if _, err := reg.Gather(); err != nil {
				b.Fatal(err)
			}
		}
	})
}
