package reconcile

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sort"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"

	"github.com/onceflow/onceflow/pipeline"
	"github.com/onceflow/onceflow/pipeline/kafka"
	"github.com/onceflow/onceflow/pipeline/postgres"
	"github.com/onceflow/onceflow/pipeline/processor"
)

// The kinds of finding (see the package doc).
const (
	KindPending    = "pending"
	KindOutboxDead = "outbox-dead"
	KindDLQ        = "dlq"
	KindInbound    = "inbound"
	KindJob        = "job"
)

// Kinds lists every kind, in the order a report shows them.
var Kinds = []string{KindPending, KindOutboxDead, KindDLQ, KindInbound, KindJob}

// Action is what a Verdict asks for.
type Action string

const (
	// Leave leaves the finding for an operator: it is reported.
	Leave Action = "report"
	// Resend sends the same command again, under its command id: the
	// outbox-dead row or the DLQ record as it was.
	Resend Action = "resend"
	// Command sends a correcting command (Verdict.CommandType and Fields).
	Command Action = "command"
)

// Finding is one stuck or ambiguous thing, and what became of it.
type Finding struct {
	Kind        string    `json:"kind"`
	Subject     string    `json:"subject"` // unique within Kind: a command id, an outbox id, topic/partition:offset, provider/event id
	Tenant      string    `json:"tenant"`
	AggregateID string    `json:"aggregate_id"`
	CommandID   string    `json:"command_id,omitempty"`
	CommandType string    `json:"command_type,omitempty"`
	Key         string    `json:"key,omitempty"` // the Idempotency-Key, or provider/event id: what the authority knows it by
	Since       time.Time `json:"since"`
	Detail      string    `json:"detail"`

	// What the reconciler did.
	Action       Action `json:"action"`
	Reason       string `json:"reason,omitempty"`
	CorrectionID string `json:"correction_id,omitempty"` // the command sent
	Error        string `json:"error,omitempty"`

	record *record // what Resend sends, when the finding keeps its command
	jobID  *int64  // the River job of a job finding
}

// record is a command as the outbox holds it.
type record struct {
	topic      string
	key, value []byte
	headers    map[string]string
	deadID     *int64 // the outbox_dead row it came from
}

// Verdict is an Authority's answer about one finding.
type Verdict struct {
	Action Action
	// Reason is the authority's word, kept in the audit log ("provider
	// says the payment succeeded").
	Reason string
	// CommandType and Fields (a JSON object of the command's fields, as
	// its HTTP route takes them) are the correcting command of Action
	// Command, for LocalID (default: the finding's aggregate) of the
	// finding's tenant.
	CommandType string
	Fields      json.RawMessage
	LocalID     string
}

// Authority is the pluggable status check of a kind: the service that
// knows what really happened to the operation under f.Key.
type Authority interface {
	Check(ctx context.Context, f Finding) (Verdict, error)
}

// AuthorityFunc is a function as an Authority.
type AuthorityFunc func(ctx context.Context, f Finding) (Verdict, error)

// Check calls fn.
func (fn AuthorityFunc) Check(ctx context.Context, f Finding) (Verdict, error) { return fn(ctx, f) }

// Encoder validates and encodes a correcting command as its HTTP route
// would, returning its commands topic and record value.
type Encoder func(ctx context.Context, commandType, localID string, fields json.RawMessage) (topic string, value []byte, err error)

// DeadLetter is one DLQ record and the topic it was read from.
type DeadLetter struct {
	Topic string
	processor.DeadLetter
	// CommandsTopic is where a resent copy goes.
	CommandsTopic string
}

// Config configures a Reconciler. Zero values mean the defaults.
type Config struct {
	// MaxPendingAge is how long a command may be pending before it is a
	// finding. Default 15m.
	MaxPendingAge time.Duration
	// Authorities are the status checks, by kind. A kind without one is
	// reported only.
	Authorities map[string]Authority
	// Encode makes the correcting commands; without it a Command verdict
	// is an error of its finding.
	Encode Encoder
	// DeadLetters reads the DLQ topics; nil: no dlq findings.
	DeadLetters func(ctx context.Context) ([]DeadLetter, error)
	// Shards is the outbox's shard count (ONCEFLOW_OUTBOX_SHARDS). Default
	// pipeline.DefaultOutboxShards.
	Shards int
	// DryRun asks the authorities and reports their verdicts, and
	// corrects nothing.
	DryRun bool
	// Interval is how often Run reconciles (ONCEFLOW_RECONCILE_INTERVAL).
	// Default 5m.
	Interval time.Duration
}

