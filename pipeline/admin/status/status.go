package status

import "time"

// Status is what /status.json answers and the page shows. Figures from
// the registry carry the metric they come from.
type Status struct {
	At         time.Time `json:"at"`
	Components []string  `json:"components"`
	Sampling   Sampling  `json:"sampling"`
	// ActionsEnabled: the process has an operator token, so unpark and
	// redrive answer those who send it (ONCEFLOW_ADMIN_TOKEN).
	ActionsEnabled bool          `json:"actions_enabled"`
	Flow           []StageStatus `json:"flow"`
	Outbox         *Outbox       `json:"outbox"` // nil: the process exports no outbox gauges (it runs no relay)
	Lag            Lag           `json:"lag"`
	DLQ            DLQ           `json:"dlq"`
	Parked         Parked        `json:"parked"`
	Verify         *Verify       `json:"verify"` // nil: no verification recorded, or no database in the process
	// History holds the samples of the last History, oldest first, and
	// the reading of this answer last.
	History History `json:"history"`
	// Unavailable names what could not be read this time; why is in the
	// process's log.
	Unavailable []string `json:"unavailable,omitempty"`
}

// Sampling is how the page's history and rates are taken.
type Sampling struct {
	IntervalSeconds float64 `json:"interval_seconds"`
	WindowSeconds   float64 `json:"window_seconds"`
	HistorySeconds  float64 `json:"history_seconds"`
	// WindowTakenSeconds is how far back the earlier reading of the rates
	// and quantiles is: less than the window while the process is young.
	WindowTakenSeconds float64 `json:"window_taken_seconds"`
}

// StageStatus is one stage of the flow.
type StageStatus struct {
	Name string `json:"name"`
	// Present: the process exports at least one of the stage's metrics.
	Present   bool            `json:"present"`
	Rates     []RateStatus    `json:"rates"`
	Latencies []LatencyStatus `json:"latencies"`
	// Facts are what the stage runs on (a NATS sink's stream, its storage
	// and replicas), one for each series of an info gauge at 1.
	Facts []FactStatus `json:"facts,omitempty"`
	// Into is the queue after the stage, if it has one.
	Into *Queue `json:"into,omitempty"`
}

// FactStatus is one fact of a stage: its title and its value as text.
type FactStatus struct {
	Title  string `json:"title"`
	Metric string `json:"metric"`
	Value  string `json:"value"`
}

// RateStatus is a counter: its value now and its rate over the window.
type RateStatus struct {
	Title  string  `json:"title"`
	Metric string  `json:"metric"`
	Total  float64 `json:"total"`
	// PerSecond is nil until there is an earlier reading.
	PerSecond *float64 `json:"per_second"`
	// By breaks the counter down by one label, when the stage says so.
	Label string      `json:"label,omitempty"`
	By    []LabelRate `json:"by,omitempty"`
}

// LabelRate is one value of the label a rate is broken down by.
type LabelRate struct {
	Value     string   `json:"value"`
	Total     float64  `json:"total"`
	PerSecond *float64 `json:"per_second"`
}

// LatencyStatus is a histogram over the window: nil quantiles when it
// observed nothing in it.
type LatencyStatus struct {
	Title  string `json:"title"`
	Metric string `json:"metric"`
	// Count is the observations in the window; Total since the start.
	Count float64  `json:"count"`
	Total float64  `json:"total"`
	P50   *float64 `json:"p50_seconds"`
	P90   *float64 `json:"p90_seconds"`
	P99   *float64 `json:"p99_seconds"`
	Mean  *float64 `json:"mean_seconds"`
}

// Queue is where a stage's output waits for the next stage.
type Queue struct {
	Name string `json:"name"` // "outbox", or a topic
	// Rows is the queue's depth, Seconds the age of its oldest entry; nil
	// when the process does not know it (no relay, no lag export).
	Rows    *float64 `json:"rows"`
	Seconds *float64 `json:"seconds"`
	Metric  string   `json:"metric"`
	// Groups is the lag of each consumer of a topic.
	Groups []QueueGroup `json:"groups,omitempty"`
}

// QueueGroup is one consumer's lag on a queue's topic.
type QueueGroup struct {
	Group   string   `json:"group"`
	Lag     float64  `json:"lag"`
	Seconds *float64 `json:"seconds"`
}

// Outbox is the relay's gauges: the outbox and the commands waiting for
// an outcome.
type Outbox struct {
	BacklogRows             float64 `json:"backlog_rows"`
	OldestAgeSeconds        float64 `json:"oldest_age_seconds"`
	DeadRows                float64 `json:"dead_rows"`
	PendingCommands         float64 `json:"pending_commands"`
	OldestPendingAgeSeconds float64 `json:"oldest_pending_age_seconds"`
}

