package chaos

import (
	"context"
	"fmt"
	"hash/fnv"
	"net/http"
	"strconv"
	"time"

	"github.com/onceflow/onceflow/pipeline"
	"github.com/onceflow/onceflow/pipeline/jobs"
	"github.com/onceflow/onceflow/pipeline/kafka"
	"github.com/onceflow/onceflow/pipeline/webhooks"
	"github.com/onceflow/onceflow/pipeline/webhooks/webhookstest"
)

// hooks is the run's webhook receiver and each tenant's subscription to
// every event type.
type hooks struct {
	receiver *webhookstest.Receiver
	subs     map[string]pipeline.ID // by tenant
}

// receiverPlan misbehaves on a delivery's first three requests, by a hash
// of the seed, its key and the request's number (the same faults whatever
// the timing): 500s and 503/429s with Retry-After before applying the
// effect, hangs past the worker's timeout and 502s after applying it (an
// acknowledgement lost).
func receiverPlan(seed uint64) webhookstest.Plan {
	return func(key string, n int) *webhookstest.Fault {
		if n > 3 {
			return nil
		}
		h := fnv.New32a()
		fmt.Fprintf(h, "%d/%s/%d", seed, key, n)
		switch r := h.Sum32() % 100; {
		case r < 8:
			return &webhookstest.Fault{Status: http.StatusInternalServerError, BeforeApply: true}
		case r < 13:
			return &webhookstest.Fault{Status: http.StatusServiceUnavailable, RetryAfter: "1", BeforeApply: true}
		case r < 17:
			return &webhookstest.Fault{Status: http.StatusTooManyRequests, RetryAfter: time.Now().Add(time.Second).UTC().Format(http.TimeFormat), BeforeApply: true}
		case r < 21:
			return &webhookstest.Fault{Hang: 1500 * time.Millisecond}
		case r < 25:
			return &webhookstest.Fault{Status: http.StatusBadGateway}
		}
		return nil
	}
}

// subscribe starts the receiver and subscribes each tenant to every event
// type of its own.
func subscribe(ctx context.Context, c *cluster, seed uint64, tenants []*tenant) (*hooks, error) {
	h := &hooks{receiver: webhookstest.New(nil, receiverPlan(seed)), subs: map[string]pipeline.ID{}}
	c.t.Cleanup(h.receiver.Close)
	var secrets []string
	for _, tn := range tenants {
		s, _, err := webhooks.Create(ctx, c.pool, tn.name, "chaos", h.receiver.URL, nil)
		if err != nil {
			return nil, fmt.Errorf("subscribe %s: %w", tn.name, err)
		}
		h.subs[tn.name] = s.ID
		secrets = append(secrets, s.Secret)
	}
	h.receiver.SetSecrets(secrets)
	return h, nil
}

// delivered checks the webhook property once the pipeline drained: every
// event of a subscribed tenant in the events topic was delivered, and
// applied once, by the receiver — its key seen, one effect, its delivery
// row delivered — and nothing else was. It waits up to within for the
// deliveries still in flight (a killed worker's jobs wait for River's
// rescuer: the lease, then up to 30 s, and a new leader first if the
// leader died).
func (h *hooks) delivered(ctx context.Context, c *cluster, within time.Duration) (violations []violation, events, retried int) {
	records, err := readAll(ctx, c.pl.BrokerAddr, kafka.Topics{Prefix: c.pl.Prefix}.Events())
	if err != nil {
		return []violation{{"every subscribed event delivered, and applied once, by the receiver", []string{"read the events: " + err.Error()}}}, 0, 0
	}
	want := map[string]string{} // key -> event id
	for _, r := range records {
		tenant, id := header(r, pipeline.HeaderTenant), header(r, pipeline.HeaderEventID)
		sub, ok := h.subs[tenant]
		if !ok {
			continue
		}
		ev, err := pipeline.ParseID(id)
		if err != nil {
			continue // the checker's hostile-record properties cover it
		}
		want[jobs.Key(ev, sub.String())] = id
	}
	deadline := time.Now().Add(within)
	var pending int
	for {
		if err := c.pool.QueryRow(ctx, `SELECT count(*) FROM webhook_deliveries WHERE status <> 'delivered'`).Scan(&pending); err == nil &&
			pending == 0 && h.receiver.Effects() >= len(want) {
			break
		}
		if time.Now().After(deadline) {
			violations = append(violations, violation{"every subscribed event delivered, and applied once, by the receiver", []string{fmt.Sprintf("%d deliveries not delivered and %d of %d effects after %s", pending, h.receiver.Effects(), len(want), within)}})
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	seen := map[string]webhookstest.Stats{}
	for _, s := range h.receiver.Seen() {
		seen[s.Key] = s
		if _, ok := want[s.Key]; !ok {
			violations = append(violations, violation{"every subscribed event delivered, and applied once, by the receiver", []string{"the receiver got key " + s.Key + ", which no subscribed event has"}})
		}
	}
	for key, id := range want {
		s, ok := seen[key]
		switch {
		case !ok:
			violations = append(violations, violation{"every subscribed event delivered, and applied once, by the receiver", []string{"event " + id + " never reached the receiver"}})
		case s.Effects != 1 || s.WebhookID != id:
			violations = append(violations, violation{"every subscribed event delivered, and applied once, by the receiver", []string{fmt.Sprintf("event %s: %d effects, webhook-id %s", id, s.Effects, s.WebhookID)}})
		case s.Requests > 1:
			retried++
		}
	}
	var rows int
	if err := c.pool.QueryRow(ctx, `SELECT count(*) FROM webhook_deliveries WHERE status = 'delivered'`).Scan(&rows); err != nil || rows != len(want) {
		violations = append(violations, violation{"every subscribed event delivered, and applied once, by the receiver", []string{"delivered rows " + strconv.Itoa(rows) + ", want one per subscribed event, " + strconv.Itoa(len(want))}})
	}
	for _, b := range h.receiver.Bad() {
		violations = append(violations, violation{"every subscribed event delivered, and applied once, by the receiver", []string{"the receiver refused: " + b}})
	}
	return violations, len(want), retried
}
