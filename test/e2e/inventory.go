package e2e

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/onceflow/onceflow/examples/inventory"
	"github.com/onceflow/onceflow/examples/inventory/inventoryapp"
	"github.com/onceflow/onceflow/pipeline"
	"github.com/onceflow/onceflow/pipeline/apiclient"
	"github.com/onceflow/onceflow/pipeline/kafka"
)

// The inventory's workload and checker (examples/inventory), shared by
// its end-to-end test and its chaos shape: tenants add stock to items and
// place orders for them over HTTP, as careful clients (a retry keeps its
// Idempotency-Key), some requests retried on purpose with the same key and
// some orders placed again with a new key; then the events topic and the
// read models are checked against the saga's invariants.

// InventoryTenant is one tenant of the workload: its name, its API key and
// its items (local ids).
type InventoryTenant struct {
	Name, Key string
	Items     []string
}

// InventoryLoad drives the workload.
type InventoryLoad struct {
	Tenants []InventoryTenant
	// URLs returns the ingest base URLs to spread requests over.
	URLs func() []string
	// HTTP is the clients' HTTP client (its timeout makes them retry).
	HTTP *http.Client
	Seed uint64
	// Producer, if set, also sends orders straight to the order's commands
	// topic, as any Kafka producer may: each with a stable command id,
	// some twice (a producer's retry above its client), and a share of
	// poison ones (quantity 0), which must go to the DLQ, once each, and
	// place nothing. Encode encodes an order command for that topic.
	Producer *kgo.Client
	Encode   func(context.Context, any) ([]byte, error)

	M InventoryModel
}

// The order aggregate type's topics.
const (
	orderCommands = inventoryapp.Name + ".order.commands"
	orderDLQ      = orderCommands + ".dlq"
)

// InventoryModel is what the clients know they asked for.
type InventoryModel struct {
	mu sync.Mutex
	// StockSure is the stock each item (an aggregate id) got a 202 for;
	// StockMaybe what was sent and left unanswered when the run stopped.
	StockSure, StockMaybe map[string]int64
	// Orders are the orders (aggregate ids) placed with a 202.
	Orders map[string]bool
	// Again are the command ids of orders placed a second time with a new
	// key, which the order must reject (order_exists).
	Again []string
	// Ghosts are items (aggregate ids) orders were placed for that never
	// get stock.
	Ghosts map[string]bool

	// Poison are the invalid orders produced straight to Kafka: command
	// id -> order (aggregate id).
	Poison map[pipeline.ID]string

	Requests, Retries, Replays, Abandoned atomic.Int64
	// Produced counts orders produced straight to Kafka, Twice those
	// produced a second time with the same command id.
	Produced, Twice atomic.Int64
	// Errs are broken promises the clients saw (a retry with the same key
	// answered with another command, a valid request refused).
	Errs []string
}

func (m *InventoryModel) broken(f string, a ...any) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.Errs = append(m.Errs, fmt.Sprintf(f, a...))
}

func (m *InventoryModel) init() {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.StockSure == nil {
		m.StockSure, m.StockMaybe, m.Orders, m.Ghosts = map[string]int64{}, map[string]int64{}, map[string]bool{}, map[string]bool{}
		m.Poison = map[pipeline.ID]string{}
	}
}

// Run runs workers that each, until stop ends, add stock or place an
// order; an operation started before stop ends is finished (retried) until
// finish ends. Every item first gets stock.
func (l *InventoryLoad) Run(stop, finish context.Context, workers int) {
	l.M.init()
	var wg sync.WaitGroup
	for _, tn := range l.Tenants {
		for _, item := range tn.Items {
			wg.Add(1)
			go func() {
				defer wg.Done()
				l.addStock(finish, rand.New(rand.NewPCG(l.Seed, uint64(len(tn.Name)<<8+len(item)))), tn, item, 20)
			}()
		}
	}
	wg.Wait()
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(l.Seed, uint64(w)+1))
			for i := 0; stop.Err() == nil; i++ {
				tn := l.Tenants[rng.IntN(len(l.Tenants))]
				item := tn.Items[rng.IntN(len(tn.Items))]
				switch r := rng.IntN(100); {
				case r < 10:
					l.addStock(finish, rng, tn, item, int64(1+rng.IntN(5)))
				case r < 14:
					l.placeOrder(finish, rng, tn, fmt.Sprintf("ord-%d-%d", w, i), "ghost", 1)
				case r < 22 && l.Producer != nil:
					l.produceOrder(finish, rng, tn, fmt.Sprintf("ord-%d-%d", w, i), item, int64(1+rng.IntN(4)))
				case r < 24 && l.Producer != nil:
					l.produceOrder(finish, rng, tn, fmt.Sprintf("ord-%d-%d", w, i), item, 0) // poison
				default:
					l.placeOrder(finish, rng, tn, fmt.Sprintf("ord-%d-%d", w, i), item, int64(1+rng.IntN(4)))
				}
			}
		}()
	}
	wg.Wait()
}

