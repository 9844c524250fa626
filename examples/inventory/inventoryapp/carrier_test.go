package inventoryapp_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/onceflow/onceflow"
	"github.com/onceflow/onceflow/examples/inventory"
	"github.com/onceflow/onceflow/examples/inventory/inventoryapp"
	"github.com/onceflow/onceflow/pipeline/jobs"
	"github.com/onceflow/onceflow/pipeline/kafka"
	"github.com/onceflow/onceflow/pipeline/pipelinetest"
	"github.com/onceflow/onceflow/pipeline/postgres"
	"github.com/onceflow/onceflow/pipeline/webhooks"
	"github.com/onceflow/onceflow/test/e2e"
)

// carrier is a test carrier on loopback: POST /bookings applies each
// Idempotency-Key once (a booking id per key) and answers as its plan
// says for the nth request of a key.
type carrier struct {
	*httptest.Server
	mu       sync.Mutex
	requests map[string][]time.Time // by key
	booked   map[string]string      // the effect: a booking per key
	// plan answers the nth request (from 1) of key: a status other than
	// 0 refuses it with retryAfter, before the effect; hold, after the
	// effect, waits for release before answering.
	plan    func(key string, n int) (status int, retryAfter string, hold bool)
	release chan struct{}
	arrived chan string // each request's key, after its effect
}

func newCarrier(t *testing.T) *carrier {
	c := &carrier{requests: map[string][]time.Time{}, booked: map[string]string{}, release: make(chan struct{}),
		arrived: make(chan string, 1000), plan: func(string, int) (int, string, bool) { return 0, "", false }}
	c.Server = httptest.NewServer(http.HandlerFunc(c.serve))
	t.Cleanup(func() { c.CloseClientConnections(); c.Close() })
	return c
}

func (c *carrier) setPlan(plan func(key string, n int) (int, string, bool)) {
	c.mu.Lock()
	c.plan = plan
	c.mu.Unlock()
}

func (c *carrier) serve(w http.ResponseWriter, r *http.Request) {
	key := r.Header.Get("Idempotency-Key")
	var body struct {
		Tenant  string `json:"tenant"`
		OrderID string `json:"order_id"`
	}
	// A booking is for the tenant whose order it ships: the job's.
	if r.Method != http.MethodPost || r.URL.Path != "/bookings" || key == "" || json.NewDecoder(r.Body).Decode(&body) != nil || body.OrderID == "" ||
		body.Tenant != "acme" {
		http.Error(w, "bad booking", http.StatusBadRequest)
		return
	}
	c.mu.Lock()
	c.requests[key] = append(c.requests[key], time.Now())
	status, retryAfter, hold := c.plan(key, len(c.requests[key]))
	if status != 0 {
		c.mu.Unlock()
		if retryAfter != "" {
			w.Header().Set("Retry-After", retryAfter)
		}
		http.Error(w, "busy", status)
		return
	}
	id, ok := c.booked[key]
	if !ok {
		id = fmt.Sprintf("bk-%d", len(c.booked)+1)
		c.booked[key] = id
	}
	c.mu.Unlock()
	c.arrived <- key
	if hold {
		<-c.release
	}
	w.Header().Set("Content-Type", "application/json")
	fmt.Fprintf(w, `{"booking_id":%q}`, id)
}

// seen returns the requests of key and the bookings made in all.
func (c *carrier) seen(key string) ([]time.Time, int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]time.Time(nil), c.requests[key]...), len(c.booked)
}

