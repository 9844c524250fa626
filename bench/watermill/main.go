// Command watermill is bench-e2e's peer: the ledger's deposit pipeline
// built with Watermill, as close to onceflow's guarantees as Watermill
// allows (the differences: docs/benchmarks.md#the-watermill-peer), serving
// the same HTTP routes so the same load generator drives both.
//
//	POST /v1/accounts, POST /v1/accounts/{id}/deposits
//	  one Postgres transaction: the Idempotency-Key (a retry gets the
//	  first command's id), the command's pending status, and the command
//	  in Watermill's SQL outbox (watermill-sql's Publisher on the
//	  transaction, enveloped for the forwarder) -> 202
//	forwarder (watermill's components/forwarder): reads the outbox
//	  (watermill-sql's Subscriber, polling) and publishes each command to
//	  {prefix}.commands (watermill-kafka's Publisher, sarama, keyed by
//	  account), acknowledging the outbox row after the broker's ack
//	processor (watermill-kafka's Subscriber, consumer group): one
//	  Postgres transaction per command: dedup on the command id, the
//	  decision applied to the account's state, the resulting event stored
//	  with the dedup row; then the event is published to {prefix}.events
//	  and the command acknowledged. A redelivered command publishes its
//	  stored event again.
//	projector (watermill-kafka's Subscriber): one Postgres transaction
//	  per event: dedup on the event id, the accounts read model and the
//	  command's status; then the in-process waiters of ?wait= are woken.
//	GET /v1/commands/{id}?wait=  the command's status, held until terminal
//
// Environment: DATABASE_URL, KAFKA_BROKERS, TOPIC_PREFIX (default "wm";
// {prefix}.commands and {prefix}.events must exist), HTTP_ADDR, ADMIN_ADDR
// (/readyz).
package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	wsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
	"github.com/ThreeDotsLabs/watermill/components/forwarder"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5/pgxpool"
	"golang.org/x/sync/errgroup"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Getenv); err != nil && !errors.Is(err, context.Canceled) {
		fmt.Fprintln(os.Stderr, "watermill peer:", err)
		os.Exit(1)
	}
}

const forwarderTopic = "outbox"

// peer is the running pipeline.
type peer struct {
	pool    *pgxpool.Pool
	schema  wsql.SchemaAdapter
	logger  watermill.LoggerAdapter
	topics  struct{ commands, events string }
	waiters *waiters
	events  message.Publisher
}

func run(ctx context.Context, getenv func(string) string) error {
	prefix := getenv("TOPIC_PREFIX")
	if prefix == "" {
		prefix = "wm"
	}
	brokers := strings.Split(getenv("KAFKA_BROKERS"), ",")
	if getenv("DATABASE_URL") == "" || brokers[0] == "" || getenv("HTTP_ADDR") == "" || getenv("ADMIN_ADDR") == "" {
		return errors.New("want DATABASE_URL, KAFKA_BROKERS, HTTP_ADDR and ADMIN_ADDR")
	}
	logger := watermill.NewSlogLogger(slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})))
	poolCfg, err := pgxpool.ParseConfig(getenv("DATABASE_URL"))
	if err != nil {
		return err
	}
	poolCfg.MaxConns = 20 // onceflow dev's components hold up to 10 each
	pool, err := pgxpool.NewWithConfig(ctx, poolCfg)
	if err != nil {
		return err
	}
	defer pool.Close()
	if _, err := pool.Exec(ctx, schemaSQL); err != nil {
		return fmt.Errorf("schema: %w", err)
	}
	p := &peer{pool: pool, logger: logger, waiters: newWaiters(),
		schema: wsql.DefaultPostgreSQLSchema{GeneratePayloadType: func(string) string { return "BYTEA" }}}
	p.topics.commands, p.topics.events = prefix+".commands", prefix+".events"
	k := newKafkaParts(brokers, logger)
	commandsPub, err := k.publisher()
	if err != nil {
		return err
	}
	defer commandsPub.Close()
	eventsPub, err := k.publisher()
	if err != nil {
		return err
	}
	defer eventsPub.Close()
	p.events = eventsPub
	fwd, err := p.forwarder(commandsPub)
	if err != nil {
		return err
	}
	router, err := p.router(k)
	if err != nil {
		return err
	}
	return p.serve(ctx, getenv("HTTP_ADDR"), getenv("ADMIN_ADDR"), fwd, router)
}

// kafkaParts make the peer's Kafka publishers and subscribers.
type kafkaParts struct {
	brokers   []string
	logger    watermill.LoggerAdapter
	marshaler kafka.MarshalerUnmarshaler
}

