package ingest_test

import (
	"context"
	"crypto/sha256"
	"fmt"
	"net/http"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/onceflow/onceflow/pipeline/ingest"
)

// BenchmarkRequestCPU prices ingest's line of the bill
// (docs/benchmarks.md#ingest-group-commit-latency-at-1000-requestss-a-tenants-flood)
// without the rest of the pipeline: the CPU of a command's two requests, POST
// a deposit with a new key (64 clients: the accept transactions group them)
// and GET its outcome (8 clients, the command found, no wait). Per request,
// this process's CPU (ingest and the HTTP clients, whose share does not
// depend on what ingest does) and that of the Postgres backends serving the
// benchmark's database (from /proc: the cluster runs on this machine), each
// the median over the rounds. Compare figures of one run, or of runs
// alternated on the same load: CPU time depends less on the neighbours than
// throughput does, but not on nothing.
func BenchmarkRequestCPU(b *testing.B) {
	n := benchSize("ONCEFLOW_BENCH_REQUESTS", 20000) / 2
	var postGo, postPG, getGo, getPG []float64
	for range b.N * rounds() {
		pool := benchPool(b, benchPoolSize)
		s := startServer(b, pool, ingest.Config{RateLimit: -1})
		key := tenant(b, pool, "bench")
		run := time.Now().UnixNano()
		post := func(i int) req {
			return req{path: fmt.Sprintf("/v1/accounts/acc-%d/deposits", i%500), apiKey: key,
				idemKey: fmt.Sprintf("c-%d-%d", run, i), body: `{"amount":1}`}
		}
		ids := make([]string, 500)
		for i := range ids { // warm up the connections and plans; ids to read
			ids[i] = acceptedID(b, s.do(b, post(-1-i)))
		}
		get := func(i int) req {
			return req{method: http.MethodGet, path: "/v1/commands/" + ids[i%len(ids)], apiKey: key}
		}
		perRequest(b, s, len(ids), 8, http.StatusOK, get)
		g, p := cpuPerRequest(b, pool, n, func() { perRequest(b, s, n, benchClients, http.StatusAccepted, post) })
		postGo, postPG = append(postGo, g), append(postPG, p)
		g, p = cpuPerRequest(b, pool, n, func() { perRequest(b, s, n, 8, http.StatusOK, get) })
		getGo, getPG = append(getGo, g), append(getPG, p)
		s.stop()
		pool.Close()
	}
	b.ReportMetric(median(postGo), "post_go_us/req")
	b.ReportMetric(median(postPG), "post_postgres_us/req")
	b.ReportMetric(median(getGo), "get_go_us/req")
	b.ReportMetric(median(getPG), "get_postgres_us/req")
	b.ReportMetric(0, "ns/op")
}

// cpuPerRequest runs requests (n of them) and returns the µs of CPU per
// request of this process and of the backends connected to pool's
// database.
func cpuPerRequest(b *testing.B, pool *pgxpool.Pool, n int, requests func()) (goUS, pgUS float64) {
	b.Helper()
	before, pgBefore := processCPU(), backendsCPU(b, pool)
	requests()
	used, pgAfter := processCPU()-before, backendsCPU(b, pool)
	var pg time.Duration
	for pid, t := range pgAfter {
		pg += t - pgBefore[pid] // a backend that started meanwhile had used nothing before
	}
	per := func(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) / float64(n) }
	return per(used), per(pg)
}

// processCPU is this process's user and system CPU time so far.
func processCPU() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// backendsCPU is the CPU time so far of each backend connected to pool's
// database, by pid.
func backendsCPU(b *testing.B, pool *pgxpool.Pool) map[int]time.Duration {
	b.Helper()
	rows, err := pool.Query(context.Background(), `SELECT pid FROM pg_stat_activity WHERE datname = current_database()`)
	if err != nil {
		b.Fatal(err)
	}
	defer rows.Close()
	cpu := map[int]time.Duration{}
	for rows.Next() {
		var pid int
		if err := rows.Scan(&pid); err != nil {
			b.Fatal(err)
		}
		cpu[pid] = procCPU(b, pid)
	}
	if err := rows.Err(); err != nil {
		b.Fatal(err)
	}
	return cpu
}

