package natsink

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/onceflow/onceflow/pipeline/kafka"
)

// Sink forwards the events topic to a JetStream stream.
type Sink struct {
	cfg     Config
	kafka   kafka.Config
	logger  *slog.Logger
	metrics *metrics
	// pubOpts are every publish's options: the stream it must land in, and
	// no retry inside nats.go (a retry there would overtake the messages
	// published after it; the sink retries in order, batch.go).
	pubOpts []jetstream.PublishOpt

	positional rateLimited // logs of records without an event id

	ready chan struct{}
	once  sync.Once
}

// New returns a sink of the events topic cfg names.
func New(cfg Config, kcfg kafka.Config, logger *slog.Logger, reg prometheus.Registerer) (*Sink, error) {
	if err := cfg.setDefaults(); err != nil {
		return nil, err
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	return &Sink{
		cfg: cfg, kafka: kcfg,
		logger:  logger.With("component", "natsink", "group", cfg.Group, "stream", cfg.Stream),
		metrics: newMetrics(reg),
		pubOpts: []jetstream.PublishOpt{jetstream.WithExpectStream(cfg.Stream), jetstream.WithRetryAttempts(0)},
		ready:   make(chan struct{}),
	}, nil
}

// Ready is closed once the stream is there and the sink has joined its
// group.
func (s *Sink) Ready() <-chan struct{} { return s.ready }

func (s *Sink) markReady() { s.once.Do(func() { close(s.ready) }) }

// LagSource is the sink's consumer group, for the lag metrics: its
// offsets are committed to Kafka.
func (s *Sink) LagSource() kafka.LagSource {
	return kafka.LagSource{Group: s.cfg.Group, Topics: []string{s.cfg.Topic}}
}

// Run forwards events until ctx ends. It then publishes nothing more,
// waits for the acknowledgements of what is in flight (each at most
// AckTimeout), commits the offsets JetStream acknowledged, and leaves the
// group. It returns an error only for a stream it refuses (ensureStream)
// or a configuration that cannot connect.
func (s *Sink) Run(ctx context.Context) error {
	nc, err := s.connect()
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := jetstream.New(nc,
		jetstream.WithPublishAsyncMaxPending(s.cfg.MaxInFlight),
		// Every acknowledgement is waited for at most this long, whatever
		// becomes of the connection: a publish always settles.
		jetstream.WithPublishAsyncTimeout(s.cfg.AckTimeout))
	if err != nil {
		return fmt.Errorf("natsink: %w", err)
	}
	if err := s.waitStream(ctx, js); err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return err
	}
	cl, err := s.kafka.NewClient(append(kafka.GroupMember(s.cfg.Group, s.cfg.Topic, s.cfg.SessionTimeout),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.DisableAutoCommit(),
		kgo.OnPartitionsAssigned(func(context.Context, *kgo.Client, map[string][]int32) { s.markReady() }),
	)...)
	if err != nil {
		return fmt.Errorf("natsink client: %w", err)
	}
	defer cl.Close()
	s.logger.Info("natsink started", "topic", s.cfg.Topic, "subject", s.cfg.Subject+".>")

	for {
		fetches := cl.PollRecords(ctx, s.cfg.MaxPollRecords)
		if ctx.Err() != nil || fetches.IsClientClosed() {
			cl.AllowRebalance()
			return nil
		}
		fetches.EachError(func(topic string, part int32, err error) {
			if !errors.Is(err, context.Canceled) && !kafka.OverBudget(err) {
				s.logger.Warn("fetch error", "topic", topic, "partition", part, "err", err)
			}
		})
		if records := fetches.Records(); len(records) > 0 {
			s.forward(ctx, cl, js, records)
		}
		cl.AllowRebalance()
	}
}

// connect returns a connection to NATS that reconnects forever. It does
// not wait for the server: publishes fail (and are retried) while it is
// away.
func (s *Sink) connect() (*nats.Conn, error) {
	opts := []nats.Option{
		nats.Name("onceflow-natsink " + s.cfg.Group),
		nats.MaxReconnects(-1),
		nats.RetryOnFailedConnect(true),
		// No reconnect buffer: a publish while disconnected fails at once
		// instead of being sent after the reconnect, behind the retry of a
		// message the disconnect lost.
		nats.ReconnectBufSize(-1),
		nats.ConnectHandler(func(*nats.Conn) { s.connected(true, nil) }),
		nats.ReconnectHandler(func(*nats.Conn) { s.connected(true, nil) }),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) { s.connected(false, err) }),
		nats.ClosedHandler(func(*nats.Conn) { s.metrics.connected.Set(0) }),
	}
	if s.cfg.CredsFile != "" {
		opts = append(opts, nats.UserCredentials(s.cfg.CredsFile))
	}
	if s.cfg.CAFile != "" {
		opts = append(opts, nats.RootCAs(s.cfg.CAFile))
	}
	nc, err := nats.Connect(s.cfg.URL, opts...)
	if err != nil {
		return nil, fmt.Errorf("natsink: connect: %w", err)
	}
	if nc.IsConnected() {
		s.metrics.connected.Set(1)
	}
	return nc, nil
}

func (s *Sink) connected(up bool, err error) {
	if up {
		s.metrics.connected.Set(1)
		s.logger.Info("connected to nats")
		return
	}
	s.metrics.connected.Set(0)
	if err != nil { // nil: the sink closed the connection
		s.logger.Warn("disconnected from nats; reconnecting", "err", err)
	}
}

// waitStream ensures the stream, retrying while JetStream cannot be
// reached, until it is there or refused.
func (s *Sink) waitStream(ctx context.Context, js jetstream.JetStream) error {
	wait := 50 * time.Millisecond
	var logged time.Time
	for {
		sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		got, err := ensureStream(sctx, js, s.cfg)
		cancel()
		if err == nil {
			s.logger.Info("stream ready", "subjects", strings.Join(got.Subjects, ","), "duplicate_window", got.Duplicates,
				"storage", strings.ToLower(got.Storage.String()), "replicas", max(got.Replicas, 1))
			s.metrics.stream.Reset()
			s.metrics.stream.WithLabelValues(s.cfg.Stream, strings.ToLower(got.Storage.String()), strconv.Itoa(max(got.Replicas, 1))).Set(1)
			return nil
		}
		if errors.Is(err, errRefused) || ctx.Err() != nil {
			return err
		}
		if time.Since(logged) >= retryLogInterval {
			logged = time.Now()
			s.logger.Warn("jetstream not reachable yet; retrying", "err", err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(wait):
		}
		wait = min(2*wait, s.cfg.MaxBackoff)
	}
}

// retryLogInterval is how often a failure that goes on is logged again.
const retryLogInterval = 30 * time.Second

// rateLimited logs at most once a second and counts what it left out.
type rateLimited struct {
	last       atomic.Int64 // unix nanos of the last message logged
	suppressed atomic.Int64
}

func (r *rateLimited) warn(l *slog.Logger, msg string, args ...any) {
	now := time.Now().UnixNano()
	last := r.last.Load()
	if now-last < int64(time.Second) || !r.last.CompareAndSwap(last, now) {
		r.suppressed.Add(1)
		return
	}
	if n := r.suppressed.Swap(0); n > 0 {
		args = append(args, "suppressed", n)
	}
	l.Warn(msg, args...)
}
