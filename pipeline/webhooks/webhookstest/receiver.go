// Package webhookstest is a real HTTP receiver of onceflow's webhooks for
// tests: it verifies each delivery's Standard Webhooks signature, applies
// each Idempotency-Key's effect once (as a receiver must), counts what it
// saw per key, and misbehaves on request: fails, hangs, answers 429 or 503
// with Retry-After, or 410.
package webhookstest

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sort"
	"sync"
	"time"

	"github.com/onceflow/onceflow/pipeline/stdwebhooks"
	"github.com/onceflow/onceflow/pipeline/webhooks"
)

// Fault is how the receiver answers one request, decided before or after
// it applied the effect.
type Fault struct {
	// Status, if set, is the answer instead of 200.
	Status int
	// RetryAfter is sent with Status (seconds, or an HTTP date).
	RetryAfter string
	// Hang delays the answer (past the sender's timeout: the sender sees
	// no answer).
	Hang time.Duration
	// BeforeApply answers with the fault without applying the effect;
	// otherwise the effect is applied first and the answer lost to the
	// fault (what a lost acknowledgement looks like).
	BeforeApply bool
}

// Plan decides the fault of the nth request (1 for the first) with key;
// nil answers 200 always.
type Plan func(key string, n int) *Fault

// Receiver is a running receiver.
type Receiver struct {
	// URL is where it listens.
	URL    string
	server *httptest.Server

	mu       sync.Mutex
	secrets  []string
	plan     Plan
	requests map[string]int // per Idempotency-Key
	effects  map[string]int // per Idempotency-Key: applied, at most once if all is well
	ids      map[string]string
	bad      []string // signature failures and malformed requests
	bodies   map[string]webhooks.Body
	maxInFl  map[string]int // per tenant (aggregate id's tenant): the most at once
	inTenant map[string]int
}

// New starts a receiver that accepts deliveries signed with any one of
// secrets and misbehaves by plan; Close stops it.
func New(secrets []string, plan Plan) *Receiver {
	r := &Receiver{secrets: secrets, plan: plan, requests: map[string]int{}, effects: map[string]int{},
		ids: map[string]string{}, bodies: map[string]webhooks.Body{}, maxInFl: map[string]int{}, inTenant: map[string]int{}}
	r.server = httptest.NewServer(http.HandlerFunc(r.serve))
	r.URL = r.server.URL
	return r
}

// Close stops the receiver.
func (r *Receiver) Close() { r.server.CloseClientConnections(); r.server.Close() }

// SetSecrets changes the secrets it accepts (a rotation on its side).
func (r *Receiver) SetSecrets(secrets []string) {
	r.mu.Lock()
	r.secrets = secrets
	r.mu.Unlock()
}

// SetPlan changes how it misbehaves.
func (r *Receiver) SetPlan(p Plan) {
	r.mu.Lock()
	r.plan = p
	r.mu.Unlock()
}

func (r *Receiver) serve(w http.ResponseWriter, req *http.Request) {
	body, err := io.ReadAll(io.LimitReader(req.Body, 1<<20))
	key := req.Header.Get("Idempotency-Key")
	r.mu.Lock()
	secrets := r.secrets
	r.mu.Unlock()
	if err != nil || key == "" || req.Method != http.MethodPost {
		r.fail(w, fmt.Sprintf("malformed request: %s key %q err %v", req.Method, key, err))
		return
	}
	if err := webhooks.Verify(req.Header, secrets, body, time.Now(), 5*time.Minute); err != nil {
		r.fail(w, fmt.Sprintf("key %s: %v", key, err))
		return
	}
	var b webhooks.Body
	if err := json.Unmarshal(body, &b); err != nil {
		r.fail(w, fmt.Sprintf("key %s: body: %v", key, err))
		return
	}
	tenant, _, _ := cut(b.Data.AggregateID)
	r.mu.Lock()
	r.requests[key]++
	n := r.requests[key]
	if prev, ok := r.ids[key]; ok && prev != req.Header.Get(stdwebhooks.HeaderID) {
		r.bad = append(r.bad, fmt.Sprintf("key %s: webhook-id %s, earlier %s", key, req.Header.Get(stdwebhooks.HeaderID), prev))
	}
	r.ids[key] = req.Header.Get(stdwebhooks.HeaderID)
	r.bodies[key] = b
	r.inTenant[tenant]++
	r.maxInFl[tenant] = max(r.maxInFl[tenant], r.inTenant[tenant])
	var f *Fault
	if r.plan != nil {
		f = r.plan(key, n)
	}
	if f == nil || !f.BeforeApply {
		r.effects[key] = 1 // applied once, however many times it comes
	}
	r.mu.Unlock()
	defer func() {
		r.mu.Lock()
		r.inTenant[tenant]--
		r.mu.Unlock()
	}()
	if f == nil {
		w.WriteHeader(http.StatusOK)
		return
	}
	if f.Hang > 0 {
		select {
		case <-time.After(f.Hang):
		case <-req.Context().Done():
			return
		}
	}
	if f.RetryAfter != "" {
		w.Header().Set("Retry-After", f.RetryAfter)
	}
	if f.Status == 0 {
		f.Status = http.StatusOK
	}
	w.WriteHeader(f.Status)
}

func cut(s string) (string, string, bool) {
	for i := range len(s) {
		if s[i] == '/' {
			return s[:i], s[i+1:], true
		}
	}
	return s, "", false
}

func (r *Receiver) fail(w http.ResponseWriter, why string) {
	r.mu.Lock()
	r.bad = append(r.bad, why)
	r.mu.Unlock()
	http.Error(w, why, http.StatusBadRequest)
}

// Stats is what the receiver saw of one Idempotency-Key.
type Stats struct {
	Key       string
	WebhookID string
	Requests  int
	Effects   int
	Body      webhooks.Body
}

// Seen returns what it saw per key, by key.
func (r *Receiver) Seen() []Stats {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]Stats, 0, len(r.requests))
	for k, n := range r.requests {
		out = append(out, Stats{Key: k, WebhookID: r.ids[k], Requests: n, Effects: r.effects[k], Body: r.bodies[k]})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Key < out[j].Key })
	return out
}

// Effects returns how many keys had their effect applied.
func (r *Receiver) Effects() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.effects)
}

// Requests returns how many requests key came in.
func (r *Receiver) Requests(key string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.requests[key]
}

// Bad returns the requests it refused (bad signatures, malformed) and
// any key that came with two webhook-ids.
func (r *Receiver) Bad() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.bad...)
}

// MaxInFlight is the most requests of tenant it had at once.
func (r *Receiver) MaxInFlight(tenant string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.maxInFl[tenant]
}