func (c *Config) setDefaults() {
	c.MaxPendingAge = cmp.Or(c.MaxPendingAge, 15*time.Minute)
	c.Shards = cmp.Or(c.Shards, pipeline.DefaultOutboxShards)
	c.Interval = cmp.Or(c.Interval, 5*time.Minute)
}

func (c *Config) validate() error {
	if c.MaxPendingAge < 0 || c.Interval < 0 {
		return errors.New("reconcile: MaxPendingAge and Interval must not be negative")
	}
	if err := pipeline.CheckOutboxShards(c.Shards); err != nil {
		return fmt.Errorf("reconcile: %w", err)
	}
	for k := range c.Authorities {
		if !isKind(k) {
			return fmt.Errorf("reconcile: an authority for %q, which is no kind (%v)", k, Kinds)
		}
	}
	return nil
}

func isKind(k string) bool {
	for _, x := range Kinds {
		if x == k {
			return true
		}
	}
	return false
}

// Reconciler finds and corrects.
type Reconciler struct {
	cfg     Config
	pool    *pgxpool.Pool
	logger  *slog.Logger
	metrics *metrics
}

// New returns a reconciler on pool; reg, if not nil, receives its metrics
// (the findings of the last run by kind, the corrections made).
func New(cfg Config, pool *pgxpool.Pool, logger *slog.Logger, reg prometheus.Registerer) (*Reconciler, error) {
	cfg.setDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	return &Reconciler{cfg: cfg, pool: pool, logger: logger.With("component", "reconcile"), metrics: newMetrics(reg)}, nil
}

// Report is one run's findings and what became of them.
type Report struct {
	At        time.Time `json:"at"`
	Findings  []Finding `json:"findings"`
	Corrected int       `json:"corrected"`
	Reported  int       `json:"reported"`
	Failed    int       `json:"failed"`
}

// Reconcile finds, asks and corrects once. An error is one that stopped
// the run (the database); an authority's or a correction's error is its
// finding's (Finding.Error, Report.Failed).
func (r *Reconciler) Reconcile(ctx context.Context) (Report, error) {
	rep := Report{At: time.Now().UTC()}
	found, err := r.find(ctx)
	if err != nil {
		return rep, err
	}
	for i := range found {
		f := &found[i]
		r.settle(ctx, f)
		switch {
		case f.Error != "":
			rep.Failed++
		case f.Action == Leave || r.cfg.DryRun:
			rep.Reported++
		default:
			rep.Corrected++
		}
	}
	rep.Findings = found
	if rep.Findings == nil {
		rep.Findings = []Finding{}
	}
	byKind := map[string]int{}
	for _, f := range found {
		byKind[f.Kind]++
		if f.CorrectionID != "" {
			r.metrics.corrections.WithLabelValues(f.Kind, string(f.Action)).Inc()
		}
	}
	for _, k := range Kinds {
		r.metrics.findings.WithLabelValues(k).Set(float64(byKind[k]))
	}
	r.metrics.lastRun.SetToCurrentTime()
	return rep, nil
}

// settle asks f's authority and applies its verdict.
func (r *Reconciler) settle(ctx context.Context, f *Finding) {
	f.Action = Leave
	a := r.cfg.Authorities[f.Kind]
	if a == nil {
		f.Reason = "no authority for this kind: left for an operator"
		return
	}
	v, err := a.Check(ctx, *f)
	if err != nil {
		f.Error = "authority: " + err.Error()
		return
	}
	f.Action, f.Reason = v.Action, v.Reason
	if f.Action == "" {
		f.Action = Leave
	}
	if f.Action == Leave || r.cfg.DryRun {
		return
	}
	id, err := r.correct(ctx, f, v)
	if errors.Is(err, ErrCorrected) {
		f.Action, f.Reason = Leave, "corrected meanwhile by another reconciler"
		return
	}
	if err != nil {
		f.Error = err.Error()
		r.logger.Warn("correction failed", "kind", f.Kind, "subject", f.Subject, "err", err)
		return
	}
	f.CorrectionID = id
	r.logger.Info("corrected", "kind", f.Kind, "subject", f.Subject, "action", string(f.Action), "command_id", id)
}