// Lag is the consumer lag the process exports.
type Lag struct {
	// Exported: the registry has lag series (ONCEFLOW_LAG_EXPORT is not
	// off and there is a consumer to measure).
	Exported bool       `json:"exported"`
	Groups   []GroupLag `json:"groups"`
}

// GroupLag is one consumer group's lag: kafka_consumergroup_group_sum_lag,
// _max_lag_seconds, and each partition's.
type GroupLag struct {
	Group      string         `json:"group"`
	Sum        float64        `json:"sum"`
	MaxSeconds *float64       `json:"max_seconds"`
	Partitions []PartitionLag `json:"partitions"`
}

// PartitionLag is one partition of a group.
type PartitionLag struct {
	Topic     string   `json:"topic"`
	Partition int32    `json:"partition"`
	Lag       float64  `json:"lag"`
	Seconds   *float64 `json:"seconds"` // nil: unknown (kafka_consumergroup_group_lag_seconds absent)
	// Parked is the reason the partition is parked, if it is.
	Parked string `json:"parked,omitempty"`
}

// DLQ is the dead letter queue: what this process's processors sent to it
// since they started, and what the DLQ topics hold.
type DLQ struct {
	// Sent is onceflow_dlq_records_total by reason; nil when the process
	// runs no processor.
	Sent   []ReasonCount `json:"sent"`
	Topics []DLQTopic    `json:"topics"`
}

// ReasonCount is a number of DLQ records with one reason.
type ReasonCount struct {
	Reason  string  `json:"reason"`
	Records float64 `json:"records"`
}

// DLQTopic is what one DLQ topic holds: every record counted by reason,
// the newest listed.
type DLQTopic struct {
	Topic    string        `json:"topic"`
	Commands string        `json:"commands"` // where a redrive sends its records
	Records  int64         `json:"records"`
	ByReason []ReasonCount `json:"by_reason"`
	Newest   []DeadLetter  `json:"newest"`
	ReadAt   time.Time     `json:"read_at"`
}

// DeadLetter is a DLQ record as the page lists it: where it is and why,
// not what it says (its key and command id name a tenant's data).
type DeadLetter struct {
	Record      string    `json:"record"` // "partition:offset", as redrive and `onceflow dlq` take it
	Time        time.Time `json:"time"`
	Reason      string    `json:"reason"`
	CommandType string    `json:"command_type"`
	Source      string    `json:"source"` // topic/partition@offset it came from
	// Redrivable: the copy is complete (it left nothing out to fit).
	Redrivable bool `json:"redrivable"`
}

// Parked is the partitions projectors parked or are retrying.
type Parked struct {
	// Read: the process has a database to read them from.
	Read       bool                `json:"read"`
	Partitions []ParkedPartition   `json:"partitions"`
	Retrying   []RetryingPartition `json:"retrying"`
}

// ParkedPartition is a partition a projector stopped on (projector_parked,
// without the detail).
type ParkedPartition struct {
	Consumer  string    `json:"consumer"`
	Topic     string    `json:"topic"`
	Partition int32     `json:"partition"`
	Offset    int64     `json:"offset"`
	Reason    string    `json:"reason"`
	Since     time.Time `json:"since"`
}

// RetryingPartition is a partition whose batch fails with a transient
// error (projector_retrying, without the error's text).
type RetryingPartition struct {
	Consumer  string    `json:"consumer"`
	Topic     string    `json:"topic"`
	Partition int32     `json:"partition"`
	Class     string    `json:"class"`
	Attempts  int64     `json:"attempts"`
	Since     time.Time `json:"since"`
}

// History is the sampled past, for the page's plots: At holds each
// sample's time (Unix seconds), and every series one value per sample, or
// null where it had none.
type History struct {
	At     []float64     `json:"at"`
	Lag    []LagSeries   `json:"lag"`
	Outbox []*float64    `json:"outbox_backlog_rows"`
	Rates  []RateHistory `json:"rates"`
}

// LagSeries is one partition's lag over time.
type LagSeries struct {
	Group     string     `json:"group"`
	Topic     string     `json:"topic"`
	Partition int32      `json:"partition"`
	Lag       []*float64 `json:"lag"`
}

// RateHistory is a counter's rate between consecutive samples, for the
// flow's sparklines (the first sample has none).
type RateHistory struct {
	Metric    string     `json:"metric"`
	PerSecond []*float64 `json:"per_second"`
}

// Verify is the last `onceflow verify` recorded in the database
// (docs/operations.md#verify): when it finished, whether it found
// nothing lost or doubled, and its findings by stage and kind.
type Verify struct {
	LastRunTimestampSeconds float64       `json:"last_run_timestamp_seconds"`
	OK                      bool          `json:"ok"`
	Findings                []VerifyCount `json:"findings"`
}

// VerifyCount is the findings of one stage and kind.
type VerifyCount struct {
	Stage string  `json:"stage"`
	Kind  string  `json:"kind"`
	Count float64 `json:"count"`
}
