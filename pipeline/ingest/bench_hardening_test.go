package ingest_test

import (
	"context"
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/onceflow/onceflow/pipeline/ingest"
)

// perRequest sends n requests from c clients at once and returns the mean
// time per request (wall time over n: throughput, not one request's
// latency); an unexpected status fails the benchmark.
func perRequest(b *testing.B, s *server, n, c int, want int, q func(i int) req) time.Duration {
	b.Helper()
	var wg sync.WaitGroup
	next := make(chan int)
	start := time.Now()
	for range c {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				r, err := s.try(context.Background(), q(i))
				if err != nil || r.Status != want {
					b.Errorf("request %d: %v %v, want %d", i, r, err, want)
				}
			}
		}()
	}
	for i := range n {
		next <- i
	}
	close(next)
	wg.Wait()
	return time.Since(start) / time.Duration(n)
}

// BenchmarkAuthentication: what a request with a key costs before it
// reaches its route, over HTTP from 8 clients: an unknown key refused
// from the negative cache (negative_cache), the baseline of an unknown key
// looked up in the database every time (lookup: a new made-up key per
// request, which the negative cache cannot know), and a valid key from
// the key cache on a read that checks it again in its own transaction
// (valid_cached; a GET of a command that is not there, so the figure is
// the authentication and one scoped read). Failure limits are off, so
// every request is answered 401 by the path measured. Medians over the
// rounds.
func BenchmarkAuthentication(b *testing.B) {
	n := benchSize("ONCEFLOW_BENCH_REQUESTS", 20000) / 4
	var cached, lookup, valid []float64
	for range b.N * rounds() {
		pool := benchPool(b, benchPoolSize)
		s := startServer(b, pool, ingest.Config{AuthFailureRate: -1, MaxKeyLookups: benchPoolSize})
		bad, good := ingest.NewAPIKey(), tenant(b, pool, "good")
		get := func(key string) req {
			return req{method: http.MethodGet, path: "/v1/commands/0190b7a2-0000-7000-8000-000000000000", apiKey: key}
		}
		perRequest(b, s, n/4, 8, http.StatusNotFound, func(int) req { return get(good) }) // warm up; caches the bad key too
		s.do(b, get(bad))
		us := func(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }
		cached = append(cached, us(perRequest(b, s, n, 8, http.StatusUnauthorized, func(int) req { return get(bad) })))
		lookup = append(lookup, us(perRequest(b, s, n, 8, http.StatusUnauthorized, func(int) req { return get(ingest.NewAPIKey()) })))
		valid = append(valid, us(perRequest(b, s, n, 8, http.StatusNotFound, func(int) req { return get(good) })))
		s.stop()
		pool.Close()
	}
	b.ReportMetric(median(cached), "negative_cache_us/req")
	b.ReportMetric(median(lookup), "lookup_us/req")
	b.ReportMetric(median(valid), "valid_cached_us/req")
	b.ReportMetric(median(lookup)/median(cached), "lookup/negative_cache")
	b.ReportMetric(0, "ns/op")
}

// BenchmarkScopedRead: GET /v1/accounts/{id} and GET /v1/commands/{id}
// (found) as ingest serves them, in a read-only transaction scoped to the
// caller's tenant, on the runtime role, with the tables' row-level
// security on (rls) and, as the baseline in the same database, turned off
// (norls): what the policies cost a read. 8 clients; medians over rounds.
func BenchmarkScopedRead(b *testing.B) {
	n := benchSize("ONCEFLOW_BENCH_REQUESTS", 20000) / 4
	var accOn, accOff, cmdOn, cmdOff []float64
	for range b.N * rounds() {
		owner, rt := leastPrivilege(b)
		s := startServer(b, rt, ingest.Config{})
		key := tenant(b, owner, "acme")
		id := acceptedID(b, s.do(b, req{path: "/v1/accounts", apiKey: key, idemKey: "o", body: `{"account_id":"a","currency":"EUR"}`}))
		for i := range 1000 { // other tenants' rows, as in a shared database
			if _, err := owner.Exec(context.Background(), `INSERT INTO accounts (tenant, account_id, currency, version, updated_at) VALUES ($1, 'a', 'EUR', 1, now())`, fmt.Sprint("t", i)); err != nil {
				b.Fatal(err)
			}
		}
		if _, err := owner.Exec(context.Background(), `INSERT INTO accounts (tenant, account_id, currency, version, updated_at) VALUES ('acme', 'a', 'EUR', 1, now())`); err != nil {
			b.Fatal(err)
		}
		us := func(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }
		account := func(int) req { return req{method: http.MethodGet, path: "/v1/accounts/a", apiKey: key} }
		command := func(int) req { return req{method: http.MethodGet, path: "/v1/commands/" + id, apiKey: key} }
		noRLS := func() {
			for _, t := range []string{"accounts", "command_status", "api_keys"} {
				if _, err := owner.Exec(context.Background(), `ALTER TABLE `+t+` DISABLE ROW LEVEL SECURITY`); err != nil {
					b.Fatal(err)
				}
			}
		}
		perRequest(b, s, n/4, 8, http.StatusOK, account) // warm up the connections and plans
		accOn = append(accOn, us(perRequest(b, s, n, 8, http.StatusOK, account)))
		cmdOn = append(cmdOn, us(perRequest(b, s, n, 8, http.StatusOK, command)))
		noRLS()
		accOff = append(accOff, us(perRequest(b, s, n, 8, http.StatusOK, account)))
		cmdOff = append(cmdOff, us(perRequest(b, s, n, 8, http.StatusOK, command)))
		s.stop()
	}
	b.ReportMetric(median(accOn), "account_rls_us/req")
	b.ReportMetric(median(accOff), "account_norls_us/req")
	b.ReportMetric(median(cmdOn), "command_rls_us/req")
	b.ReportMetric(median(cmdOff), "command_norls_us/req")
	b.ReportMetric(median(accOn)/median(accOff), "account_rls/norls")
	b.ReportMetric(median(cmdOn)/median(cmdOff), "command_rls/norls")
	b.ReportMetric(0, "ns/op")
}
