package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
	"github.com/ThreeDotsLabs/watermill/components/forwarder"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
)

// schemaSQL is the peer's own tables (Watermill's outbox table and
// offsets are its subscriber's).
const schemaSQL = `
CREATE TABLE IF NOT EXISTS wm_idempotency (tenant text NOT NULL, key text NOT NULL, command_id text NOT NULL,
	created_at timestamptz NOT NULL DEFAULT now(), PRIMARY KEY (tenant, key));
CREATE TABLE IF NOT EXISTS wm_command_status (tenant text NOT NULL, command_id text NOT NULL, status text NOT NULL,
	reason text NOT NULL DEFAULT '', PRIMARY KEY (tenant, command_id));
CREATE TABLE IF NOT EXISTS wm_account_state (tenant text NOT NULL, account_id text NOT NULL, currency text NOT NULL,
	balance bigint NOT NULL, PRIMARY KEY (tenant, account_id));
CREATE TABLE IF NOT EXISTS wm_processed (tenant text NOT NULL, command_id text NOT NULL, event bytea NOT NULL,
	PRIMARY KEY (tenant, command_id));
CREATE TABLE IF NOT EXISTS wm_accounts (tenant text NOT NULL, account_id text NOT NULL, currency text NOT NULL,
	balance bigint NOT NULL, version bigint NOT NULL, PRIMARY KEY (tenant, account_id));
CREATE TABLE IF NOT EXISTS wm_projected (event_id text PRIMARY KEY);
`

// command is what ingest puts in the outbox.
type command struct {
	CommandID string `json:"command_id"`
	Tenant    string `json:"tenant"`
	Type      string `json:"type"` // open, deposit
	AccountID string `json:"account_id"`
	Currency  string `json:"currency,omitempty"`
	Amount    int64  `json:"amount,omitempty"`
}

// event is the processor's decision.
type event struct {
	EventID   string `json:"event_id"`
	CommandID string `json:"command_id"`
	Tenant    string `json:"tenant"`
	Type      string `json:"type"` // opened, deposited, rejected
	AccountID string `json:"account_id"`
	Currency  string `json:"currency,omitempty"`
	Amount    int64  `json:"amount,omitempty"`
	Reason    string `json:"reason,omitempty"`
}

func problem(w http.ResponseWriter, status int, detail string) {
	w.Header().Set("Content-Type", "application/problem+json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(map[string]any{"title": http.StatusText(status), "status": status, "detail": detail})
}

// tenant is the bearer token: the peer authenticates nobody.
func tenant(r *http.Request) string {
	t, _ := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	return t
}

func (p *peer) openAccount(w http.ResponseWriter, r *http.Request) {
	var body struct {
		AccountID string `json:"account_id"`
		Currency  string `json:"currency"`
	}
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 4096)).Decode(&body); err != nil || body.AccountID == "" || len(body.Currency) != 3 {
		problem(w, http.StatusUnprocessableEntity, "want account_id and a currency")
		return
	}
	p.accept(w, r, command{Type: "open", AccountID: body.AccountID, Currency: body.Currency})
}

func (p *peer) deposit(w http.ResponseWriter, r *http.Request) {
	var body struct {
		Amount int64 `json:"amount"`
	}
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 4096)).Decode(&body); err != nil || body.Amount <= 0 {
		problem(w, http.StatusUnprocessableEntity, "want a positive whole amount")
		return
	}
	p.accept(w, r, command{Type: "deposit", AccountID: r.PathValue("id"), Amount: body.Amount})
}

