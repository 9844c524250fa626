package natsink

import (
	"cmp"
	"errors"
	"fmt"
	"strings"
	"time"
)

// Config configures a sink. Zero values mean the defaults.
type Config struct {
	// Topic is the events topic ({prefix}.events). Required.
	Topic string
	// Group is the sink's consumer group on Topic: its committed offsets
	// say which events JetStream has acknowledged. Default DefaultGroup.
	Group string
	// URL is the NATS server, or several comma separated
	// (nats://user:password@host:4222; tls:// for TLS). Required.
	URL string
	// CredsFile is a NATS credentials file (a user JWT and its NKey seed),
	// for servers with decentralized authentication. Default: none.
	CredsFile string
	// CAFile is a CA bundle (PEM) to verify a tls:// server with, in place
	// of the system's roots. Default: the system's roots.
	CAFile string
	// Stream is the JetStream stream the events go to. Default
	// DefaultStream(Topic).
	Stream string
	// Subject is the subject prefix: an event goes to
	// {Subject}.{tenant}.{event-type} (Subject). Default: Topic
	// (ledger.events).
	Subject string
	// DuplicateWindow is how long JetStream remembers a message id
	// (Nats-Msg-Id, the event id) to drop a message published again: the
	// limit of exactly once. A stream the sink creates gets it; an existing
	// stream with a shorter one is refused. It must outlast the time from
	// JetStream's acknowledgement of an event to the re-publish that
	// follows a crash before the offsets were committed: a restart of the
	// sink, or its partitions moving to another member (SessionTimeout).
	// JetStream keeps every id of the window in memory. Default
	// DefaultDuplicateWindow.
	DuplicateWindow time.Duration
	// Replicas is the replica count of a stream the sink creates (an
	// existing stream keeps its own). Default DefaultReplicas.
	Replicas int
	// AllowSingleReplica lets the sink use a stream of one replica
	// (Replicas 1, or an existing stream with one). JetStream acknowledges
	// a message of such a stream before it is on disk (the server syncs
	// its files every 2 minutes by default), and the sink commits its
	// Kafka offsets on that acknowledgement: a crash of the server's
	// machine loses events the sink will never send again. Set it when
	// the server syncs every write (nats-server 2.10 and later: jetstream
	// { sync_interval: always }), or when that loss is acceptable (onceflow
	// dev sets it). A stream in memory is refused whatever this says.
	// Default false.
	AllowSingleReplica bool
	// MaxInFlight bounds the messages published and not yet acknowledged
	// by JetStream. 1 publishes each event only after the one before it
	// was acknowledged, which keeps every aggregate's order in the stream
	// even when a publish fails (doc.go, Order). Default
	// DefaultMaxInFlight.
	MaxInFlight int
	// AckTimeout is how long a publish waits for JetStream's
	// acknowledgement before it counts as failed and is published again.
	// Default 5s.
	AckTimeout time.Duration
	// MaxPollRecords bounds a batch: the records whose offsets one commit
	// covers. Default 5000.
	MaxPollRecords int
	// MaxBackoff caps the wait between attempts while JetStream refuses or
	// cannot be reached. Default 5s.
	MaxBackoff time.Duration
	// SessionTimeout is the group session timeout: how long a member that
	// stopped answering keeps its partitions. Default 10s.
	SessionTimeout time.Duration
	// Hold is a test hook called at each crash point of a batch (see
	// Hold). Nil, its default, is what production runs.
	Hold Hold
}

// The defaults of Config's settings that the application also shows.
const (
	// DefaultGroup is the consumer group of a sink whose Config leaves it
	// empty.
	DefaultGroup = "onceflow-natsink"
	// DefaultDuplicateWindow covers a crash and restart with room to
	// spare (JetStream's own default is 2 minutes); it costs JetStream the
	// ids of 10 minutes of events in memory.
	DefaultDuplicateWindow = 10 * time.Minute
	DefaultMaxInFlight     = 1024
	DefaultSessionTimeout  = 10 * time.Second
	// DefaultReplicas is a stream's replicas unless Config.Replicas says:
	// a message acknowledged by a majority of three servers survives one's
	// loss without syncing every write.
	DefaultReplicas = 3
)

// DefaultStream is the stream of the events of topic unless
// Config.Stream names another: topic with each '.' replaced by '_'
// (ledger.events: ledger_events).
func DefaultStream(topic string) string { return strings.ReplaceAll(topic, ".", "_") }

func (c *Config) setDefaults() error {
	if c.Topic == "" {
		return errors.New("natsink: Topic is required")
	}
	if c.URL == "" {
		return errors.New("natsink: URL is required")
	}
	if c.DuplicateWindow < 0 || c.Replicas < 0 || c.MaxInFlight < 0 || c.AckTimeout < 0 || c.MaxPollRecords < 0 ||
		c.MaxBackoff < 0 || c.SessionTimeout < 0 {
		return errors.New("natsink: negative DuplicateWindow, Replicas, MaxInFlight, AckTimeout, MaxPollRecords, MaxBackoff or SessionTimeout")
	}
	c.Group = cmp.Or(c.Group, DefaultGroup)
	c.Stream = cmp.Or(c.Stream, DefaultStream(c.Topic))
	c.Subject = cmp.Or(c.Subject, c.Topic)
	c.DuplicateWindow = cmp.Or(c.DuplicateWindow, DefaultDuplicateWindow)
	c.Replicas = cmp.Or(c.Replicas, DefaultReplicas)
	if c.Replicas == 1 && !c.AllowSingleReplica {
		return errors.New("natsink: a stream of one replica loses what JetStream acknowledged when its server's machine fails before it syncs (every 2 minutes by default): " +
			"use 3 replicas (ONCEFLOW_NATS_STREAM_REPLICAS), or set ONCEFLOW_NATS_ALLOW_SINGLE_REPLICA=true on a server that syncs every write (sync_interval: always)")
	}
	c.MaxInFlight = cmp.Or(c.MaxInFlight, DefaultMaxInFlight)
	c.AckTimeout = cmp.Or(c.AckTimeout, 5*time.Second)
	c.MaxPollRecords = cmp.Or(c.MaxPollRecords, 5000)
	c.MaxBackoff = cmp.Or(c.MaxBackoff, 5*time.Second)
	c.SessionTimeout = cmp.Or(c.SessionTimeout, DefaultSessionTimeout)
	if err := validStreamName(c.Stream); err != nil {
		return err
	}
	return validSubjectPrefix(c.Subject)
}

// validStreamName checks a JetStream stream name: no whitespace, no '.',
// '*' or '>' (subject syntax) and no path separators (the server names a
// directory after it).
func validStreamName(s string) error {
	if s == "" || len(s) > 255 || strings.ContainsAny(s, ".*>/\\ \t\r\n\x00") {
		return fmt.Errorf("natsink: stream name %q: want up to 255 characters without '.', '*', '>', '/', '\\' or spaces", s)
	}
	return nil
}

// validSubjectPrefix checks the subject prefix: literal tokens (no
// wildcard), none empty.
func validSubjectPrefix(s string) error {
	for _, tok := range strings.Split(s, ".") {
		if tok == "" || tok == "*" || tok == ">" || strings.ContainsAny(tok, " \t\r\n\x00") {
			return fmt.Errorf("natsink: subject %q: want dot-separated tokens without wildcards or spaces", s)
		}
	}
	return nil
}