// BenchmarkOutcomeRead prices the statements of one outcome read
// (loadCommand: the key's check and scope, then the read, of a command
// that led to no other) on one connection, without HTTP: as ingest sends
// them, two statements in one
// pipeline, which Postgres runs as one implicit transaction (implicit),
// and the baseline of the same two between BEGIN READ ONLY and COMMIT
// (explicit, what ingest sent before). The two alternate in blocks of 2,000 reads
// (explicit, implicit, implicit, explicit, ...); per read, this process's
// CPU and that of the connection's backend (/proc), medians over the blocks.
func BenchmarkOutcomeRead(b *testing.B) {
	ctx := context.Background()
	pool := benchPool(b, 1)
	s := startServer(b, pool, ingest.Config{})
	key := tenant(b, pool, "bench")
	id := acceptedID(b, s.do(b, req{path: "/v1/accounts/acc/deposits", apiKey: key, idemKey: "1", body: `{"amount":1}`}))
	s.stop()
	sum := sha256.Sum256([]byte(key))
	conn, err := pool.Acquire(ctx)
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Release()
	pid := conn.Conn().PgConn().PID()
	read := func(explicit bool) {
		batch := &pgx.Batch{}
		if explicit {
			batch.Queue("BEGIN READ ONLY")
		}
		var tenant, status string
		batch.Queue(ingest.ScopeSQL, sum[:]).QueryRow(func(row pgx.Row) error { return row.Scan(&tenant) })
		batch.Queue(ingest.GetCommandSQL, id, "bench", nil).QueryRow(func(row pgx.Row) error {
			var aggregate, commandType string
			var reason, detail *string
			var events []string
			var led bool
			return row.Scan(&aggregate, &status, &commandType, &reason, &detail, &events, &led)
		})
		if explicit {
			batch.Queue("COMMIT")
		}
		if err := conn.SendBatch(ctx, batch).Close(); err != nil || tenant != "bench" || status != "pending" {
			b.Fatalf("read: %v, tenant %q, status %q", err, tenant, status)
		}
	}
	for range 500 { // plans and caches
		read(true)
		read(false)
	}
	const block = 2000
	figures := map[bool][2][]float64{}
	for i := range 4 * b.N * rounds() {
		explicit := i%4 == 0 || i%4 == 3
		goBefore, pgBefore := processCPU(), procCPU(b, int(pid))
		for range block {
			read(explicit)
		}
		f := figures[explicit]
		f[0] = append(f[0], float64((processCPU()-goBefore).Microseconds())/block)
		f[1] = append(f[1], float64((procCPU(b, int(pid))-pgBefore).Microseconds())/block)
		figures[explicit] = f
	}
	b.ReportMetric(median(figures[false][0]), "implicit_go_us/read")
	b.ReportMetric(median(figures[false][1]), "implicit_postgres_us/read")
	b.ReportMetric(median(figures[true][0]), "explicit_go_us/read")
	b.ReportMetric(median(figures[true][1]), "explicit_postgres_us/read")
	b.ReportMetric(0, "ns/op")
}

// procCPU is the CPU time so far of the process pid of this machine (a
// Postgres backend), from /proc/PID/stat, in clock ticks of 10 ms.
func procCPU(b *testing.B, pid int) time.Duration {
	b.Helper()
	stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		b.Fatalf("the benchmark reads the backends' CPU from /proc: run it on the database's machine (%v)", err)
	}
	s := string(stat)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:]) // the name may hold spaces
	utime, _ := strconv.Atoi(f[11])
	stime, _ := strconv.Atoi(f[12])
	return time.Duration(utime+stime) * 10 * time.Millisecond
}