// carrierStack runs the inventory with carrier c in this process
// (components), on a broker of its own and a database deployed with least
// privilege, with the worker's settings w; it returns a client of tenant
// acme and the owner's database URL and the runtime role's.
func carrierStack(t *testing.T, c inventoryapp.Carrier, components onceflow.Components, w jobs.Config) (inventoryapp.Client, string, string) {
	t.Helper()
	owner, runtime := pipelinetest.LeastPrivilege(t, postgres.Migrations{Name: inventoryapp.Name, FS: inventoryapp.Migrations})
	brokers := pipelinetest.Broker(t).Addrs()
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	ctx, cancel := context.WithCancel(context.Background())
	addrs := make(chan onceflow.Addrs, 1)
	done := make(chan error, 1)
	go func() {
		done <- onceflow.RunComponents(ctx, onceflow.RunConfig{
			Config: onceflow.Config{
				Domains: []*onceflow.Domain{inventoryapp.DomainWith(c)}, Kafka: kafka.Config{Brokers: brokers, Logger: logger},
				Topics: kafka.Topics{Partitions: 2}, DatabaseURL: runtime, DatabaseMigrationURL: owner, Logger: logger,
			},
			Components: components, HTTPAddr: "127.0.0.1:0", AdminAddr: "127.0.0.1:0", Worker: w,
			// The carrier is on loopback, which the worker's guard refuses
			// unless allowed, as for a webhook receiver.
			Webhooks: webhooks.Config{Allow: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}},
			Started:  func(a onceflow.Addrs) { addrs <- a },
		})
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
			t.Errorf("stack: %v", err)
		}
	})
	select {
	case a := <-addrs:
		return tenantClient(t, owner, "http://"+a.HTTP, "acme"), owner, runtime
	case err := <-done:
		done <- err
		t.Fatalf("stack stopped: %v", err)
	case <-time.After(60 * time.Second):
		t.Fatal("stack did not start")
	}
	panic("unreachable")
}

