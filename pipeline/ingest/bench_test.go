package ingest_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/onceflow/onceflow/pipeline/ingest"
	"github.com/onceflow/onceflow/pipeline/pipelinetest"
	"github.com/onceflow/onceflow/pipeline/postgres"
)

// Benchmark sizes. ONCEFLOW_BENCH_REQUESTS scales the throughput runs
// (default 20000 requests per measurement); ONCEFLOW_BENCH_LATENCY_REQUESTS
// the fixed-rate run (default 5000, i.e. 5 s at 1,000 requests/s).
func benchSize(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}

const (
	benchClients  = 64 // concurrent clients, as the issue names
	benchPoolSize = 16 // ingest's connections in the benchmark
)

// benchPool is a database of its own, with a pool of size conns.
func benchPool(b *testing.B, conns int32) *pgxpool.Pool {
	b.Helper()
	url := pipelinetest.DatabaseURL(b)
	pool, err := postgres.Connect(context.Background(), url, conns)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(pool.Close)
	var sc string
	if err := pool.QueryRow(context.Background(), "SHOW synchronous_commit").Scan(&sc); err != nil || sc != "on" {
		b.Fatalf("synchronous_commit is %q (%v); the benchmark measures durable commits", sc, err)
	}
	return pool
}

// BenchmarkIngestThroughput measures accepted commands per second at 64
// concurrent HTTP clients (each sends deposits with new keys, one at a
// time), with synchronous_commit on, next to references from the same
// run: 64 clients each committing one outbox insert per transaction
// straight to Postgres (baseline: the one-insert-per-transaction cap that
// group commit must beat), one such client alone (serial: the disk's
// commit rate), ingest with grouping off (MaxBatch 1: one transaction per
// request), and the same HTTP clients against a server that does no
// database work at all (http_only: the ceiling of any ingest on this
// machine). ratio is grouped ingest over the 64-client baseline,
// ratio_vs_serial over the serial one.
func BenchmarkIngestThroughput(b *testing.B) {
	n := benchSize("ONCEFLOW_BENCH_REQUESTS", 20000)
	var ceiling, serial, baseline, single, grouped, batch float64
	for range b.N {
		ceiling += httpCeiling(b, n)
		serial += insertBaseline(b, n/10, 1)
		baseline += insertBaseline(b, n, benchClients)
		r, _ := ingestRate(b, n, ingest.Config{MaxBatch: 1})
		single += r
		r, size := ingestRate(b, n, ingest.Config{})
		grouped += r
		batch += size
	}
	runs := float64(b.N)
	b.ReportMetric(ceiling/runs, "http_only_req/s")
	b.ReportMetric(serial/runs, "serial_tx/s")
	b.ReportMetric(baseline/runs, "baseline_tx/s")
	b.ReportMetric(single/runs, "ungrouped_cmds/s")
	b.ReportMetric(grouped/runs, "grouped_cmds/s")
	b.ReportMetric(batch/runs, "mean_batch")
	b.ReportMetric(grouped/baseline, "ratio")
	b.ReportMetric(grouped/serial, "ratio_vs_serial")
	b.ReportMetric(0, "ns/op")
}