// correctionNamespace is the UUIDv5 namespace of correcting commands'
// ids and of their audit rows: derived from (kind, subject), so a
// correction retried after a crash is the same command.
var correctionNamespace = pipeline.MustParseID("6f6e6365-666c-4f77-8072-65636f6e6369")

const (
	claimSQL = `INSERT INTO reconcile_corrections (kind, subject, action, tenant, aggregate_id, command_id, key, reason)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8) ON CONFLICT (kind, subject) DO NOTHING`
	outboxSQL = `INSERT INTO outbox (shard, topic, key, value, headers) VALUES ($1, $2, $3, $4, $5::jsonb)`
	statusSQL = `INSERT INTO command_status (command_id, tenant, aggregate_id, command_type, status, ingested)
		VALUES ($1, $2, $3, $4, 'pending', true) ON CONFLICT DO NOTHING`
	deadSQL          = `DELETE FROM outbox_dead WHERE id = $1`
	resetDeliverySQL = `UPDATE webhook_deliveries SET status = 'pending', updated_at = now() WHERE job_id = $1`
	auditSQL         = `INSERT INTO audit_log (event_id, tenant, aggregate_id, version, event_type, command_id, payload, occurred_at)
		VALUES ($1, $2, $3, 0, 'onceflow.Reconciled', $4, $5::jsonb, now()) ON CONFLICT (event_id) DO NOTHING`
)

// ErrCorrected is a correction's error when another reconciler corrected
// the same finding first.
var ErrCorrected = errors.New("already corrected")

// correct applies a Resend or Command verdict in one transaction and
// returns the command id sent (a job's resend: the job's key).
func (r *Reconciler) correct(ctx context.Context, f *Finding, v Verdict) (string, error) {
	var rec *record
	var commandID pipeline.ID
	var commandType, sent string
	tenant, aggregate := f.Tenant, f.AggregateID
	switch {
	case v.Action == Resend && f.jobID != nil:
		// A job's resend is River's retry of it: the call goes out again
		// under the same Idempotency-Key, which the receiver applies once.
		sent = f.Key
	case v.Action == Resend:
		if f.record == nil {
			return "", fmt.Errorf("resend: a %s finding keeps no command to send again", f.Kind)
		}
		rec = f.record
		id, err := pipeline.ParseID(rec.headers[pipeline.HeaderCommandID])
		if err != nil {
			return "", fmt.Errorf("resend: the record's command-id: %w", err)
		}
		commandID, aggregate = id, string(rec.key)
		if tenant, _, err = pipeline.SplitAggregateID(aggregate); err != nil {
			return "", fmt.Errorf("the command's key: %w", err)
		}
	case v.Action == Command:
		if r.cfg.Encode == nil {
			return "", errors.New("command: no encoder configured")
		}
		t, local, err := pipeline.SplitAggregateID(f.AggregateID)
		if err != nil {
			return "", fmt.Errorf("command: the finding has no aggregate to correct: %w", err)
		}
		if v.LocalID != "" {
			local = v.LocalID
		}
		topic, value, err := r.cfg.Encode(ctx, v.CommandType, local, v.Fields)
		if err != nil {
			return "", fmt.Errorf("command %s: %w", v.CommandType, err)
		}
		commandID = pipeline.NameID(correctionNamespace, []byte(f.Kind+"\x00"+f.Subject))
		commandType, tenant, aggregate = v.CommandType, t, pipeline.AggregateID(t, local)
		headers := map[string]string{}
		for _, h := range kafka.CommandHeaders(commandID, tenant, commandType, "") {
			headers[h.Key] = string(h.Value)
		}
		rec = &record{topic: topic, key: []byte(aggregate), value: value, headers: headers}
	default:
		return "", fmt.Errorf("the authority answered action %q; want report, resend or command", v.Action)
	}
	if rec != nil {
		sent = commandID.String()
	}
	audit, _ := json.Marshal(map[string]string{
		"kind": f.Kind, "subject": f.Subject, "action": string(v.Action), "reason": v.Reason,
		"key": f.Key, "stuck_command_id": f.CommandID, "detail": f.Detail, "command_type": commandType,
	})
	// A job's resend records the job's command (or none) as the command.
	recorded := commandID
	if rec == nil {
		recorded, _ = pipeline.ParseID(f.CommandID)
	}
	err := pgx.BeginFunc(ctx, r.pool, func(tx pgx.Tx) error {
		tag, err := tx.Exec(ctx, claimSQL, f.Kind, f.Subject, string(v.Action), tenant, aggregate, recorded.String(), nullable(f.Key), v.Reason)
		if err != nil {
			return fmt.Errorf("record the correction: %w", err)
		}
		if tag.RowsAffected() == 0 {
			return ErrCorrected
		}
		if rec != nil {
			hj, _ := json.Marshal(rec.headers)
			shard := pipeline.OutboxShard(aggregate, r.cfg.Shards)
			if _, err := tx.Exec(ctx, outboxSQL, shard, rec.topic, rec.key, rec.value, string(hj)); err != nil {
				return fmt.Errorf("enqueue the correction: %w", err)
			}
			if _, err := tx.Exec(ctx, "SELECT pg_notify($1, '')", postgres.OutboxChannel); err != nil {
				return err
			}
		}
		if v.Action == Command {
			if _, err := tx.Exec(ctx, statusSQL, commandID.String(), tenant, aggregate, commandType); err != nil {
				return fmt.Errorf("the correction's status: %w", err)
			}
		}
		if rec != nil && rec.deadID != nil {
			if _, err := tx.Exec(ctx, deadSQL, *rec.deadID); err != nil {
				return fmt.Errorf("remove the outbox_dead row: %w", err)
			}
		}
		if rec == nil {
			if err := r.retryJob(ctx, tx, *f.jobID); err != nil {
				return err
			}
		}
		auditID := pipeline.NameID(correctionNamespace, []byte("audit\x00"+f.Kind+"\x00"+f.Subject))
		if _, err := tx.Exec(ctx, auditSQL, auditID.String(), tenant, aggregate, recorded.String(), string(audit)); err != nil {
			return fmt.Errorf("audit the correction: %w", err)
		}
		return nil
	})
	if err != nil {
		return "", err
	}
	return sent, nil
}