// bookings returns the carrier_booking jobs by order id.
func bookings(t *testing.T, pool *pgxpool.Pool) map[string]bookingJob {
	t.Helper()
	rows, err := pool.Query(context.Background(), `SELECT args->>'order_id', args->>'key', id, state::text, attempt, max_attempts
		FROM river_job WHERE kind = 'carrier_booking'`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	out := map[string]bookingJob{}
	for rows.Next() {
		var order string
		var j bookingJob
		if err := rows.Scan(&order, &j.key, &j.id, &j.state, &j.attempt, &j.max); err != nil {
			t.Fatal(err)
		}
		if _, dup := out[order]; dup {
			t.Errorf("order %s has two bookings", order)
		}
		out[order] = j
	}
	return out
}

type bookingJob struct {
	key          string
	id           int64
	state        string
	attempt, max int
}

func connect(t *testing.T, url string) *pgxpool.Pool {
	t.Helper()
	pool, err := postgres.Connect(context.Background(), url, 2)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// placeOrders adds stock for n-1 orders of one unit and places n: n-1 are
// confirmed (each shipped: a booking), the last rejected (no booking).
func placeOrders(t *testing.T, acme inventoryapp.Client, n int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if _, _, err := acme.AddStock(ctx, "stock", "bolt", int64(n-1)); err != nil {
		t.Fatal(err)
	}
	pipelinetest.Eventually(t, 60*time.Second, func() error {
		if it, err := acme.Item(ctx, "bolt"); err != nil || it.Available != int64(n-1) {
			return fmt.Errorf("bolt %+v, %v: the stock not added yet", it, err)
		}
		return nil
	})
	for i := range n {
		id := fmt.Sprintf("ord-%d", i)
		if _, _, err := acme.PlaceOrder(ctx, "place-"+id, id, "bolt", 1); err != nil {
			t.Fatal(err)
		}
		// One at a time: the stock is added before the first reservation.
		if o, err := acme.WaitOrder(ctx, id); err != nil || (i < n-1) != (o.Status == inventory.StatusConfirmed) {
			t.Fatalf("%s: %+v, %v", id, o, err)
		}
	}
}

// Each confirmed order is booked with the carrier once: one job per
// order, one request and one booking per job, the job's key the
// Idempotency-Key; the rejected order has none.
func TestCarrierBookingOncePerShippedOrder(t *testing.T) {
	t.Parallel()
	c := newCarrier(t)
	acme, owner, _ := carrierStack(t, inventoryapp.Carrier{URL: c.URL}, onceflow.All, jobs.Config{FetchPollInterval: 100 * time.Millisecond})
	placeOrders(t, acme, 4)
	pool := connect(t, owner)
	pipelinetest.Eventually(t, 60*time.Second, func() error {
		bs := bookings(t, pool)
		if len(bs) != 3 {
			return fmt.Errorf("%d bookings, want 3", len(bs))
		}
		for order, b := range bs {
			if b.state != "completed" {
				return fmt.Errorf("%s: %+v", order, b)
			}
		}
		return nil
	})
	bs := bookings(t, pool)
	for i := range 3 {
		b, ok := bs[fmt.Sprintf("ord-%d", i)]
		if reqs, _ := c.seen(b.key); !ok || len(reqs) != 1 || b.attempt != 1 {
			t.Errorf("ord-%d: job %+v, %d requests under its key; want one attempt, one request", i, b, len(reqs))
		}
	}
	if _, booked := c.seen(""); booked != 3 {
		t.Errorf("%d bookings at the carrier, want 3", booked)
	}
}

// A carrier answering 503 with Retry-After: 2 is called again no sooner
// than 2 s later, though the kind's backoff would wait minutes.
func TestCarrierRetryAfter(t *testing.T) {
	t.Parallel()
	c := newCarrier(t)
	c.setPlan(func(_ string, n int) (int, string, bool) {
		if n == 1 {
			return http.StatusServiceUnavailable, "2", false
		}
		return 0, "", false
	})
	acme, owner, _ := carrierStack(t, inventoryapp.Carrier{URL: c.URL}, onceflow.All,
		jobs.Config{FetchPollInterval: 100 * time.Millisecond, BaseDelay: 10 * time.Minute, MaxDelay: 20 * time.Minute})
	placeOrders(t, acme, 2)
	pool := connect(t, owner)
	pipelinetest.Eventually(t, 60*time.Second, func() error {
		if b := bookings(t, pool)["ord-0"]; b.state != "completed" {
			return fmt.Errorf("ord-0's booking %+v", b)
		}
		return nil
	})
	b := bookings(t, pool)["ord-0"]
	reqs, booked := c.seen(b.key)
	if len(reqs) != 2 || b.attempt != 2 || booked != 1 {
		t.Fatalf("%d requests, attempt %d, %d bookings; want 2, 2, 1", len(reqs), b.attempt, booked)
	}
	if gap := reqs[1].Sub(reqs[0]); gap < 2*time.Second {
		t.Errorf("retried %s after the 503, before its Retry-After of 2s", gap)
	}
}

// A booking the carrier refuses on every attempt ends discarded after
// the kind's attempts, retried after the kind's backoff (the worker's
// would wait up to an hour), with its errors; `inventory jobs retry` runs
// it once more, with the same key, and it is booked once.
func TestCarrierBookingDeadThenRetried(t *testing.T) {
	t.Parallel()
	c := newCarrier(t)
	c.setPlan(func(string, int) (int, string, bool) { return http.StatusBadGateway, "", false })
	acme, owner, _ := carrierStack(t, inventoryapp.Carrier{URL: c.URL, MaxAttempts: 2, BaseDelay: 10 * time.Millisecond, MaxDelay: 50 * time.Millisecond},
		onceflow.All, jobs.Config{FetchPollInterval: 100 * time.Millisecond, BaseDelay: time.Hour, MaxDelay: time.Hour})
	placeOrders(t, acme, 2)
	pool := connect(t, owner)
	pipelinetest.Eventually(t, 60*time.Second, func() error {
		if b := bookings(t, pool)["ord-0"]; b.state != "discarded" {
			return fmt.Errorf("ord-0's booking %+v", b)
		}
		return nil
	})
	b := bookings(t, pool)["ord-0"]
	if reqs, booked := c.seen(b.key); len(reqs) != 2 || b.attempt != 2 || booked != 0 {
		t.Fatalf("%d requests, attempt %d of %d, %d bookings; want 2, 2, 0", len(reqs), b.attempt, b.max, booked)
	}
	ctx := context.Background()
	if err := jobs.Retry(ctx, pool, b.id+1000); !errors.Is(err, jobs.ErrNoJob) {
		t.Errorf("retry of a job River does not have: %v", err)
	}
	c.setPlan(func(string, int) (int, string, bool) { return 0, "", false })
	if out, err := inventoryCLI(t, "jobs", "retry", fmt.Sprint(b.id)).env("DATABASE_URL", owner).run(); err != nil {
		t.Fatalf("jobs retry: %v\n%s", err, out)
	}
	pipelinetest.Eventually(t, 60*time.Second, func() error {
		if b := bookings(t, pool)["ord-0"]; b.state != "completed" {
			return fmt.Errorf("ord-0's booking %+v", b)
		}
		return nil
	})
	if reqs, booked := c.seen(b.key); len(reqs) != 3 || booked != 1 {
		t.Errorf("%d requests, %d bookings; want 3, 1", len(reqs), booked)
	}
	if err := jobs.Retry(ctx, pool, b.id); !errors.Is(err, jobs.ErrNotDead) {
		t.Errorf("retry of a completed job: %v, want ErrNotDead", err)
	}
}

// A worker killed (SIGKILL) after the carrier applied the booking and
// before the job was completed: after its lease another worker calls
// again with the same key, and the carrier, which applies a key once,
// has one booking.
func TestCarrierBookingWorkerKilledMidCall(t *testing.T) {
	t.Parallel()
	c := newCarrier(t)
	c.setPlan(func(_ string, n int) (int, string, bool) { return 0, "", n == 1 })
	defer close(c.release)
	acme, owner, runtime := carrierStack(t, inventoryapp.Carrier{URL: c.URL}, onceflow.Components{Ingest: true, Relay: true, Processor: true, Projector: true}, jobs.Config{})
	worker := func(name string) *e2e.Proc {
		p, err := e2e.Start(inventoryBin(t), name, []string{"worker"}, map[string]string{
			"DATABASE_URL": runtime, "DATABASE_MIGRATION_URL": owner, "INVENTORY_CARRIER_URL": c.URL, "ONCEFLOW_WEBHOOK_ALLOW_NETWORKS": "127.0.0.0/8", "ADMIN_ADDR": "127.0.0.1:0", "ONCEFLOW_LAG_EXPORT": "off",
			"ONCEFLOW_WORKER_LEASE": "10s", "ONCEFLOW_WORKER_ATTEMPT_TIMEOUT": "8s", "ONCEFLOW_WEBHOOK_TIMEOUT": "5s",
		}, filepath.Join(t.TempDir(), name+".log"), "")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { p.Kill() })
		return p
	}
	first := worker("worker-1")
	placeOrders(t, acme, 2)
	var key string
	select {
	case key = <-c.arrived:
	case <-time.After(90 * time.Second):
		t.Fatalf("the booking never reached the carrier:\n%s", first.Tail(20))
	}
	first.Kill()
	pool := connect(t, owner)
	if b := bookings(t, pool)["ord-0"]; b.state != "running" || b.key != key {
		t.Fatalf("ord-0's booking after the kill: %+v, want running under %s", b, key)
	}
	second := worker("worker-2")
	pipelinetest.Eventually(t, 120*time.Second, func() error {
		if b := bookings(t, pool)["ord-0"]; b.state != "completed" {
			return fmt.Errorf("ord-0's booking %+v", b)
		}
		return nil
	})
	reqs, booked := c.seen(key)
	if len(reqs) != 2 || booked != 1 {
		t.Errorf("%d requests under the key, %d bookings; want 2 (the killed attempt's and the next), 1\n%s", len(reqs), booked, second.Tail(20))
	}
}

var buildOnce struct {
	sync.Once
	dir string
	err error
}

// inventoryBin builds cmd/inventory once for the package's tests.
func inventoryBin(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "inventory-bin")
		if err != nil {
			buildOnce.err = err
			return
		}
		buildOnce.dir = dir
		cmd := exec.Command("go", "build", "-o", dir, "github.com/onceflow/onceflow/cmd/inventory")
		if out, err := cmd.CombinedOutput(); err != nil {
			buildOnce.err = fmt.Errorf("go build: %w\n%s", err, out)
		}
	})
	if buildOnce.err != nil {
		t.Fatal(buildOnce.err)
	}
	return filepath.Join(buildOnce.dir, "inventory")
}

// cliRun is a run of the inventory binary's command line.
type cliRun struct {
	cmd *exec.Cmd
}

func inventoryCLI(t *testing.T, args ...string) *cliRun {
	cmd := exec.Command(inventoryBin(t), args...)
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + os.Getenv("HOME")}
	return &cliRun{cmd: cmd}
}

func (r *cliRun) env(k, v string) *cliRun { r.cmd.Env = append(r.cmd.Env, k+"="+v); return r }

func (r *cliRun) run() (string, error) {
	out, err := r.cmd.CombinedOutput()
	return string(out), err
}