func (l *InventoryLoad) client(rng *rand.Rand, tn InventoryTenant) inventoryapp.Client {
	urls := l.URLs()
	return inventoryapp.Client{Client: &apiclient.Client{BaseURL: urls[rng.IntN(len(urls))], APIKey: tn.Key, HTTP: l.HTTP}}
}

func (l *InventoryLoad) addStock(ctx context.Context, rng *rand.Rand, tn InventoryTenant, item string, q int64) {
	agg := pipeline.AggregateID(tn.Name, item)
	key := fmt.Sprintf("stock-%s-%x", item, rng.Uint64())
	_, ok := l.post(ctx, rng, key, func(c inventoryapp.Client, k string) (apiclient.Accepted, *apiclient.Response, error) {
		return c.AddStock(ctx, k, item, q)
	}, tn)
	l.M.mu.Lock()
	defer l.M.mu.Unlock()
	if ok {
		l.M.StockSure[agg] += q
	} else {
		l.M.StockMaybe[agg] += q
	}
}

func (l *InventoryLoad) placeOrder(ctx context.Context, rng *rand.Rand, tn InventoryTenant, order, item string, q int64) {
	post := func(c inventoryapp.Client, k string) (apiclient.Accepted, *apiclient.Response, error) {
		return c.PlaceOrder(ctx, k, order, item, q)
	}
	key := "place-" + order
	first, ok := l.post(ctx, rng, key, post, tn)
	if !ok {
		return
	}
	l.M.mu.Lock()
	l.M.Orders[pipeline.AggregateID(tn.Name, order)] = true
	if item == "ghost" {
		l.M.Ghosts[pipeline.AggregateID(tn.Name, item)] = true
	}
	l.M.mu.Unlock()
	switch r := rng.IntN(100); {
	case r < 15: // a retry with the same key: the same command
		if again, ok := l.post(ctx, rng, key, post, tn); ok && again != first {
			l.M.broken("retry of %s gave command %s, want %s", key, again, first)
		}
	case r < 22: // the same order again, a new key: the order refuses it
		if again, ok := l.post(ctx, rng, key+"-again", post, tn); ok {
			l.M.mu.Lock()
			l.M.Again = append(l.M.Again, again)
			l.M.mu.Unlock()
		}
	}
}

// produceOrder sends PlaceOrder straight to the order's commands topic
// until the broker acknowledges it (a resend after an unanswered attempt
// is the same command), and sometimes once more with the same id.
func (l *InventoryLoad) produceOrder(ctx context.Context, rng *rand.Rand, tn InventoryTenant, order, item string, q int64) {
	agg := pipeline.AggregateID(tn.Name, order)
	id := pipeline.NewCommandID()
	value, err := l.Encode(ctx, inventory.PlaceOrder{ItemID: item, Quantity: q})
	if err != nil {
		l.M.broken("encode an order: %v", err)
		return
	}
	rec := func() *kgo.Record {
		r, err := kafka.CommandRecord(orderCommands, agg, id, inventory.PlaceOrder{}.MessageType(), value, time.Time{}, "")
		if err != nil {
			panic(err) // the ids are ours; a bug
		}
		return r
	}
	for ctx.Err() == nil {
		pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		err := l.Producer.ProduceSync(pctx, rec()).FirstErr()
		cancel()
		if err == nil {
			break
		}
		time.Sleep(100 * time.Millisecond) // the broker is restarting
	}
	if ctx.Err() != nil {
		l.M.Abandoned.Add(1)
		return
	}
	l.M.Produced.Add(1)
	l.M.mu.Lock()
	if q == 0 {
		l.M.Poison[id] = agg
	} else {
		l.M.Orders[agg] = true
	}
	l.M.mu.Unlock()
	if rng.IntN(100) < 30 {
		pctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		if l.Producer.ProduceSync(pctx, rec()).FirstErr() == nil {
			l.M.Twice.Add(1)
		}
		cancel()
	}
}