// retryJob makes a discarded job available again (River's JobRetry) and,
// for a webhook delivery, puts its delivery back to pending, as
// `onceflow webhooks redeliver` does.
func (r *Reconciler) retryJob(ctx context.Context, tx pgx.Tx, id int64) error {
	if _, err := tx.Exec(ctx, resetDeliverySQL, id); err != nil {
		return fmt.Errorf("reset the job's delivery: %w", err)
	}
	client, err := river.NewClient(riverpgxv5.New(r.pool), &river.Config{})
	if err != nil {
		return err
	}
	if _, err := client.JobRetryTx(ctx, tx, id); err != nil {
		return fmt.Errorf("retry job %d: %w", id, err)
	}
	return nil
}

func nullable(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

// Run reconciles every Interval until ctx ends, logging each run's
// findings. It returns nil when ctx ends.
func (r *Reconciler) Run(ctx context.Context) error {
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(r.cfg.Interval/2 + rand.N(r.cfg.Interval)): // #nosec G404 -- a sleep's jitter
		}
		rep, err := r.Reconcile(ctx)
		switch {
		case ctx.Err() != nil:
			return nil
		case err != nil:
			r.logger.Warn("reconcile run failed", "err", err)
		case len(rep.Findings) > 0:
			r.logger.Warn("reconcile found stuck work", "findings", len(rep.Findings), "corrected", rep.Corrected,
				"reported", rep.Reported, "failed", rep.Failed)
		}
	}
}

// sortFindings orders findings by kind (Kinds' order), then age.
func sortFindings(fs []Finding) {
	rank := map[string]int{}
	for i, k := range Kinds {
		rank[k] = i
	}
	sort.SliceStable(fs, func(i, j int) bool {
		if fs[i].Kind != fs[j].Kind {
			return rank[fs[i].Kind] < rank[fs[j].Kind]
		}
		return fs[i].Since.Before(fs[j].Since)
	})
}
