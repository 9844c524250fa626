package status

// stage is one part of the flow as the page shows it: counters as a rate
// and a total, histograms (in seconds) as quantiles over the window. A
// metric the process does not export (it does not run that component) is
// left out; a stage with none is drawn as not in this process.
type stage struct {
	name      string
	rates     []rate
	latencies []latency
	// facts are what the stage runs on, from info gauges.
	facts []fact
	// into names the queue after the stage: where its output waits for the
	// next one.
	into queue
	// optional: a component most deployments do not run, left off the
	// page of a process without it rather than drawn as elsewhere.
	optional bool
}

// rate is a counter, summed over its series; by, if set, also breaks it
// down by that label.
type rate struct {
	title, metric, by string
}

// fact is an info gauge's series at 1, its labels' values shown through
// format (one %s each): what a stage runs on rather than what it did.
type fact struct {
	title, metric string
	labels        []string
	format        string
}

// latency is a histogram of seconds, its buckets summed over its series.
type latency struct {
	title, metric string
}

type queue int

const (
	noQueue      queue = iota
	outboxQueue        // the outbox rows ingest committed and the relay ships
	commandTopic       // the commands topics: the processor groups' lag
	eventTopic         // the events topics: the projectors' lag
)

// flow is the pipeline, in order. Each metric is one the components
// export (docs/architecture.md#observability); each stage's first
// latency is a command's age when the stage finished with it, on the
// same buckets at every stage, so they read as its way through the
// pipeline.
var flow = []stage{
	{
		name: "ingest",
		rates: []rate{
			{"requests", "onceflow_api_requests_total", "code"},
			{"commands accepted", "onceflow_api_commands_accepted_total", ""},
			{"idempotent replays", "onceflow_api_idempotency_hits_total", ""},
			{"inbound webhooks", "onceflow_api_inbound_deliveries_total", "outcome"},
		},
		latencies: []latency{
			{"age when accepted", "onceflow_api_command_age_seconds"},
			{"request", "onceflow_api_request_duration_seconds"},
			{"accept transaction", "onceflow_api_accept_batch_duration_seconds"},
			{"inbound webhook", "onceflow_api_inbound_duration_seconds"},
		},
		into: outboxQueue,
	},
	{
		name: "relay",
		rates: []rate{
			{"rows shipped", "onceflow_outbox_shipped_rows_total", ""},
			{"batch errors", "onceflow_outbox_ship_errors_total", ""},
		},
		latencies: []latency{
			{"age when shipped", "onceflow_outbox_ship_latency_seconds"},
			{"publish", "onceflow_outbox_publish_duration_seconds"},
		},
		into: commandTopic,
	},
	{
		name: "processor",
		rates: []rate{
			{"commands", "onceflow_processor_commands_total", "outcome"},
			{"duplicates skipped", "onceflow_command_dedup_total", ""},
			{"to the DLQ", "onceflow_dlq_records_total", "reason"},
		},
		latencies: []latency{
			{"age when decided", "onceflow_processor_command_age_seconds"},
			{"batch", "onceflow_processor_batch_duration_seconds"},
			{"commit", "onceflow_processor_commit_duration_seconds"},
		},
		into: eventTopic,
	},
	{
		name: "projector",
		rates: []rate{
			{"events applied", "onceflow_projector_events_applied_total", ""},
			{"duplicates absorbed", "onceflow_projector_duplicates_total", ""},
			{"jobs enqueued", "onceflow_projector_jobs_enqueued_total", ""},
		},
		latencies: []latency{
			{"age when projected", "onceflow_projector_event_age_seconds"},
			{"batch", "onceflow_projector_batch_duration_seconds"},
		},
	},
	{
		// The worker (docs/jobs.md, docs/webhooks.md): the jobs the
		// projector enqueued, webhook deliveries first among them.
		name: "worker",
		rates: []rate{
			{"webhook deliveries", "onceflow_webhooks_deliveries_total", "outcome"},
			{"webhook fan-outs", "onceflow_webhooks_fanouts_total", "outcome"},
			{"job attempts", "onceflow_worker_attempts_total", "outcome"},
			{"dead jobs", "onceflow_worker_dead_jobs_total", "reason"},
		},
		latencies: []latency{
			{"delivered after projection", "onceflow_webhooks_delivery_latency_seconds"},
			{"webhook request", "onceflow_webhooks_request_duration_seconds"},
			{"job attempt", "onceflow_worker_attempt_duration_seconds"},
		},
	},
	{
		// The NATS sink (docs/consumers.md#nats-jetstream): the events
		// forwarded to JetStream; its group's lag is in the events queue.
		name:     "natsink",
		optional: true,
		rates: []rate{
			{"events to JetStream", "onceflow_natsink_events_published_total", ""},
			{"duplicates dropped", "onceflow_natsink_duplicates_total", ""},
			{"publish errors", "onceflow_natsink_publish_errors_total", "class"},
			{"stored out of order", "onceflow_natsink_out_of_order_total", ""},
		},
		latencies: []latency{
			{"age when acknowledged", "onceflow_natsink_event_age_seconds"},
			{"batch", "onceflow_natsink_batch_duration_seconds"},
		},
		// What JetStream acknowledged survives only on a durable stream
		// (docs/consumers.md#nats-jetstream).
		facts: []fact{{"stream", "onceflow_natsink_stream_info", []string{"stream", "storage", "replicas"}, "%s, %s storage, replicas %s"}},
	},
}

