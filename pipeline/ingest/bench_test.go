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

// Benchmark sizes, each scalable by an environment variable:
// ONCEFLOW_BENCH_REQUESTS, the requests of one throughput measurement
// (default 20000); ONCEFLOW_BENCH_LATENCY_REQUESTS, those of one fixed-rate
// measurement (default 3000, 3 s at 1,000 requests/s); and
// ONCEFLOW_BENCH_ROUNDS, how many rounds each benchmark runs (default 3).
// A round measures every figure once, the figures of one round close in
// time, and the report is the median over rounds: the machine is shared,
// and interleaving keeps a burst of someone else's load from landing on
// one side of a comparison only.
func benchSize(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}

func rounds() int { return benchSize("ONCEFLOW_BENCH_ROUNDS", 3) }

// median returns the median of xs.
func median(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s) == 0 {
		return 0
	}
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

const (
	benchClients  = 64 // concurrent clients, as the issue names
	benchPoolSize = 16 // ingest's connections in the benchmark
)

// benchClient is the HTTP client of the fixed-rate benchmarks: at most 64
// connections, like the baseline's 64 Postgres connections, so a stall
// makes requests wait for a connection (and counts against the latency)
// rather than open hundreds of new ones.
func benchClient() *http.Client {
	return &http.Client{Timeout: time.Minute, Transport: &http.Transport{MaxIdleConnsPerHost: benchClients, MaxConnsPerHost: benchClients}}
}

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
// request, eight at a time, on a quarter of the requests: it is slow), and
// the same HTTP clients against a server that does no
// database work at all (http_only: the ceiling of any ingest on this
// machine). ratio is grouped ingest over the 64-client baseline of the
// same round, ratio_vs_serial over the serial one; each figure is the
// median over the rounds.
func BenchmarkIngestThroughput(b *testing.B) {
	n := benchSize("ONCEFLOW_BENCH_REQUESTS", 20000)
	var ceiling, serial, baseline, single, grouped, batch, ratio, ratioSerial []float64
	for range b.N * rounds() {
		c := httpCeiling(b, n)
		sr := insertBaseline(b, n/10, 1)
		br := insertBaseline(b, n, benchClients)
		ur, _ := ingestRate(b, n/4, ingest.Config{MaxBatch: 1, Committers: benchPoolSize / 2})
		gr, size := ingestRate(b, n, ingest.Config{})
		ceiling, serial, baseline = append(ceiling, c), append(serial, sr), append(baseline, br)
		single, grouped, batch = append(single, ur), append(grouped, gr), append(batch, size)
		ratio, ratioSerial = append(ratio, gr/br), append(ratioSerial, gr/sr)
	}
	b.ReportMetric(median(ceiling), "http_only_req/s")
	b.ReportMetric(median(serial), "serial_tx/s")
	b.ReportMetric(median(baseline), "baseline_tx/s")
	b.ReportMetric(median(single), "ungrouped_cmds/s")
	b.ReportMetric(median(grouped), "grouped_cmds/s")
	b.ReportMetric(median(batch), "mean_batch")
	b.ReportMetric(median(ratio), "ratio")
	b.ReportMetric(median(ratioSerial), "ratio_vs_serial")
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
	rate := float64(n) / time.Since(start).Seconds()
	pool.Close() // its connections are many; the server is shared
	return rate
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
	s.stop()
	pool.Close()
	return rate, float64(n) / batches
}

