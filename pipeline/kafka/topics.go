package kafka

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
)

// Topics names onceflow's topics (docs/architecture.md#topics-keys-and-headers)
// and how to create them.
type Topics struct {
	// Prefix starts every topic's name: the domain's (ONCEFLOW_TOPIC_PREFIX),
	// or for one of a domain's several aggregate types
	// "{domain prefix}.{aggregate type}". Default "onceflow"; the application
	// always sets it.
	Prefix string
	// EventsPrefix, if set, starts the events topic's name instead of
	// Prefix: a domain's aggregate types share one events topic,
	// "{domain prefix}.events".
	EventsPrefix string
	// Partitions of the commands, state and events topics (commands and
	// state must be equal: state is co-partitioned with commands).
	// Default 8. The DLQ gets the same count.
	Partitions int32
	// ReplicationFactor of created topics; -1 (default) uses the broker's.
	ReplicationFactor int16
	// CommandsRetention is the retention of {prefix}.commands. Default 7
	// days. The processor's dedup window must be at least this long.
	CommandsRetention time.Duration
	// DLQRetention is the retention of {prefix}.commands.dlq. Default 30 days.
	DLQRetention time.Duration
	// DedupRetention is the retention of {prefix}.dedup, the processor's
	// dedup changelog: at least its dedup window, which the processor
	// checks at start. Default 8 days (the default window, 7 days, and a
	// day for the clocks of processors and brokers to disagree).
	DedupRetention time.Duration
}

// Topic defaults.
const (
	DefaultPartitions        = 8
	DefaultCommandsRetention = 7 * 24 * time.Hour
	// DedupRetentionSlack is how much longer than the processor's dedup
	// window the dedup changelog keeps records: a day for the clocks of
	// processors and brokers to disagree.
	DedupRetentionSlack = 24 * time.Hour
)

func (t Topics) withDefaults() Topics {
	if t.Prefix == "" {
		t.Prefix = "onceflow"
	}
	if t.Partitions == 0 {
		t.Partitions = DefaultPartitions
	}
	if t.ReplicationFactor == 0 {
		t.ReplicationFactor = -1
	}
	if t.CommandsRetention == 0 {
		t.CommandsRetention = DefaultCommandsRetention
	}
	if t.DLQRetention == 0 {
		t.DLQRetention = 30 * 24 * time.Hour
	}
	if t.DedupRetention == 0 {
		t.DedupRetention = DefaultCommandsRetention + DedupRetentionSlack
	}
	return t
}

// Commands is "{prefix}.commands", the pipeline's input.
func (t Topics) Commands() string { return t.withDefaults().Prefix + ".commands" }

// Events is "{prefix}.events" (EventsPrefix if set), the replay source.
func (t Topics) Events() string {
	if t.EventsPrefix != "" {
		return t.EventsPrefix + ".events"
	}
	return t.withDefaults().Prefix + ".events"
}

// State is "{prefix}.state", the processor's compacted snapshots.
func (t Topics) State() string { return t.withDefaults().Prefix + ".state" }

// DLQ is "{prefix}.commands.dlq", poison commands with reason headers.
func (t Topics) DLQ() string { return t.withDefaults().Prefix + ".commands.dlq" }

// Dedup is "{prefix}.dedup", the changelog of the processor's dedup
// memory: the ids of the commands each transaction handled.
func (t Topics) Dedup() string { return t.withDefaults().Prefix + ".dedup" }

// TopicSpec is one topic's wanted shape.
type TopicSpec struct {
	Name       string
	Partitions int32
	Configs    map[string]string
}

func ms(d time.Duration) string { return strconv.FormatInt(d.Milliseconds(), 10) }

