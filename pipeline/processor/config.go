package processor

import (
	"cmp"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/onceflow/onceflow/pipeline"
	"github.com/onceflow/onceflow/pipeline/kafka"
)

// DefaultGroup is the processor's consumer group unless Config.Group says
// otherwise.
const DefaultGroup = "onceflow-processor"

// Config configures a processor. Zero values mean the defaults.
type Config struct {
	// Topics names the topics. Required (a zero value means prefix "onceflow").
	Topics kafka.Topics
	// Group is the consumer group. Default DefaultGroup.
	Group string
	// InstanceID names this instance; the transactional id is
	// "{Group}-{InstanceID}". Restarting an instance with the same id
	// fences its previous incarnation at once (its open transaction is
	// aborted), so give every instance a stable, unique id. Default: the
	// host name.
	InstanceID string
	// DedupWindow is how long an aggregate remembers a command id, from
	// when the processor handled it. It must be at least the commands
	// topic's retention so a re-delivered command is always recognized,
	// and at most the dedup changelog's retention (checked at start).
	// Default 7 days.
	DedupWindow time.Duration
	// MaxClockSkew is how far ahead of the processor's clock a command's
	// record time may be; a record dated further ahead goes to the DLQ
	// (future-timestamp). A command's events carry its time, so keep it
	// well below the limit brokers put on record times
	// (message.timestamp.after.max.ms, an hour by default in Kafka 4).
	// Default 15 minutes.
	MaxClockSkew time.Duration
	// MaxCommandAge is how far behind the processor's clock a producer's
	// command record time may be; a record dated earlier, or before the
	// Unix epoch, goes to the DLQ (past-timestamp). A command the pipeline
	// accepted (the relay's and a decision's, with the accepted-by header)
	// is held to the epoch only: it is dated when it was accepted, and
	// the pipeline's own delay is no reason to fail it. A command's events carry
	// its time: a time no consumer can hold (before year 0 for JSON,
	// before 4713 BC for Postgres) would stop a projection. Default: the
	// commands topic's retention and a day, read at start (a record the
	// topic should already have deleted was not written in its time), at
	// least MinMaxCommandAge; DefaultMaxCommandAge when the retention
	// cannot be read.
	MaxCommandAge time.Duration
	// MaxCommandBytes bounds a command record's value; a larger one goes
	// to the DLQ (too-large). Default 1 MiB, ingest's request body limit.
	MaxCommandBytes int
	// MaxStringBytes bounds every string field of a command; a longer one
	// goes to the DLQ (invalid-field), as does one that is not UTF-8 or
	// holds a NUL. Default pipeline.DefaultMaxStringBytes.
	MaxStringBytes int
	// MaxPollRecords bounds a batch (one transaction). Default 5000.
	MaxPollRecords int
	// SessionTimeout is the group session timeout. Default 10s.
	SessionTimeout time.Duration
	// TransactionTimeout must be below SessionTimeout. Default 8/10 of
	// SessionTimeout. It bounds how long a zombie's open transaction (a
	// processor paused mid-batch) holds back the partition's new owner.
	TransactionTimeout time.Duration

	// atLeastOnce runs batches without transactions: the baseline of the
	// throughput benchmark (set in export_test.go), not a mode.
	atLeastOnce bool
	// now is the processor's clock; nil is time.Now (tests set it in
	// export_test.go to move time past a dedup window).
	now func() time.Time
}

// The defaults of Config's settings that the application also shows (its
// flags say what an unset variable means).
const (
	DefaultDedupWindow    = 7 * 24 * time.Hour
	DefaultSessionTimeout = 10 * time.Second
	DefaultMaxClockSkew   = 15 * time.Minute
	// DefaultMaxCommandAge is MaxCommandAge when the commands topic's
	// retention cannot be read: its default retention (7 days) and a day.
	DefaultMaxCommandAge = 8 * 24 * time.Hour
	// MinMaxCommandAge is the least MaxCommandAge: a redrive dates a
	// dead letter older than RedriveRedateAge anew, and the processor must
	// take that.
	MinMaxCommandAge       = 2 * RedriveRedateAge
	DefaultMaxCommandBytes = 1 << 20
)

func (c *Config) setDefaults() error {
	c.Group = cmp.Or(c.Group, DefaultGroup)
	if c.InstanceID == "" {
		h, err := os.Hostname()
		if err != nil {
			return err
		}
		c.InstanceID = h
	}
	if c.DedupWindow < 0 || c.MaxPollRecords < 0 || c.SessionTimeout < 0 || c.TransactionTimeout < 0 ||
		c.MaxClockSkew < 0 || c.MaxCommandBytes < 0 || c.MaxStringBytes < 0 {
		return errors.New("processor: negative DedupWindow, MaxPollRecords, SessionTimeout, TransactionTimeout, MaxClockSkew, MaxCommandBytes or MaxStringBytes")
	}
	if c.MaxCommandAge != 0 && c.MaxCommandAge < MinMaxCommandAge {
		return fmt.Errorf("processor: MaxCommandAge %s: want at least %s (a redrive dates older dead letters anew)", c.MaxCommandAge, MinMaxCommandAge)
	}
	c.MaxClockSkew = cmp.Or(c.MaxClockSkew, DefaultMaxClockSkew)
	c.MaxCommandBytes = cmp.Or(c.MaxCommandBytes, DefaultMaxCommandBytes)
	c.MaxStringBytes = cmp.Or(c.MaxStringBytes, pipeline.DefaultMaxStringBytes)
	c.DedupWindow = cmp.Or(c.DedupWindow, DefaultDedupWindow)
	if c.now == nil {
		c.now = time.Now
	}
	c.MaxPollRecords = cmp.Or(c.MaxPollRecords, 5000)
	c.SessionTimeout = cmp.Or(c.SessionTimeout, DefaultSessionTimeout)
	c.TransactionTimeout = cmp.Or(c.TransactionTimeout, c.SessionTimeout*8/10)
	if c.TransactionTimeout >= c.SessionTimeout {
		return errors.New("processor: TransactionTimeout must be below SessionTimeout")
	}
	return nil
}

// TransactionalID returns the Kafka transactional id of this instance.
func (c Config) TransactionalID() string { return c.Group + "-" + c.InstanceID }
