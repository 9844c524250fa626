// Package verify is `onceflow verify` (docs/operations.md#verify): an
// exactly-once audit of a window of time. It joins what each stage
// recorded, by the identity each boundary keeps (docs/architecture.md,
// identity at each boundary): the accepted keys and command_status rows
// with the outbox, the commands topic (read_committed) and the DLQ, the
// events on the events topic by their deterministic ids, each projector's
// inbox rows against its offsets, and the jobs by their keys, and reports
// each command lost (accepted, never decided, with the stage it was last
// seen at), pending past a bound, or doubled (two applications of one
// event, one effect key run twice), with the ids.
//
// An event id at two offsets of the events topic is a duplicate record,
// reported apart from a doubled effect: every consumer of the topic
// applies an event by its id (the projectors' inbox, the NATS sink's
// Nats-Msg-Id, docs/consumers.md), so the copy changes nothing by itself;
// it says the processor's dedup let a decision through twice. A consumer
// that applied it twice is a doubled effect at that consumer.
//
// Cost and consistency. Postgres is read in one REPEATABLE READ READ
// ONLY transaction of plain SELECTs (nothing the pipeline writes is
// locked), first; then the processors' committed offsets; then the topics,
// each partition from the first record of the window to its end at the
// time of the read, read_committed, with the client's decompression
// budget (pipeline/kafka's hand-made reader). Everything a stage recorded
// before the snapshot is then on Kafka by the time it is read: the relay
// deletes an outbox row only after its Kafka transaction committed, the
// processor commits its offsets in the transaction of its events, and the
// projector its offsets with its inbox rows.
package verify

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"
)

// Stages a finding is at.
const (
	StageIngest    = "ingest"    // an accepted key without its command
	StageRelay     = "relay"     // the outbox to the commands topic
	StageProcessor = "processor" // the commands topic to the events topic
	StageEvents    = "events"    // the events topic itself
	StageProjector = "projector" // the events topic to a projector's inbox
	StageWorker    = "worker"    // jobs and webhook deliveries
)

// Kinds of finding. Lost and Doubled fail a verification; Pending and
// DuplicateRecord are reported.
const (
	Lost            = "lost"
	Doubled         = "doubled"
	Pending         = "pending"
	DuplicateRecord = "duplicate-record"
)

// CommandsTopic is an aggregate type's commands topic, its DLQ and the
// processor group that reads it.
type CommandsTopic struct {
	Topic string
	DLQ   string
	Group string
}

// EventsTopic is a domain's events topic and the projectors that apply it
// (their inbox rows and offsets in Postgres).
type EventsTopic struct {
	Topic      string
	Projectors []string
}

// Config is a verification.
type Config struct {
	// From and To bound the window: commands accepted and records written
	// at or after From and before To. To zero is now.
	From, To time.Time
	// Tenant, if set, checks only that tenant's commands and events.
	Tenant string
	// PendingBound is how long a command or event may wait at a stage
	// before it is reported pending. Default 5 minutes.
	PendingBound time.Duration
	// InboxRetention is how long the projectors' inbox keeps an event's
	// row (the relay's janitor drops its daily partitions after it).
	// Default 30 days.
	InboxRetention time.Duration
	Commands       []CommandsTopic
	Events         []EventsTopic
	// Unchecked names what the caller knows verify does not read (a sink
	// it has no reader of), said in the report.
	Unchecked []string
}

func (c *Config) validate() error {
	if c.From.IsZero() {
		return errors.New("verify: the window needs a start")
	}
	if c.To.IsZero() {
		c.To = time.Now()
	}
	if !c.To.After(c.From) {
		return fmt.Errorf("verify: the window's end %s is not after its start %s", c.To.Format(time.RFC3339), c.From.Format(time.RFC3339))
	}
	if c.PendingBound == 0 {
		c.PendingBound = 5 * time.Minute
	}
	if c.InboxRetention <= 0 {
		c.InboxRetention = 30 * 24 * time.Hour
	}
	if c.PendingBound < 0 {
		return fmt.Errorf("verify: pending bound %s: want a positive duration", c.PendingBound)
	}
	return nil
}

// Finding is one command, event or effect key found lost, pending or
// doubled at a stage.
type Finding struct {
	Stage       string `json:"stage"`
	Kind        string `json:"kind"`
	Tenant      string `json:"tenant,omitempty"`
	AggregateID string `json:"aggregate_id,omitempty"`
	CommandID   string `json:"command_id,omitempty"`
	EventID     string `json:"event_id,omitempty"`
	// Consumer is the projector, job kind or subscription the finding is
	// about, when it is about one.
	Consumer string `json:"consumer,omitempty"`
	// Key is the effect key of a job run twice.
	Key string `json:"key,omitempty"`
	// LastSeen is where it was last recorded (an outbox row, a topic's
	// partition and offset, a consumer's position).
	LastSeen string    `json:"last_seen"`
	Since    time.Time `json:"since"`
}