// Specs returns the topics with their cleanup policy and retention.
func (t Topics) Specs() []TopicSpec {
	t = t.withDefaults()
	return []TopicSpec{
		{t.Commands(), t.Partitions, map[string]string{"cleanup.policy": "delete", "retention.ms": ms(t.CommandsRetention)}},
		{t.Events(), t.Partitions, map[string]string{"cleanup.policy": "delete", "retention.ms": "-1"}},
		// retention.ms=-1: a compacted topic keeps the latest value of every
		// key forever, however old. Apache Kafka ignores retention.ms without
		// cleanup.policy=delete, but kfake applies it to compacted topics too
		// (and would drop the snapshot of an account idle for 7 days).
		{t.State(), t.Partitions, map[string]string{"cleanup.policy": "compact", "retention.ms": "-1"}},
		{t.DLQ(), t.Partitions, map[string]string{"cleanup.policy": "delete", "retention.ms": ms(t.DLQRetention)}},
		// Time retention, in segments of an hour so expired ids leave the
		// log within the hour rather than a whole default segment (7 days)
		// later: a restore reads what is left.
		{t.Dedup(), t.Partitions, map[string]string{"cleanup.policy": "delete", "retention.ms": ms(t.DedupRetention), "segment.ms": ms(time.Hour)}},
	}
}

// Provision creates the topics that do not exist yet, then checks them all
// (Check). Creating is idempotent: concurrent callers both succeed. Topics
// that exist are not created again, so a principal that may describe them
// but not create them — every component's but the operator's
// (docs/security.md#kafka-acls) — provisions a deployment whose topics
// `onceflow topics create` made. On a cluster of several nodes, a topic
// just created may be unknown for a moment to the node its check asks:
// Provision then checks again, for at most 30 s.
func Provision(ctx context.Context, adm *kadm.Client, t Topics) error {
	t = t.withDefaults()
	specs := t.Specs()
	names := make([]string, len(specs))
	for i, s := range specs {
		names[i] = s.Name
	}
	listed, err := adm.ListTopics(ctx, names...)
	if err != nil {
		return fmt.Errorf("list topics: %w", err)
	}
	var created []string
	for _, spec := range specs {
		// A topic just made may be listed without a leader yet: it exists.
		if d, ok := listed[spec.Name]; ok && !errors.Is(d.Err, kerr.UnknownTopicOrPartition) && !errors.Is(d.Err, kerr.TopicAuthorizationFailed) {
			continue
		}
		configs := make(map[string]*string, len(spec.Configs))
		for k, v := range spec.Configs {
			configs[k] = kadm.StringPtr(v)
		}
		resp, err := adm.CreateTopic(ctx, spec.Partitions, t.ReplicationFactor, configs, spec.Name)
		if err == nil {
			err = resp.Err
		}
		switch {
		case errors.Is(err, kerr.TopicAuthorizationFailed):
			// Apache Kafka answers a topic the principal may not describe
			// as if it did not exist.
			return fmt.Errorf("topic %s does not exist or may not be described, and may not be created (%w): create the topics as the operator (`onceflow topics create`) and grant this principal Describe and DescribeConfigs on them (docs/security.md#kafka-acls)",
				spec.Name, err)
		case err != nil && !errors.Is(err, kerr.TopicAlreadyExists):
			return fmt.Errorf("create topic %s: %w", spec.Name, err)
		}
		created = append(created, spec.Name)
	}
	if err := waitListed(ctx, adm, created); err != nil {
		return err
	}
	return checkCreated(ctx, adm, t, created)
}

// settleTimeout bounds how long Provision checks again topics it created
// that a broker does not know yet.
const settleTimeout = 30 * time.Second