// httpCeiling returns the rate the same 64 HTTP clients get from a server
// that answers every POST with a fixed 202 without touching the database:
// what HTTP alone costs on this machine, the ceiling of any ingest.
func httpCeiling(b *testing.B, n int) float64 {
	body := []byte(`{"command_id":"01a22a95-9953-700c-9451-6b2b32eab461","status":"pending"}` + "\n")
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Location", "/v1/commands/01a22a95-9953-700c-9451-6b2b32eab461")
		w.WriteHeader(http.StatusAccepted)
		w.Write(body)
	}))
	defer srv.Close()
	s := &server{URL: srv.URL}
	var next atomic.Int64
	start := time.Now()
	var wg sync.WaitGroup
	for range benchClients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := next.Add(1); i <= int64(n); i = next.Add(1) {
				if _, err := s.try(context.Background(), req{path: "/v1/accounts/acc-1/deposits", apiKey: "k",
					idemKey: strconv.FormatInt(i, 10), body: `{"amount":1}`}); err != nil {
					b.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	return float64(n) / time.Since(start).Seconds()
}

// insertBaseline returns the rate of one-insert transactions that clients
// concurrent clients get on this machine, each with its own connection:
// each commit waits for its WAL flush (Postgres may share a flush between
// commits that arrive together; that is part of the cap). With one client
// it is the disk's serial commit rate.
func insertBaseline(b *testing.B, n, clients int) float64 {
	pool := benchPool(b, int32(clients))
	ctx := context.Background()
	value := make([]byte, 24)
	var next atomic.Int64
	start := time.Now()
	var wg sync.WaitGroup
	for range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for next.Add(1) <= int64(n) {
				if _, err := pool.Exec(ctx, `INSERT INTO outbox (shard, topic, key, value, headers) VALUES ($1, $2, $3, $4, $5)`,
					3, commandsTopic, []byte("bench/acc-1"), value, `{"command-id":"x"}`); err != nil {
					b.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	return float64(n) / time.Since(start).Seconds()
}

// ingestRate returns the accepted commands per second of an ingest server
// under benchClients clients sending n deposits in all, and the mean
// number of requests per accept transaction.
func ingestRate(b *testing.B, n int, cfg ingest.Config) (float64, float64) {
	pool := benchPool(b, benchPoolSize)
	cfg.RateLimit = -1
	s := startServer(b, pool, cfg)
	key := tenant(b, pool, "bench")
	run := time.Now().UnixNano()
	var next atomic.Int64
	start := time.Now()
	var wg sync.WaitGroup
	for range benchClients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := next.Add(1)
				if i > int64(n) {
					return
				}
				r, err := s.try(context.Background(), req{path: fmt.Sprintf("/v1/accounts/acc-%d/deposits", i%500),
					apiKey: key, idemKey: fmt.Sprintf("b-%d-%d", run, i), body: `{"amount":1}`})
				if err != nil || r.Status != http.StatusAccepted {
					b.Errorf("deposit: %v %s", err, r)
					return
				}
			}
		}()
	}
	wg.Wait()
	rate := float64(n) / time.Since(start).Seconds()
	if got := countRows(b, pool).outbox; got != n {
		b.Fatalf("outbox holds %d commands, want %d", got, n)
	}
	var batches float64
	mfs, _ := s.metrics.Gather()
	for _, mf := range mfs {
		if mf.GetName() == "onceflow_api_accept_batch_size" {
			batches = float64(mf.GetMetric()[0].GetHistogram().GetSampleCount())
		}
	}
	return rate, float64(n) / batches
}

// BenchmarkIngestLatency sends deposits at a fixed 1,000 requests per
// second (open loop: each request leaves at its scheduled time whatever
// the others do) and reports the p50 and p99 latency, measured from the
// scheduled time so a stall counts against every request it delays. The
// baseline is the same schedule of one-insert transactions straight to
// Postgres.
func BenchmarkIngestLatency(b *testing.B) {
	n := benchSize("ONCEFLOW_BENCH_LATENCY_REQUESTS", 5000)
	const rate = 1000
	var lat, base []time.Duration
	for range b.N {
		pool := benchPool(b, benchPoolSize)
		s := startServer(b, pool, ingest.Config{RateLimit: -1})
		key := tenant(b, pool, "bench")
		run := time.Now().UnixNano()
		lat = append(lat, fixedRate(b, n, rate, func(i int) error {
			r, err := s.try(context.Background(), req{path: fmt.Sprintf("/v1/accounts/acc-%d/deposits", i%500),
				apiKey: key, idemKey: fmt.Sprintf("l-%d-%d", run, i), body: `{"amount":1}`})
			if err == nil && r.Status != http.StatusAccepted {
				err = fmt.Errorf("deposit: %s", r)
			}
			return err
		})...)
		basePool := benchPool(b, benchClients)
		value := make([]byte, 24)
		base = append(base, fixedRate(b, n, rate, func(int) error {
			_, err := basePool.Exec(context.Background(), `INSERT INTO outbox (shard, topic, key, value, headers) VALUES ($1, $2, $3, $4, $5)`,
				3, commandsTopic, []byte("bench/acc-1"), value, `{"command-id":"x"}`)
			return err
		})...)
	}
	ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
	b.ReportMetric(ms(percentile(lat, 50)), "p50_ms")
	b.ReportMetric(ms(percentile(lat, 99)), "p99_ms")
	b.ReportMetric(ms(percentile(base, 50)), "baseline_p50_ms")
	b.ReportMetric(ms(percentile(base, 99)), "baseline_p99_ms")
	b.ReportMetric(0, "ns/op")
}