// The other series the page reads from the registry.
const (
	lagMetric        = "kafka_consumergroup_group_lag"         // group, topic, partition
	lagSecondsMetric = "kafka_consumergroup_group_lag_seconds" // group, topic, partition
	sumLagMetric     = "kafka_consumergroup_group_sum_lag"     // group
	maxSecondsMetric = "kafka_consumergroup_group_max_lag_seconds"

	backlogMetric       = "onceflow_outbox_backlog_rows"
	oldestMetric        = "onceflow_outbox_oldest_age_seconds"
	deadMetric          = "onceflow_outbox_dead_rows"
	pendingMetric       = "onceflow_commands_pending"
	oldestPendingMetric = "onceflow_commands_oldest_pending_age_seconds"

	dlqMetric            = "onceflow_dlq_records_total" // reason
	processorBatchMetric = "onceflow_processor_batch_duration_seconds"

	// The last recorded `onceflow verify` (pipeline/verify's collector,
	// in every process with a database).
	verifyLastMetric     = "onceflow_verify_last_run_timestamp_seconds"
	verifyOKMetric       = "onceflow_verify_last_run_ok"
	verifyFindingsMetric = "onceflow_verify_findings" // stage, kind
)

// tracked is every metric the page reads and how its series are keyed:
// summed over every label but those kept.
func tracked() map[string]track {
	t := map[string]track{
		lagMetric:            {keep: partitionLabels},
		lagSecondsMetric:     {keep: partitionLabels},
		sumLagMetric:         {keep: []string{"group"}},
		maxSecondsMetric:     {keep: []string{"group"}},
		backlogMetric:        {},
		oldestMetric:         {},
		deadMetric:           {},
		pendingMetric:        {},
		oldestPendingMetric:  {},
		verifyLastMetric:     {},
		verifyOKMetric:       {},
		verifyFindingsMetric: {keep: []string{"stage", "kind"}},
	}
	for _, s := range flow {
		for _, r := range s.rates {
			if r.by != "" {
				t[r.metric] = track{keep: []string{r.by}}
			} else {
				t[r.metric] = track{}
			}
		}
		for _, l := range s.latencies {
			t[l.metric] = track{}
		}
		for _, f := range s.facts {
			t[f.metric] = track{keep: f.labels}
		}
	}
	return t
}

var partitionLabels = []string{"group", "topic", "partition"}