// checkCreated runs Check, and again while it finds a topic unknown after
// Provision created some (UNKNOWN_TOPIC_OR_PARTITION), for at most
// settleTimeout. On several nodes each broker learns of a new topic from
// the controller on its own time: the metadata may list the topics (one
// broker answers it) while DescribeConfigs goes to another that does not
// know them yet (three nodes of Apache Kafka 4.3.2: ledger.commands.dlq
// unknown right after its creation).
func checkCreated(ctx context.Context, adm *kadm.Client, t Topics, created []string) error {
	err := Check(ctx, adm, t)
	if len(created) == 0 {
		return err
	}
	deadline := time.Now().Add(settleTimeout)
	for errors.Is(err, kerr.UnknownTopicOrPartition) {
		if time.Now().After(deadline) {
			return fmt.Errorf("topics created (%s) still unknown to a broker after %s: %w", strings.Join(created, ", "), settleTimeout, err)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("topics created (%s) unknown to a broker: %w (%w)", strings.Join(created, ", "), err, ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
		err = Check(ctx, adm, t)
	}
	return err
}

// waitListed waits until the metadata lists names. Apache Kafka answers
// CreateTopics once its controller has the topic, and the brokers that
// answer metadata learn of it a moment later: a Check right after the
// creation found the topics missing (the embedded broker creates them
// before it answers).
func waitListed(ctx context.Context, adm *kadm.Client, names []string) error {
	if len(names) == 0 {
		return nil
	}
	for {
		details, err := adm.ListTopics(ctx, names...)
		if err != nil {
			return fmt.Errorf("list topics: %w", err)
		}
		missing := ""
		for _, name := range names {
			if d, ok := details[name]; !ok || d.Err != nil {
				missing = name
				break
			}
		}
		if missing == "" {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("topic %s, just created, is not listed: %w", missing, ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// missingTopicError is Check's error for a topic the metadata does not
// list: UNKNOWN_TOPIC_OR_PARTITION, which Provision checks again after
// creating topics.
type missingTopicError string

func (e missingTopicError) Error() string {
	return fmt.Sprintf("topic %s does not exist (run `onceflow topics create`)", string(e))
}

func (e missingTopicError) Is(target error) bool { return target == kerr.UnknownTopicOrPartition }

// Check verifies that the topics exist with the cleanup policies of
// docs/architecture.md#topics-keys-and-headers and that commands and state have
// the same partition count (the processor restores a commands partition's state
// from the same-numbered state partition; unequal counts would restore the
// wrong aggregates). Components call it at start and refuse to run on a
// mismatch.
func Check(ctx context.Context, adm *kadm.Client, t Topics) error {
	t = t.withDefaults()
	specs := t.Specs()
	names := make([]string, len(specs))
	for i, s := range specs {
		names[i] = s.Name
	}
	details, err := adm.ListTopics(ctx, names...)
	if err != nil {
		return fmt.Errorf("list topics: %w", err)
	}
	var errs []error
	for _, name := range names {
		d, ok := details[name]
		if !ok || errors.Is(d.Err, kerr.UnknownTopicOrPartition) {
			errs = append(errs, missingTopicError(name))
		} else if d.Err != nil {
			errs = append(errs, fmt.Errorf("topic %s: %w", name, d.Err))
		}
	}
	if len(errs) > 0 {
		return errors.Join(errs...)
	}
	for _, co := range []string{t.State(), t.Dedup()} {
		if c, s := len(details[t.Commands()].Partitions), len(details[co].Partitions); c != s {
			return fmt.Errorf("topic %s has %d partitions but %s has %d: they must be equal (the processor's state is co-partitioned with commands)",
				t.Commands(), c, co, s)
		}
	}
	cfgs, err := adm.DescribeTopicConfigs(ctx, names...)
	if err != nil {
		return fmt.Errorf("describe topic configs: %w", err)
	}
	for _, spec := range specs {
		rc, err := cfgs.On(spec.Name, nil)
		if err != nil {
			return fmt.Errorf("describe configs of %s: %w", spec.Name, err)
		}
		if rc.Err != nil {
			return fmt.Errorf("describe configs of %s: %w", spec.Name, rc.Err)
		}
		want := spec.Configs["cleanup.policy"]
		for _, c := range rc.Configs {
			if c.Key == "cleanup.policy" && c.MaybeValue() != want {
				errs = append(errs, fmt.Errorf("topic %s has cleanup.policy=%s, want %s", spec.Name, c.MaybeValue(), want))
			}
		}
	}
	return errors.Join(errs...)
}
