package chaos

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/onceflow/onceflow/examples/ledger"
	"github.com/onceflow/onceflow/examples/ledger/ledgerapp"
	"github.com/onceflow/onceflow/pipeline"
	"github.com/onceflow/onceflow/pipeline/apiclient"
	"github.com/onceflow/onceflow/pipeline/kafka"
)

// sent is one command the workload knows the pipeline accepted: a 2xx over
// HTTP, or a record Kafka acknowledged. Each must end with exactly one
// outcome.
type sent struct {
	ID        string
	Tenant    string
	Account   string // local id of the aggregate the command is for
	Type      string
	Amount    int64
	To        string // transfers: the target's local id
	Transfer  string // transfers: the transfer id
	ViaKafka  bool
	Responses int // 2xx answers naming this command (retries included)
}

// commandKey names a command as command_status does: its id within its
// tenant and aggregate. A producer may use one id on two aggregates, or an
// id another tenant used: those are distinct commands (docs/processor.md).
type commandKey struct{ id, tenant, aggregate string }

func (s *sent) key() commandKey {
	return commandKey{s.ID, s.Tenant, pipeline.AggregateID(s.Tenant, s.Account)}
}

// model is everything the workload did, for the checker and the summary.
type model struct {
	mu       sync.Mutex
	commands map[commandKey]*sent
	hostile  []*hostileRecord     // in the order they were produced
	lastHTTP atomic.Pointer[sent] // the last command ingest accepted, whose id the hostile stream reuses

	requests      atomic.Int64 // HTTP requests sent
	replays       atomic.Int64 // answers with Idempotent-Replayed: true
	retries       atomic.Int64 // resends with the same key after a timeout or 5xx
	newKeyDups    atomic.Int64 // deliberate resends with a new key
	conflicts     atomic.Int64 // 409s (must be 0: the workload never reuses a key for another request)
	kafkaProduced atomic.Int64 // records produced straight to Kafka
	kafkaTwice    atomic.Int64 // of those, produced a second time with the same command-id
	reusedIDs     atomic.Int64 // ids ingest minted, produced again to another account and another tenant's
	clientErrors  atomic.Int64 // 4xx other than the expected ones
	abandoned     atomic.Int64 // requests never answered before the finish deadline
	refusals      []string     // the first unexpected 4xx answers
}

func newModel() *model { return &model{commands: map[commandKey]*sent{}} }

// refused records an unexpected 4xx with the first answers' bodies.
func (m *model) refused(path string, resp *apiclient.Response) {
	if m.clientErrors.Add(1) <= 5 {
		m.mu.Lock()
		m.refusals = append(m.refusals, fmt.Sprintf("%s: %d %s", path, resp.Status, resp.Body))
		m.mu.Unlock()
	}
}

func (m *model) record(s sent) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if prev, ok := m.commands[s.key()]; ok {
		prev.Responses++
		return
	}
	s.Responses = 1
	m.commands[s.key()] = &s
}

// hotAccount is the index of each tenant's hot account, and hotShare the
// percentage of the operations on a tenant that go to it (deposits,
// withdrawals, transfers from it and to it, commands produced straight to
// Kafka; half the hostile records name it): with 12 accounts it gets
// several times the commands of the busiest other one (the summary prints
// both), so one aggregate's partition, state and dedup memory carry a
// large share of the load through every fault.
const (
	hotAccount = 0
	hotShare   = 40
)

// tenant is one tenant with its key and accounts.
type tenant struct {
	name     string
	key      string
	accounts []string
	opened   []atomic.Bool
}

// workload drives the pipeline until ctx ends.
type workload struct {
	c        *cluster
	m        *model
	tenants  []*tenant
	producer *kgo.Client
	encode   func(context.Context, any) ([]byte, error)
	topic    string
	seed     uint64
	httpc    *http.Client

	// hostileProducer sends the hostile records, alone: a record the
	// broker refuses fails its batch, and no good command shares it.
	hostileProducer *kgo.Client
	// maxMessageBytes is the commands topic's max.message.bytes.
	maxMessageBytes int
}

// run starts workers goroutines and the hostile stream; they start no new
// operation once stop ends, and finish the ones in flight (retrying as long
// as it takes, up to finish's deadline: a request abandoned unanswered
// would leave the model unsure whether it was accepted).
func (w *workload) run(stop, finish context.Context, workers int) {
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		w.runHostile(stop, finish)
	}()
	for i := 0; i < workers; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(w.seed, uint64(i)))
			for n := 0; stop.Err() == nil; n++ {
				w.step(finish, rng, fmt.Sprintf("w%d-%d", i, n))
			}
		}()
	}
	wg.Wait()
}

func (w *workload) client(rng *rand.Rand, t *tenant) *ledgerapp.Client {
	urls := w.c.ingestURLs()
	return &ledgerapp.Client{Client: &apiclient.Client{BaseURL: urls[rng.IntN(len(urls))], APIKey: t.key, HTTP: w.httpc}}
}