func newKafkaParts(brokers []string, logger watermill.LoggerAdapter) kafkaParts {
	return kafkaParts{brokers: brokers, logger: logger, marshaler: kafka.NewWithPartitioningMarshaler(func(_ string, m *message.Message) (string, error) {
		return m.Metadata.Get("key"), nil
	})}
}

func (k kafkaParts) publisher() (*kafka.Publisher, error) {
	pubCfg := kafka.DefaultSaramaSyncPublisherConfig()
	pubCfg.Producer.RequiredAcks = sarama.WaitForAll
	return kafka.NewPublisher(kafka.PublisherConfig{Brokers: k.brokers, Marshaler: k.marshaler, OverwriteSaramaConfig: pubCfg}, k.logger)
}

func (k kafkaParts) subscriber(group string) (*kafka.Subscriber, error) {
	c := kafka.DefaultSaramaSubscriberConfig()
	c.Consumer.Offsets.Initial = sarama.OffsetOldest
	return kafka.NewSubscriber(kafka.SubscriberConfig{Brokers: k.brokers, Unmarshaler: k.marshaler, OverwriteSaramaConfig: c, ConsumerGroup: group}, k.logger)
}

// forwarder is the outbox's forwarder to {prefix}.commands.
func (p *peer) forwarder(commandsPub message.Publisher) (*forwarder.Forwarder, error) {
	outboxSub, err := wsql.NewSubscriber(wsql.BeginnerFromPgx(p.pool), wsql.SubscriberConfig{
		ConsumerGroup:  "forwarder",
		SchemaAdapter:  p.schema,
		OffsetsAdapter: wsql.DefaultPostgreSQLOffsetsAdapter{},
		// Watermill's SQL subscriber polls; its default is 1s. 10 ms
		// keeps the wait for a new row short without a busy loop.
		PollInterval:     10 * time.Millisecond,
		InitializeSchema: true,
	}, p.logger)
	if err != nil {
		return nil, err
	}
	// The outbox's table, created here rather than by a publisher on a
	// transaction (which Watermill forbids: CREATE TABLE would commit it).
	if err := outboxSub.SubscribeInitialize(forwarderTopic); err != nil {
		return nil, fmt.Errorf("outbox table: %w", err)
	}
	return forwarder.NewForwarder(outboxSub, commandsPub, p.logger, forwarder.Config{ForwarderTopic: forwarderTopic})
}

// router runs the processor (commands to events) and the projector.
func (p *peer) router(k kafkaParts) (*message.Router, error) {
	router, err := message.NewRouter(message.RouterConfig{CloseTimeout: 10 * time.Second}, p.logger)
	if err != nil {
		return nil, err
	}
	commandsSub, err := k.subscriber("wm-processor")
	if err != nil {
		return nil, err
	}
	eventsSub, err := k.subscriber("wm-projector")
	if err != nil {
		return nil, err
	}
	router.AddConsumerHandler("processor", p.topics.commands, commandsSub, p.process)
	router.AddConsumerHandler("projector", p.topics.events, eventsSub, p.project)
	return router, nil
}

// serve runs the forwarder, the router and the HTTP and admin servers
// until ctx ends; /readyz answers once the forwarder and the router run.
func (p *peer) serve(ctx context.Context, httpAddr, adminAddr string, fwd *forwarder.Forwarder, router *message.Router) error {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/accounts", p.openAccount)
	mux.HandleFunc("POST /v1/accounts/{id}/deposits", p.deposit)
	mux.HandleFunc("GET /v1/commands/{id}", p.command)
	httpLn, err := net.Listen("tcp", httpAddr)
	if err != nil {
		return err
	}
	adminLn, err := net.Listen("tcp", adminAddr)
	if err != nil {
		return err
	}
	ready := make(chan struct{})
	admin := http.NewServeMux()
	admin.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-ready:
		default:
			http.Error(w, "starting", http.StatusServiceUnavailable)
		}
	})
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	adminSrv := &http.Server{Handler: admin, ReadHeaderTimeout: 5 * time.Second}

	g, ctx := errgroup.WithContext(ctx)
	g.Go(func() error { return fwd.Run(ctx) })
	g.Go(func() error { return router.Run(ctx) })
	g.Go(func() error {
		select {
		case <-fwd.Running():
		case <-ctx.Done():
			return nil
		}
		select {
		case <-router.Running():
			close(ready)
		case <-ctx.Done():
		}
		return nil
	})
	g.Go(func() error { return serve(ctx, srv, httpLn) })
	g.Go(func() error { return serve(ctx, adminSrv, adminLn) })
	g.Go(func() error {
		<-ctx.Done()
		fwd.Close()
		router.Close()
		return ctx.Err()
	})
	return g.Wait()
}

func serve(ctx context.Context, srv *http.Server, ln net.Listener) error {
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		srv.Shutdown(sctx)
	}()
	if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}