// fixedRate calls send n times at perSecond, each in its own goroutine at
// its scheduled time, and returns each call's latency from that time.
func fixedRate(b *testing.B, n, perSecond int, send func(i int) error) []time.Duration {
	lat := make([]time.Duration, n)
	interval := time.Second / time.Duration(perSecond)
	start := time.Now()
	var wg sync.WaitGroup
	for i := range n {
		at := start.Add(time.Duration(i) * interval)
		time.Sleep(time.Until(at))
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := send(i); err != nil {
				b.Error(err)
			}
			lat[i] = time.Since(at)
		}()
	}
	wg.Wait()
	return lat
}

func percentile(ds []time.Duration, p float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[min(len(s)-1, int(float64(len(s))*p/100))]
}

// BenchmarkTenantFlood measures what one tenant's flood costs another. A
// calm tenant sends deposits at 100 requests/s (500 requests) three
// times: alone (the baseline); while a flooding tenant sends 1,500
// requests/s, far over the rate limit of 200/s (flooded); and the same
// flood against a server without rate limits (unlimited), which is what
// the limit protects from. Both loads are open loop (each request leaves
// at its time whatever the answers do), so the flood's own cost on these
// two cores is the same in both flooded runs. It reports the calm
// tenant's p50 and p99 in each, and the share of the limited flood
// answered 429.
func BenchmarkTenantFlood(b *testing.B) {
	const calmRate, calmN, floodRate, limit = 100, 500, 1500, 200
	ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
	var quiet, limited, unlimited []time.Duration
	var refused, floodSent float64
	for range b.N {
		pool := benchPool(b, benchPoolSize)
		calm, flood := tenant(b, pool, "calm"), tenant(b, pool, "flood")
		run := time.Now().UnixNano()
		phase := func(s *server, tag string, flooding bool) []time.Duration {
			stop := make(chan struct{})
			var wg sync.WaitGroup
			var sent, got429 atomic.Int64
			if flooding {
				wg.Add(1)
				go func() {
					defer wg.Done()
					interval := time.Second / floodRate
					start := time.Now()
					for i := 0; ; i++ {
						select {
						case <-stop:
							return
						case <-time.After(time.Until(start.Add(time.Duration(i) * interval))):
						}
						wg.Add(1)
						go func() {
							defer wg.Done()
							r, err := s.try(context.Background(), req{path: "/v1/accounts/flood/deposits", apiKey: flood,
								idemKey: fmt.Sprintf("f-%s-%d-%d", tag, run, i), body: `{"amount":1}`})
							if err != nil {
								return // the server is saturated; the calm tenant's figures tell
							}
							sent.Add(1)
							if r.Status == http.StatusTooManyRequests {
								got429.Add(1)
							}
						}()
					}
				}()
			}
			lat := fixedRate(b, calmN, calmRate, func(i int) error {
				r, err := s.try(context.Background(), req{path: "/v1/accounts/calm/deposits", apiKey: calm,
					idemKey: fmt.Sprintf("%s-%d-%d", tag, run, i), body: `{"amount":1}`})
				if err == nil && r.Status != http.StatusAccepted {
					err = fmt.Errorf("calm tenant: %s", r)
				}
				return err
			})
			close(stop)
			wg.Wait()
			if tag == "limited" {
				refused += float64(got429.Load())
				floodSent += float64(sent.Load())
			}
			return lat
		}
		withLimit := startServer(b, pool, ingest.Config{RateLimit: limit, RateBurst: limit})
		quiet = append(quiet, phase(withLimit, "quiet", false)...)
		limited = append(limited, phase(withLimit, "limited", true)...)
		unlimited = append(unlimited, phase(startServer(b, pool, ingest.Config{RateLimit: -1}), "unlimited", true)...)
	}
	b.ReportMetric(ms(percentile(quiet, 50)), "baseline_p50_ms")
	b.ReportMetric(ms(percentile(quiet, 99)), "baseline_p99_ms")
	b.ReportMetric(ms(percentile(limited, 50)), "flooded_p50_ms")
	b.ReportMetric(ms(percentile(limited, 99)), "flooded_p99_ms")
	b.ReportMetric(ms(percentile(unlimited, 50)), "unlimited_p50_ms")
	b.ReportMetric(ms(percentile(unlimited, 99)), "unlimited_p99_ms")
	b.ReportMetric(refused/floodSent, "flood_refused")
	b.ReportMetric(0, "ns/op")
}