// step runs one operation.
func (w *workload) step(ctx context.Context, rng *rand.Rand, opID string) {
	t := w.tenants[rng.IntN(len(w.tenants))]
	i := rng.IntN(len(t.accounts))
	if rng.IntN(100) < hotShare {
		i = hotAccount
	}
	acct := t.accounts[i]
	if !t.opened[i].Load() {
		body := map[string]any{"account_id": acct, "currency": "EUR"}
		if s, ok := w.post(ctx, rng, t, "open-"+acct, "/v1/accounts", body); ok {
			t.opened[i].Store(true)
			w.m.record(sent{ID: s, Tenant: t.name, Account: acct, Type: "OpenAccount"})
		}
		return
	}
	amount := int64(1 + rng.IntN(500))
	switch r := rng.IntN(100); {
	case r < 10: // straight to Kafka, some twice with the same command-id
		w.produce(ctx, rng, t, acct, amount)
	case r < 50:
		w.send(ctx, rng, t, opID, "/v1/accounts/"+acct+"/deposits", map[string]any{"amount": amount},
			sent{Tenant: t.name, Account: acct, Type: "Deposit", Amount: amount})
	case r < 70:
		w.send(ctx, rng, t, opID, "/v1/accounts/"+acct+"/withdrawals", map[string]any{"amount": amount},
			sent{Tenant: t.name, Account: acct, Type: "Withdraw", Amount: amount})
	case r < 98:
		to := t.accounts[(i+1+rng.IntN(len(t.accounts)-1))%len(t.accounts)] // another account
		if i != hotAccount && rng.IntN(100) < hotShare {
			to = t.accounts[hotAccount]
		}
		transfer := "tr-" + opID
		w.send(ctx, rng, t, opID, "/v1/transfers",
			map[string]any{"transfer_id": transfer, "from": acct, "to": to, "amount": amount},
			sent{Tenant: t.name, Account: acct, Type: "RequestTransfer", Amount: amount, To: to, Transfer: transfer})
	default:
		w.send(ctx, rng, t, opID, "/v1/accounts/"+acct+"/close", map[string]any{},
			sent{Tenant: t.name, Account: acct, Type: "CloseAccount"})
	}
}

// send posts a command, records it, and sometimes sends it again with a
// new key on purpose (a second, distinct command).
func (w *workload) send(ctx context.Context, rng *rand.Rand, t *tenant, key, path string, body map[string]any, s sent) {
	id, ok := w.post(ctx, rng, t, key, path, body)
	if !ok {
		return
	}
	s.ID = id
	w.m.record(s)
	last := s
	w.m.lastHTTP.Store(&last)
	if rng.IntN(100) < 5 && s.Type != "RequestTransfer" { // a transfer id names one transfer
		if id2, ok := w.post(ctx, rng, t, key+"-again", path, body); ok {
			w.m.newKeyDups.Add(1)
			s.ID = id2
			w.m.record(s)
		}
	}
}

// post sends until the server answers (retrying with the same key through
// timeouts, refused connections and 5xx, as a careful client does), and
// returns the command id of a 202. A request still unanswered when ctx
// ends is counted as abandoned (the run then fails: its fate is unknown).
func (w *workload) post(ctx context.Context, rng *rand.Rand, t *tenant, key, path string, body map[string]any) (string, bool) {
	for attempt := 0; ctx.Err() == nil; attempt++ {
		if attempt > 0 {
			w.m.retries.Add(1)
			time.Sleep(time.Duration(20+rng.IntN(80)) * time.Millisecond)
		}
		w.m.requests.Add(1)
		acc, resp, err := w.client(rng, t).Post(ctx, path, key, body)
		if resp == nil || resp.Status >= 500 {
			continue // no answer, or a 503 while the database restarts
		}
		if resp.Replayed() {
			w.m.replays.Add(1)
		}
		switch {
		case err == nil:
			return acc.CommandID, true
		case resp.Status == http.StatusConflict:
			w.m.conflicts.Add(1)
			return "", false
		case resp.Status == http.StatusTooManyRequests:
			continue
		default:
			w.m.refused(path, resp)
			return "", false
		}
	}
	w.m.abandoned.Add(1)
	return "", false
}

// produce writes a Deposit straight to the commands topic with a stable
// command-id, as an external producer would, and sometimes writes it a
// second time with the same id (a producer retry above the client).
func (w *workload) produce(ctx context.Context, rng *rand.Rand, t *tenant, acct string, amount int64) {
	twice := rng.IntN(100) < 30
	if w.produceDeposit(ctx, pipeline.NewCommandID(), t.name, acct, amount, twice) {
		w.m.kafkaProduced.Add(1)
	}
}

// produceDeposit produces a Deposit with command id id to tenant/acct until
// the broker acknowledges it (a resend after an unanswered attempt is the
// same command: the processor skips it), records it, and produces it once
// more if twice. It reports whether the broker took it.
func (w *workload) produceDeposit(ctx context.Context, id pipeline.ID, tenant, acct string, amount int64, twice bool) bool {
	value, err := w.encode(ctx, ledger.Deposit{Amount: amount})
	if err != nil {
		panic(err) // the serde is ours; this is a bug
	}
	rec := func() *kgo.Record {
		r, err := kafka.CommandRecord(w.topic, pipeline.AggregateID(tenant, acct), id, ledger.Deposit{}.MessageType(), value, time.Time{}, "")
		if err != nil {
			panic(err) // the account ids are ours; this is a bug
		}
		return r
	}
	for ctx.Err() == nil {
		pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		err := w.producer.ProduceSync(pctx, rec()).FirstErr()
		cancel()
		if err == nil {
			break
		}
		if errors.Is(err, context.Canceled) {
			return false
		}
		time.Sleep(100 * time.Millisecond) // the broker is restarting
	}
	if ctx.Err() != nil {
		w.m.abandoned.Add(1)
		return false
	}
	w.m.record(sent{ID: id.String(), Tenant: tenant, Account: acct, Type: "Deposit", Amount: amount, ViaKafka: true})
	if twice {
		pctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		if w.producer.ProduceSync(pctx, rec()).FirstErr() == nil {
			w.m.kafkaTwice.Add(1)
		}
		cancel()
	}
	return true
}