// accept writes the Idempotency-Key, the pending status and the command in
// the outbox in one transaction, and answers 202 with the command's id (the
// first one's, for a key sent again).
func (p *peer) accept(w http.ResponseWriter, r *http.Request, c command) {
	c.Tenant = tenant(r)
	key := r.Header.Get("Idempotency-Key")
	if c.Tenant == "" || key == "" {
		problem(w, http.StatusBadRequest, "want a bearer token and an Idempotency-Key")
		return
	}
	c.CommandID = watermill.NewUUID()
	id, err := p.acceptTx(r.Context(), c, key)
	if err != nil {
		slog.Warn("accept", "err", err)
		problem(w, http.StatusServiceUnavailable, "could not accept the command; retry")
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Location", "/v1/commands/"+id)
	w.WriteHeader(http.StatusAccepted)
	fmt.Fprintf(w, `{"command_id":%q,"status":"pending"}`, id)
}

func (p *peer) acceptTx(ctx context.Context, c command, key string) (string, error) {
	tx, err := p.pool.Begin(ctx)
	if err != nil {
		return "", err
	}
	defer tx.Rollback(context.Background())
	var id string
	// A concurrent request with the same key waits for the first one's
	// commit and gets its id.
	if err := tx.QueryRow(ctx, `INSERT INTO wm_idempotency (tenant, key, command_id) VALUES ($1, $2, $3)
		ON CONFLICT (tenant, key) DO UPDATE SET key = EXCLUDED.key RETURNING command_id`, c.Tenant, key, c.CommandID).Scan(&id); err != nil {
		return "", fmt.Errorf("idempotency key: %w", err)
	}
	if id != c.CommandID {
		return id, tx.Commit(ctx)
	}
	if _, err := tx.Exec(ctx, `INSERT INTO wm_command_status (tenant, command_id, status) VALUES ($1, $2, 'pending')`, c.Tenant, c.CommandID); err != nil {
		return "", fmt.Errorf("status: %w", err)
	}
	payload, err := json.Marshal(c)
	if err != nil {
		return "", err
	}
	// Watermill's outbox: its SQL publisher on this transaction, the
	// message enveloped for the forwarder, which publishes it to the
	// commands topic.
	pub, err := wsql.NewPublisher(wsql.TxFromPgx(tx), wsql.PublisherConfig{SchemaAdapter: p.schema}, p.logger)
	if err != nil {
		return "", err
	}
	msg := message.NewMessage(c.CommandID, payload)
	msg.Metadata.Set("key", c.Tenant+"/"+c.AccountID)
	if err := forwarder.NewPublisher(pub, forwarder.PublisherConfig{ForwarderTopic: forwarderTopic}).Publish(p.topics.commands, msg); err != nil {
		return "", fmt.Errorf("outbox: %w", err)
	}
	return id, tx.Commit(ctx)
}

// process decides one command: dedup, state and decision in one
// transaction, then the event to Kafka. A command seen before publishes
// the event stored with it again.
func (p *peer) process(msg *message.Message) error {
	var c command
	if err := json.Unmarshal(msg.Payload, &c); err != nil {
		slog.Warn("process: undecodable command, dropped", "uuid", msg.UUID, "err", err)
		return nil
	}
	ctx := msg.Context()
	b, err := p.decide(ctx, c)
	if err != nil {
		return err
	}
	out := message.NewMessage(c.CommandID+"-0", b)
	out.Metadata.Set("key", c.Tenant+"/"+c.AccountID)
	return p.events.Publish(p.topics.events, out)
}

func (p *peer) decide(ctx context.Context, c command) ([]byte, error) {
	tx, err := p.pool.Begin(ctx)
	if err != nil {
		return nil, err
	}
	defer tx.Rollback(context.Background())
	var stored []byte
	err = tx.QueryRow(ctx, `SELECT event FROM wm_processed WHERE tenant = $1 AND command_id = $2`, c.Tenant, c.CommandID).Scan(&stored)
	if err == nil {
		return stored, nil
	}
	if !errors.Is(err, pgx.ErrNoRows) {
		return nil, err
	}
	ev := event{EventID: c.CommandID + "-0", CommandID: c.CommandID, Tenant: c.Tenant, AccountID: c.AccountID, Amount: c.Amount}
	switch c.Type {
	case "open":
		tag, err := tx.Exec(ctx, `INSERT INTO wm_account_state (tenant, account_id, currency, balance) VALUES ($1, $2, $3, 0)
			ON CONFLICT DO NOTHING`, c.Tenant, c.AccountID, c.Currency)
		if err != nil {
			return nil, err
		}
		ev.Type, ev.Currency = "opened", c.Currency
		if tag.RowsAffected() == 0 {
			ev.Type, ev.Reason = "rejected", "account_exists"
		}
	case "deposit":
		tag, err := tx.Exec(ctx, `UPDATE wm_account_state SET balance = balance + $3 WHERE tenant = $1 AND account_id = $2`,
			c.Tenant, c.AccountID, c.Amount)
		if err != nil {
			return nil, err
		}
		ev.Type = "deposited"
		if tag.RowsAffected() == 0 {
			ev.Type, ev.Reason = "rejected", "unknown_account"
		}
	default:
		ev.Type, ev.Reason = "rejected", "unknown_command"
	}
	b, err := json.Marshal(ev)
	if err != nil {
		return nil, err
	}
	if _, err := tx.Exec(ctx, `INSERT INTO wm_processed (tenant, command_id, event) VALUES ($1, $2, $3)`, c.Tenant, c.CommandID, b); err != nil {
		return nil, err
	}
	return b, tx.Commit(ctx)
}

// project applies one event to the read models once (dedup on its id),
// then wakes the requests waiting for its command.
func (p *peer) project(msg *message.Message) error {
	var ev event
	if err := json.Unmarshal(msg.Payload, &ev); err != nil {
		slog.Warn("project: undecodable event, dropped", "uuid", msg.UUID, "err", err)
		return nil
	}
	ctx := msg.Context()
	if err := p.projectTx(ctx, ev); err != nil {
		return err
	}
	p.waiters.wake(ev.Tenant + "/" + ev.CommandID)
	return nil
}

func (p *peer) projectTx(ctx context.Context, ev event) error {
	tx, err := p.pool.Begin(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback(context.Background())
	tag, err := tx.Exec(ctx, `INSERT INTO wm_projected (event_id) VALUES ($1) ON CONFLICT DO NOTHING`, ev.EventID)
	if err != nil {
		return err
	}
	if tag.RowsAffected() == 0 {
		return nil // applied before
	}
	status := "accepted"
	switch ev.Type {
	case "opened":
		_, err = tx.Exec(ctx, `INSERT INTO wm_accounts (tenant, account_id, currency, balance, version) VALUES ($1, $2, $3, 0, 1)
			ON CONFLICT DO NOTHING`, ev.Tenant, ev.AccountID, ev.Currency)
	case "deposited":
		_, err = tx.Exec(ctx, `UPDATE wm_accounts SET balance = balance + $3, version = version + 1 WHERE tenant = $1 AND account_id = $2`,
			ev.Tenant, ev.AccountID, ev.Amount)
	default:
		status = "rejected"
	}
	if err != nil {
		return err
	}
	if _, err := tx.Exec(ctx, `UPDATE wm_command_status SET status = $3, reason = $4 WHERE tenant = $1 AND command_id = $2`,
		ev.Tenant, ev.CommandID, status, ev.Reason); err != nil {
		return err
	}
	return tx.Commit(ctx)
}

// command answers a command's status, held with ?wait= until it is
// terminal: the projector, in this process, wakes the waiters of a command
// after its commit.
func (p *peer) command(w http.ResponseWriter, r *http.Request) {
	t, id := tenant(r), r.PathValue("id")
	var wait time.Duration
	if s := r.URL.Query().Get("wait"); s != "" {
		d, err := time.ParseDuration(s)
		if err != nil {
			n, err2 := strconv.Atoi(s)
			if err2 != nil {
				problem(w, http.StatusUnprocessableEntity, "wait: want a duration")
				return
			}
			d = time.Duration(n) * time.Second
		}
		wait = min(d, 30*time.Second)
	}
	var woken <-chan struct{}
	if wait > 0 {
		var cancel func()
		woken, cancel = p.waiters.add(t + "/" + id)
		defer cancel()
	}
	deadline := time.NewTimer(wait)
	defer deadline.Stop()
	expired := wait == 0
	for {
		var status, reason string
		err := p.pool.QueryRow(r.Context(), `SELECT status, reason FROM wm_command_status WHERE tenant = $1 AND command_id = $2`, t, id).Scan(&status, &reason)
		if errors.Is(err, pgx.ErrNoRows) {
			problem(w, http.StatusNotFound, "no such command")
			return
		}
		if err != nil {
			problem(w, http.StatusServiceUnavailable, "could not read the command")
			return
		}
		if status == "pending" && !expired {
			select {
			case <-woken:
				woken = nil
			case <-deadline.C:
				expired = true // read once more, then answer
			case <-r.Context().Done():
				return
			}
			continue
		}
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(map[string]string{"command_id": id, "status": status, "reason": reason})
		return
	}
}

// waiters are the requests waiting for a command's outcome, by
// tenant/command id.
type waiters struct {
	mu sync.Mutex
	m  map[string][]chan struct{}
}

func newWaiters() *waiters { return &waiters{m: map[string][]chan struct{}{}} }

func (ws *waiters) add(key string) (<-chan struct{}, func()) {
	ch := make(chan struct{})
	ws.mu.Lock()
	ws.m[key] = append(ws.m[key], ch)
	ws.mu.Unlock()
	return ch, func() {
		ws.mu.Lock()
		defer ws.mu.Unlock()
		list := ws.m[key]
		for i, c := range list {
			if c == ch {
				list = append(list[:i], list[i+1:]...)
				break
			}
		}
		if len(list) == 0 {
			delete(ws.m, key)
		} else {
			ws.m[key] = list
		}
	}
}

func (ws *waiters) wake(key string) {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	for _, c := range ws.m[key] {
		close(c)
	}
	delete(ws.m, key)
}