// BenchmarkIngestLatency sends deposits at a fixed 1,000 requests per
// second (open loop: each request leaves at its scheduled time whatever
// the others do) and reports the p50 and p99 latency, measured from the
// scheduled time so a stall counts against every request it delays. The
// baseline is the same schedule of one-insert transactions straight to
// Postgres. Each side first runs one second of the same schedule
// unmeasured: a fresh server's first hundred milliseconds or so are slow
// (connections to open, the accept statement to plan on each
// connection), and a long-running ingest has them behind it; measured,
// they were the whole p99. That second's p99 is reported apart
// (cold_p99_ms). Each figure is the median over the rounds of that
// round's percentile.
func BenchmarkIngestLatency(b *testing.B) {
	n := benchSize("ONCEFLOW_BENCH_LATENCY_REQUESTS", 3000)
	const rate = 1000
	ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
	var p50, p99, cold99, base50, base99 []float64
	for range b.N * rounds() {
		pool := benchPool(b, benchPoolSize)
		s := startServer(b, pool, ingest.Config{RateLimit: -1})
		s.client = benchClient()
		key := tenant(b, pool, "bench")
		run := time.Now().UnixNano()
		deposit := func(i int) error {
			r, err := s.try(context.Background(), req{path: fmt.Sprintf("/v1/accounts/acc-%d/deposits", i%500),
				apiKey: key, idemKey: fmt.Sprintf("l-%d-%d", run, i), body: `{"amount":1}`})
			if err == nil && r.Status != http.StatusAccepted {
				err = fmt.Errorf("deposit: %s", r)
			}
			return err
		}
		cold := fixedRate(b, rate, rate, func(i int) error { return deposit(n + i) }) // warm-up
		lat := fixedRate(b, n, rate, deposit)
		basePool := benchPool(b, benchClients)
		value := make([]byte, 24)
		insert := func(int) error {
			_, err := basePool.Exec(context.Background(), `INSERT INTO outbox (shard, topic, key, value, headers) VALUES ($1, $2, $3, $4, $5)`,
				3, commandsTopic, []byte("bench/acc-1"), value, `{"command-id":"x"}`)
			return err
		}
		fixedRate(b, rate, rate, insert) // warm-up
		base := fixedRate(b, n, rate, insert)
		s.stop()
		pool.Close()
		basePool.Close()
		p50, p99 = append(p50, ms(percentile(lat, 50))), append(p99, ms(percentile(lat, 99)))
		cold99 = append(cold99, ms(percentile(cold, 99)))
		base50, base99 = append(base50, ms(percentile(base, 50))), append(base99, ms(percentile(base, 99)))
	}
	b.ReportMetric(median(p50), "p50_ms")
	b.ReportMetric(median(p99), "p99_ms")
	b.ReportMetric(median(cold99), "cold_p99_ms")
	b.ReportMetric(median(base50), "baseline_p50_ms")
	b.ReportMetric(median(base99), "baseline_p99_ms")
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
// calm tenant sends deposits at 100 requests/s (300 requests) three
// times per round: alone (the baseline); while a flooding tenant sends 1,500
// requests/s, far over the rate limit of 200/s (flooded); and the same
// flood against a server without rate limits (unlimited), which is what
// the limit protects from. Both loads are open loop (each request leaves
// at its time whatever the answers do; the flood has at most 128 in
// flight, like a client with that many connections, and skips its turn
// when all are busy), so the flood's own cost on these two cores is about
// the same in both flooded runs. It reports the calm
// tenant's p50 and p99 in each (medians over the rounds), the share of the
// limited flood answered 429, and the share of the calm tenant's requests
// that failed (503, timeouts) under the unlimited flood.
func BenchmarkTenantFlood(b *testing.B) {
	const calmRate, calmN, floodRate, floodClients, limit = 100, 300, 1500, 128, 200
	ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
	var q50, q99, l50, l99, u50, u99 []float64
	var refused, floodSent float64
	var calmFailed atomic.Int64
	for range b.N * rounds() {
		pool := benchPool(b, benchPoolSize)
		calm, flood := tenant(b, pool, "calm"), tenant(b, pool, "flood")
		run := time.Now().UnixNano()
		phase := func(srv *server, tag string, flooding bool) []time.Duration {
			// Two clients of their own, as two tenants' would be.
			s, fs := *srv, *srv
			s.client = benchClient()
			fs.client = &http.Client{Timeout: time.Minute, Transport: &http.Transport{MaxIdleConnsPerHost: floodClients, MaxConnsPerHost: floodClients}}
			stop := make(chan struct{})
			var wg sync.WaitGroup
			var sent, got429 atomic.Int64
			if flooding {
				wg.Add(1)
				go func() {
					defer wg.Done()
					interval := time.Second / floodRate
					start := time.Now()
					inFlight := make(chan struct{}, floodClients)
					for i := 0; ; i++ {
						select {
						case <-stop:
							return
						case <-time.After(time.Until(start.Add(time.Duration(i) * interval))):
						}
						select {
						case inFlight <- struct{}{}:
						default:
							continue // all its connections are busy: this one is not sent
						}
						wg.Add(1)
						go func() {
							defer wg.Done()
							defer func() { <-inFlight }()
							r, err := fs.try(context.Background(), req{path: "/v1/accounts/flood/deposits", apiKey: flood,
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
				if err != nil && tag == "unlimited" {
					// Without a limit the flood may take the calm tenant's
					// requests down with it: that is the point of the run.
					calmFailed.Add(1)
					return nil
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
		quiet := phase(withLimit, "quiet", false)
		limited := phase(withLimit, "limited", true)
		withoutLimit := startServer(b, pool, ingest.Config{RateLimit: -1})
		unlimited := phase(withoutLimit, "unlimited", true)
		withLimit.stop()
		withoutLimit.stop()
		pool.Close()
		q50, q99 = append(q50, ms(percentile(quiet, 50))), append(q99, ms(percentile(quiet, 99)))
		l50, l99 = append(l50, ms(percentile(limited, 50))), append(l99, ms(percentile(limited, 99)))
		u50, u99 = append(u50, ms(percentile(unlimited, 50))), append(u99, ms(percentile(unlimited, 99)))
	}
	b.ReportMetric(median(q50), "baseline_p50_ms")
	b.ReportMetric(median(q99), "baseline_p99_ms")
	b.ReportMetric(median(l50), "flooded_p50_ms")
	b.ReportMetric(median(l99), "flooded_p99_ms")
	b.ReportMetric(median(u50), "unlimited_p50_ms")
	b.ReportMetric(median(u99), "unlimited_p99_ms")
	b.ReportMetric(refused/floodSent, "flood_refused")
	b.ReportMetric(float64(calmFailed.Load())/float64(b.N*rounds()*calmN), "unlimited_calm_failed")
	b.ReportMetric(0, "ns/op")
}