// Check is one thing a verification read, with how many.
type Check struct {
	What  string `json:"what"`
	Count int    `json:"count"`
}

// Report is a verification's result.
type Report struct {
	From         time.Time     `json:"from"`
	To           time.Time     `json:"to"`
	Tenant       string        `json:"tenant,omitempty"`
	PendingBound time.Duration `json:"pending_bound_ns"`
	StartedAt    time.Time     `json:"started_at"`
	Took         time.Duration `json:"took_ns"`
	Checked      []Check       `json:"checked"`
	// NotChecked says what could not be checked, and why (a topic whose
	// log starts inside the window, a sink verify cannot read).
	NotChecked []string  `json:"not_checked"`
	Findings   []Finding `json:"findings"`
}

// OK reports whether nothing was lost or doubled.
func (r *Report) OK() bool {
	for _, f := range r.Findings {
		if f.Kind == Lost || f.Kind == Doubled {
			return false
		}
	}
	return true
}

// Count returns the number of findings of kind.
func (r *Report) Count(kind string) int {
	n := 0
	for _, f := range r.Findings {
		if f.Kind == kind {
			n++
		}
	}
	return n
}

// Run verifies the window of cfg: Postgres through pool, Kafka through cl
// (a client made by kafka.Config, so its reads have the decompression
// budget).
func Run(ctx context.Context, cfg Config, pool *pgxpool.Pool, cl *kgo.Client) (*Report, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	v := &run{cfg: cfg, now: time.Now()}
	v.rep = &Report{From: cfg.From, To: cfg.To, Tenant: cfg.Tenant, PendingBound: cfg.PendingBound, StartedAt: v.now,
		Checked: []Check{}, NotChecked: append([]string{}, cfg.Unchecked...), Findings: []Finding{}}
	if err := v.readPostgres(ctx, pool); err != nil {
		return nil, fmt.Errorf("verify: %w", err)
	}
	if err := v.readKafka(ctx, cl); err != nil {
		return nil, fmt.Errorf("verify: %w", err)
	}
	undecided := v.undecided()
	if err := decided(ctx, pool, undecided); err != nil {
		return nil, fmt.Errorf("verify: %w", err)
	}
	v.join(undecided)
	sort.SliceStable(v.rep.Findings, func(i, j int) bool {
		a, b := v.rep.Findings[i], v.rep.Findings[j]
		if a.Stage != b.Stage {
			return stageOrder[a.Stage] < stageOrder[b.Stage]
		}
		return a.Since.Before(b.Since)
	})
	v.rep.Took = time.Since(v.now)
	return v.rep, nil
}

var stageOrder = map[string]int{StageIngest: 0, StageRelay: 1, StageProcessor: 2, StageEvents: 3, StageProjector: 4, StageWorker: 5}

// run is one verification's state: what each stage recorded.
type run struct {
	cfg Config
	now time.Time
	rep *Report

	// Postgres, from one snapshot.
	statuses    []status // pending
	statusCount int      // every command_status row of the window
	keys        []key    // without a command_status row
	keyCount    int
	outbox      map[cmdKey]row
	dead        map[cmdKey]row
	inbox       map[inboxKey]applied
	offsets     map[string]map[string]map[int32]int64 // consumer, topic, partition: next offset
	skips       []skip
	jobs        []Finding // effect keys run twice
	deliveries  []Finding // deliveries waiting past the bound

	// Kafka.
	commands    map[cmdKey]position
	inDLQ       map[cmdKey]bool
	events      map[string]event           // by event id
	decidedOn   map[cmdKey]bool            // commands with an event
	eventTopics map[string]int             // events topic: index in cfg.Events
	truncated   map[string]bool            // topics whose log starts inside the window
	processed   map[string]map[int32]int64 // commands topic, partition: the processor's committed offset
}

// cmdKey is a command's identity: its id within its aggregate.
type cmdKey struct{ aggregate, id string }

type status struct {
	cmdKey
	tenant, commandType, status string
	ingested                    bool
	createdAt                   time.Time
}

type key struct {
	tenant, key, commandID string
	createdAt              time.Time
}

type row struct {
	id        int64
	shard     int
	createdAt time.Time
}

type inboxKey struct{ consumer, eventID string }

type applied struct {
	count int
	first time.Time
}

type skip struct {
	consumer, topic string
	partition       int32
	from, to        int64
}

type position struct {
	topic     string
	partition int32
	offset    int64
	time      time.Time
}

func (p position) String() string {
	return fmt.Sprintf("%s partition %d offset %d", p.topic, p.partition, p.offset)
}

type event struct {
	tenant, aggregate, commandID string
	first                        position
	more                         []position // the offsets of its copies, in the order read
}
