package ingest_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/onceflow/onceflow/pipeline/ingest"
)

// BenchmarkInbound measures webhook deliveries per second through POST
// /v1/inbound/{provider} (signature verified, event stored once, its
// Deposit enqueued in the same transaction: one transaction per delivery)
// at 64 concurrent senders, next to references from the same round:
// plain Deposit POSTs with new Idempotency-Keys against the same server
// (group commit), and deliveries refused for a bad signature (HTTP and
// verification without the database). ratio is inbound over command
// POSTs; each figure is the median over the rounds
// (ONCEFLOW_BENCH_ROUNDS). ONCEFLOW_BENCH_INBOUND_REQUESTS sizes a
// measurement (default 10000).
func BenchmarkInbound(b *testing.B) {
	n := benchSize("ONCEFLOW_BENCH_INBOUND_REQUESTS", 10000)
	var inbound, commands, refused, ratio []float64
	for range b.N * rounds() {
		cr, _ := ingestRate(b, n, ingest.Config{Providers: providers(b)})
		ir := inboundRate(b, n, false)
		rr := inboundRate(b, n, true)
		inbound, commands, refused = append(inbound, ir), append(commands, cr), append(refused, rr)
		ratio = append(ratio, ir/cr)
	}
	b.ReportMetric(median(inbound), "inbound_events/s")
	b.ReportMetric(median(commands), "command_posts/s")
	b.ReportMetric(median(refused), "bad_signature_req/s")
	b.ReportMetric(median(ratio), "ratio")
	b.ReportMetric(0, "ns/op")
}

// inboundRate sends n deliveries of distinct payment.succeeded events (to
// 500 accounts), signed beforehand, from benchClients senders, and returns
// the rate answered; badSig signs them with another secret.
func inboundRate(b *testing.B, n int, badSig bool) float64 {
	pool := benchPool(b, benchPoolSize)
	s := startServer(b, pool, ingest.Config{Providers: providers(b), RateLimit: -1})
	secret := paymentsSecret
	if badSig {
		secret = rotatedSecret[:len(rotatedSecret)-4] + "AAA="
	}
	run := time.Now().UnixNano()
	type signed struct {
		body   string
		header map[string]string
	}
	all := make([]signed, n)
	for i := range all {
		id := fmt.Sprintf("evt-%d-%d", run, i)
		body, _ := json.Marshal(map[string]any{"type": "payment.succeeded", "data": map[string]any{"account_id": fmt.Sprintf("acc-%d", i%500), "amount": 1}})
		h, err := ingest.SignStandardWebhooks(secret, id, time.Now(), body)
		if err != nil {
			b.Fatal(err)
		}
		all[i] = signed{body: string(body), header: map[string]string{
			"webhook-id": h.Get("webhook-id"), "webhook-timestamp": h.Get("webhook-timestamp"), "webhook-signature": h.Get("webhook-signature")}}
	}
	want := http.StatusOK
	if badSig {
		want = http.StatusUnauthorized
	}
	var next atomic.Int64
	start := time.Now()
	var wg sync.WaitGroup
	for range benchClients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := next.Add(1); i <= int64(n); i = next.Add(1) {
				d := all[i-1]
				r, err := s.try(context.Background(), req{path: "/v1/inbound/payments", body: d.body, header: d.header})
				if err != nil || r.Status != want {
					b.Errorf("delivery: %v %s", err, r)
					return
				}
			}
		}()
	}
	wg.Wait()
	rate := float64(n) / time.Since(start).Seconds()
	wantRows := n
	if badSig {
		wantRows = 0
	}
	if got := countRows(b, pool).outbox; got != wantRows {
		b.Fatalf("outbox holds %d commands, want %d", got, wantRows)
	}
	s.stop()
	pool.Close()
	return rate
}