// post sends until the server answers, retrying with the same key through
// timeouts, refused connections, 429s and 5xx, and returns the command id
// of a 202; false when ctx ended first (counted as abandoned).
func (l *InventoryLoad) post(ctx context.Context, rng *rand.Rand, key string, send func(inventoryapp.Client, string) (apiclient.Accepted, *apiclient.Response, error), tn InventoryTenant) (string, bool) {
	for attempt := 0; ctx.Err() == nil; attempt++ {
		if attempt > 0 {
			l.M.Retries.Add(1)
			time.Sleep(time.Duration(20+rng.IntN(80)) * time.Millisecond)
		}
		l.M.Requests.Add(1)
		acc, resp, err := send(l.client(rng, tn), key)
		if resp == nil || resp.Status >= 500 || resp.Status == http.StatusTooManyRequests {
			continue
		}
		if resp.Replayed() {
			l.M.Replays.Add(1)
		}
		if err != nil {
			l.M.broken("%s: HTTP %d: %v", key, resp.Status, err) // the workload sends valid requests only
			return "", false
		}
		return acc.CommandID, true
	}
	l.M.Abandoned.Add(1)
	return "", false
}

// InventoryState is the saga's outcome as the events topic tells it.
type InventoryState struct {
	Items  map[string]*ItemState // by aggregate id
	Orders map[string]*OrderState
	Events int
	// Reasons counts rejected orders by reason.
	Reasons map[string]int
	// Confirmed counts confirmed orders.
	Confirmed int
	// Failed counts the CommandFailed events of each command.
	Failed map[pipeline.ID]int
	// InDLQ counts the order commands in the DLQ.
	InDLQ int
}

// ItemState is one item folded from its events.
type ItemState struct {
	Added, Available, Reserved int64
	Reservations               map[string]int64 // order local id -> quantity
}

// OrderState is one order folded from its events.
type OrderState struct {
	Item     string // local id
	Quantity int64
	Status   string
	Reason   string
	Decided  int // OrderConfirmed and OrderRejected events
}

// CheckInventoryEvents reads the inventory's events topic read_committed
// and checks, returning what it found and every violation: no event id
// twice; each aggregate's versions run 1..n (a CommandRejected or
// CommandFailed at the current version); each item's available stock is
// never negative and available plus reserved is the stock added to it at
// every event; every order the workload placed is placed once and decided
// once (confirmed or rejected), and no other order exists; a confirmed
// order has its quantity reserved on its item, and every reservation is a
// confirmed order's; an order for an item that never had stock is rejected
// unknown_item.
func CheckInventoryEvents(ctx context.Context, cl *kgo.Client, decode func(context.Context, []byte) (any, error), m *InventoryModel) (*InventoryState, []string) {
	recs, err := kafka.ReadTopic(ctx, cl, inventoryapp.Name+".events", true)
	if err != nil {
		return nil, []string{fmt.Sprintf("read the events topic: %v", err)}
	}
	c := &inventoryCheck{m: m, seen: map[pipeline.ID]bool{}, versions: map[string]int64{},
		st: &InventoryState{Items: map[string]*ItemState{}, Orders: map[string]*OrderState{}, Reasons: map[string]int{}, Events: len(recs),
			Failed: map[pipeline.ID]int{}}}
	for _, r := range recs {
		c.event(ctx, r, decode)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	c.items()
	c.poison(ctx, cl)
	c.orders()
	return c.st, c.vs
}

// inventoryCheck is CheckInventoryEvents under way: what the events
// folded into, and the violations found.
type inventoryCheck struct {
	m        *InventoryModel
	st       *InventoryState
	vs       []string
	seen     map[pipeline.ID]bool
	versions map[string]int64
}

func (c *inventoryCheck) fail(f string, a ...any) { c.vs = append(c.vs, fmt.Sprintf(f, a...)) }

// event checks one record of the events topic and folds it.
func (c *inventoryCheck) event(ctx context.Context, r *kgo.Record, decode func(context.Context, []byte) (any, error)) {
	ev, err := kafka.EventOf(r)
	if err != nil {
		c.fail("event at %s/%d@%d: %v", r.Topic, r.Partition, r.Offset, err)
		return
	}
	if c.seen[ev.ID] {
		c.fail("event %s appears twice", ev.ID)
	}
	c.seen[ev.ID] = true
	payload, err := decode(ctx, r.Value)
	if err != nil {
		c.fail("event %s: %v", ev.ID, err)
		return
	}
	switch payload.(type) {
	case pipeline.CommandRejected, pipeline.CommandFailed:
		c.outcome(ev, payload)
		return
	}
	if ev.Version != c.versions[ev.AggregateID]+1 {
		c.fail("%s: version %d after %d", ev.AggregateID, ev.Version, c.versions[ev.AggregateID])
	}
	c.versions[ev.AggregateID] = ev.Version
	switch e := payload.(type) {
	case inventory.StockAdded, inventory.StockReserved:
		c.item(ev, e)
	case inventory.OrderPlaced, inventory.OrderConfirmed, inventory.OrderRejected:
		c.order(ev, e)
	default:
		c.fail("%s: unexpected event %T", ev.AggregateID, payload)
	}
}

// outcome checks a CommandRejected or CommandFailed: at the aggregate's
// current version, and a failure only for a poison the workload sent.
func (c *inventoryCheck) outcome(ev pipeline.Event, payload any) {
	if ev.Version != c.versions[ev.AggregateID] {
		c.fail("%s: %T at version %d, the aggregate is at %d", ev.AggregateID, payload, ev.Version, c.versions[ev.AggregateID])
	}
	f, ok := payload.(pipeline.CommandFailed)
	if !ok {
		return
	}
	c.m.mu.Lock()
	agg, poison := c.m.Poison[ev.CommandID]
	c.m.mu.Unlock()
	switch {
	case !poison || agg != ev.AggregateID:
		c.fail("%s: command %s failed (%s), and it was no poison the workload sent", ev.AggregateID, ev.CommandID, f.Reason)
	case f.Reason != "invalid-field":
		c.fail("%s: poison %s failed with %s, want invalid-field", ev.AggregateID, ev.CommandID, f.Reason)
	}
	c.st.Failed[ev.CommandID]++
}

// item folds an item's event: stock added, or reserved (never below
// zero available).
func (c *inventoryCheck) item(ev pipeline.Event, payload any) {
	it := c.st.Items[ev.AggregateID]
	if it == nil {
		it = &ItemState{Reservations: map[string]int64{}}
		c.st.Items[ev.AggregateID] = it
	}
	switch e := payload.(type) {
	case inventory.StockAdded:
		it.Added += e.Quantity
		it.Available += e.Quantity
	case inventory.StockReserved:
		it.Available -= e.Quantity
		it.Reserved += e.Quantity
		it.Reservations[e.OrderID] += e.Quantity
		if it.Available < 0 {
			c.fail("%s: available %d after reserving %d for %s", ev.AggregateID, it.Available, e.Quantity, e.OrderID)
		}
	}
}

// order folds an order's event: placed once, then decided.
func (c *inventoryCheck) order(ev pipeline.Event, payload any) {
	order := c.st.Orders[ev.AggregateID]
	if e, ok := payload.(inventory.OrderPlaced); ok {
		if order != nil {
			c.fail("%s placed twice", ev.AggregateID)
			return
		}
		c.st.Orders[ev.AggregateID] = &OrderState{Item: e.ItemID, Quantity: e.Quantity, Status: inventory.StatusPlaced}
		return
	}
	if order == nil {
		c.fail("%s decided before it was placed", ev.AggregateID)
		return
	}
	order.Decided++
	if conf, ok := payload.(inventory.OrderConfirmed); ok {
		order.Status = inventory.StatusConfirmed
		if conf.Quantity != order.Quantity || conf.ItemID != order.Item {
			c.fail("%s confirmed for %d of %s, ordered %d of %s", ev.AggregateID, conf.Quantity, conf.ItemID, order.Quantity, order.Item)
		}
	} else {
		order.Status, order.Reason = inventory.StatusRejected, payload.(inventory.OrderRejected).Reason
	}
}

// items checks each item's stock against what the clients had accepted,
// and its reservations against the confirmed orders.
func (c *inventoryCheck) items() {
	m, st := c.m, c.st
	for id, it := range st.Items {
		if it.Available+it.Reserved != it.Added {
			c.fail("%s: available %d + reserved %d != added %d", id, it.Available, it.Reserved, it.Added)
		}
		if it.Added < m.StockSure[id] || it.Added > m.StockSure[id]+m.StockMaybe[id] {
			c.fail("%s: %d units added, the clients had %d accepted and %d unanswered", id, it.Added, m.StockSure[id], m.StockMaybe[id])
		}
		tenant, _, _ := pipeline.SplitAggregateID(id)
		for order, q := range it.Reservations {
			o := st.Orders[pipeline.AggregateID(tenant, order)]
			if o == nil || o.Status != inventory.StatusConfirmed || o.Quantity != q {
				c.fail("%s reserved %d for %s, which is %+v", id, q, order, o)
			}
		}
	}
	for id, sure := range m.StockSure {
		if sure > 0 && st.Items[id] == nil {
			c.fail("%s: %d units accepted, none added", id, sure)
		}
	}
	for id := range m.Orders {
		if st.Orders[id] == nil {
			c.fail("order %s accepted and never placed", id)
		}
	}
}

// poison checks the poison records: not remembered as handled (a
// redrive after a fix must be decided, docs/processor.md), each copy the
// broker holds goes to the DLQ once and is recorded failed once, and the
// DLQ holds nothing else.
func (c *inventoryCheck) poison(ctx context.Context, cl *kgo.Client) {
	m, st := c.m, c.st
	commands, err := kafka.ReadTopic(ctx, cl, orderCommands, true)
	if err != nil {
		c.fail("read %s: %v", orderCommands, err)
	}
	copies := map[pipeline.ID]int{}
	for _, r := range commands {
		if id := commandID(r); m.Poison[id] != "" {
			copies[id]++
		}
	}
	for id, agg := range m.Poison {
		if st.Failed[id] != copies[id] || copies[id] == 0 {
			c.fail("poison %s on %s: %d records on %s, %d CommandFailed; want one for each", id, agg, copies[id], orderCommands, st.Failed[id])
		}
		if m.Orders[agg] {
			continue // the order was placed by another, valid command
		}
		if st.Orders[agg] != nil {
			c.fail("poison %s placed order %s", id, agg)
		}
	}
	dlq, err := kafka.ReadTopic(ctx, cl, orderDLQ, true)
	if err != nil {
		c.fail("read %s: %v", orderDLQ, err)
	}
	inDLQ := map[pipeline.ID]int{}
	for _, r := range dlq {
		id := commandID(r)
		inDLQ[id]++
		if _, ok := m.Poison[id]; !ok {
			c.fail("%s holds command %s of %s, which is no poison", orderDLQ, id, r.Key)
		}
	}
	st.InDLQ = len(dlq)
	for id := range m.Poison {
		if inDLQ[id] != copies[id] {
			c.fail("poison %s is in %s %d times, on %s %d times", id, orderDLQ, inDLQ[id], orderCommands, copies[id])
		}
	}
}

// orders checks that every order is the workload's, decided once, a
// confirmed one with its reservation and one for an item without stock
// rejected unknown_item.
func (c *inventoryCheck) orders() {
	m, st := c.m, c.st
	for id, o := range st.Orders {
		tenant, local, _ := pipeline.SplitAggregateID(id)
		if !m.Orders[id] {
			c.fail("order %s exists and the workload did not place it", id)
		}
		if o.Decided != 1 {
			c.fail("order %s decided %d times", id, o.Decided)
			continue
		}
		switch o.Status {
		case inventory.StatusConfirmed:
			st.Confirmed++
			if it := st.Items[pipeline.AggregateID(tenant, o.Item)]; it == nil || it.Reservations[local] != o.Quantity {
				c.fail("order %s confirmed without its reservation of %d on %s", id, o.Quantity, o.Item)
			}
		case inventory.StatusRejected:
			st.Reasons[o.Reason]++
			if m.Ghosts[pipeline.AggregateID(tenant, o.Item)] && o.Reason != inventory.ReasonUnknownItem {
				c.fail("order %s for %s, which has no stock, rejected %s", id, o.Item, o.Reason)
			}
		}
	}
}

// commandID is a command record's command-id, zero if it has none.
func commandID(r *kgo.Record) pipeline.ID {
	for _, h := range r.Headers {
		if h.Key == pipeline.HeaderCommandID {
			id, _ := pipeline.ParseID(string(h.Value))
			return id
		}
	}
	return pipeline.ID{}
}

// CheckInventoryReadModels checks the read models against the events
// topic's outcome: every item's available and reserved stock, every
// order's status and reason and reservation, and the orders placed again
// rejected as order_exists in command_status.
func CheckInventoryReadModels(ctx context.Context, pool *pgxpool.Pool, st *InventoryState, m *InventoryModel) []string {
	var vs []string
	fail := func(f string, a ...any) { vs = append(vs, fmt.Sprintf(f, a...)) }
	rows, err := pool.Query(ctx, `SELECT tenant || '/' || item_id, available, reserved FROM inventory_items`)
	if err != nil {
		return []string{err.Error()}
	}
	items := 0
	for rows.Next() {
		var id string
		var available, reserved int64
		if err := rows.Scan(&id, &available, &reserved); err != nil {
			return []string{err.Error()}
		}
		items++
		if it := st.Items[id]; it == nil || it.Available != available || it.Reserved != reserved {
			fail("inventory_items %s: available %d, reserved %d; the events say %+v", id, available, reserved, it)
		}
	}
	if items != len(st.Items) {
		fail("inventory_items has %d rows, the events %d items", items, len(st.Items))
	}
	rows, err = pool.Query(ctx, `SELECT o.tenant || '/' || o.order_id, o.status, o.reason, COALESCE(r.quantity, 0)
		FROM inventory_orders o LEFT JOIN inventory_reservations r ON r.tenant = o.tenant AND r.order_id = o.order_id AND r.item_id = o.item_id`)
	if err != nil {
		return []string{err.Error()}
	}
	orders := 0
	for rows.Next() {
		var id, status, reason string
		var reserved int64
		if err := rows.Scan(&id, &status, &reason, &reserved); err != nil {
			return []string{err.Error()}
		}
		orders++
		o := st.Orders[id]
		want := int64(0)
		if o != nil && o.Status == inventory.StatusConfirmed {
			want = o.Quantity
		}
		if o == nil || o.Status != status || o.Reason != reason || reserved != want {
			fail("inventory_orders %s: %s (%s), %d reserved; the events say %+v", id, status, reason, reserved, o)
		}
	}
	if orders != len(st.Orders) {
		fail("inventory_orders has %d rows, the events %d orders", orders, len(st.Orders))
	}
	m.mu.Lock()
	again := append([]string(nil), m.Again...)
	m.mu.Unlock()
	var wrong int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM command_status WHERE command_id = ANY($1::uuid[]) AND (status <> 'rejected' OR reason <> $2)`,
		again, inventory.ReasonOrderExists).Scan(&wrong); err != nil {
		fail("command_status: %v", err)
	} else if wrong > 0 {
		fail("%d of the %d orders placed again with a new key are not rejected %s", wrong, len(again), inventory.ReasonOrderExists)
	}
	return vs
}

// InventoryDecided reports, from the read models, how many of the orders
// the workload placed are still undecided: the drain condition.
func InventoryDecided(ctx context.Context, pool *pgxpool.Pool, m *InventoryModel) error {
	m.mu.Lock()
	n := len(m.Orders)
	m.mu.Unlock()
	var decided int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM inventory_orders WHERE status <> 'placed'`).Scan(&decided); err != nil {
		return err
	}
	if decided < n {
		return fmt.Errorf("%d of %d orders decided", decided, n)
	}
	m.mu.Lock()
	poison := make([]string, 0, len(m.Poison))
	for id := range m.Poison {
		poison = append(poison, id.String())
	}
	m.mu.Unlock()
	var failed int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM command_status WHERE command_id = ANY($1::uuid[]) AND status = 'failed'`, poison).Scan(&failed); err != nil {
		return err
	}
	if failed < len(poison) {
		return fmt.Errorf("%d of %d poison orders failed", failed, len(poison))
	}
	var outbox int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM outbox`).Scan(&outbox); err != nil {
		return err
	}
	if outbox > 0 {
		return fmt.Errorf("%d commands in the outbox", outbox)
	}
	return nil
}

// Summary formats the outcome for a test's log.
func (st *InventoryState) Summary() string {
	reasons := make([]string, 0, len(st.Reasons))
	for r, n := range st.Reasons {
		reasons = append(reasons, fmt.Sprintf("%s %d", r, n))
	}
	sort.Strings(reasons)
	return fmt.Sprintf("%d events, %d items, %d orders: %d confirmed, rejected %v; %d poison orders in the DLQ", st.Events, len(st.Items), len(st.Orders), st.Confirmed, reasons, st.InDLQ)
}
