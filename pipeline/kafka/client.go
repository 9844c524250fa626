package kafka

import (
	"cmp"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sasl"
	"github.com/twmb/franz-go/pkg/sasl/plain"
	"github.com/twmb/franz-go/pkg/sasl/scram"
	"github.com/twmb/franz-go/plugin/kotel"
	"go.opentelemetry.io/otel/trace"

	"github.com/onceflow/onceflow/pipeline/tracing"
)

// Config is how to reach a Kafka cluster.
type Config struct {
	// Brokers are the seed brokers (KAFKA_BROKERS, comma separated).
	// Default 127.0.0.1:9092, the embedded broker of `onceflow dev`.
	Brokers []string
	// ClientID names the client in broker logs and quotas. Default "onceflow".
	ClientID string
	// SASLMechanism is "", "PLAIN", "SCRAM-SHA-256" or "SCRAM-SHA-512"
	// (KAFKA_SASL_MECHANISM), with SASLUser and SASLPassword
	// (KAFKA_SASL_USER, KAFKA_SASL_PASSWORD).
	SASLMechanism string
	SASLUser      string
	SASLPassword  string
	// TLS enables TLS (KAFKA_TLS=true); TLSCAFile adds a CA bundle
	// (KAFKA_TLS_CA_FILE) to the system roots.
	TLS       bool
	TLSCAFile string
	// AllowPlaintextSASL lets SASL run without TLS
	// (KAFKA_ALLOW_PLAINTEXT_SASL=true). Without TLS, PLAIN sends the
	// password in clear and SCRAM, though it hides the password, leaves the
	// session readable and open to a machine in the middle, so SASL without
	// TLS is refused unless this says the network is trusted. Default false.
	AllowPlaintextSASL bool
	// MaxDecompressBatchBytes bounds what one fetched record batch may
	// decompress to, in every client (KAFKA_MAX_DECOMPRESS_BATCH_BYTES):
	// brokers bound a batch compressed, so a producer can write a few KiB
	// that decompress to gigabytes (franz-go's own bound is 1 GiB a
	// batch). A batch beyond it stops its partition for the consumer
	// (BatchTooLarge), which reports it and waits for an operator.
	// Default DefaultMaxDecompressBatchBytes.
	MaxDecompressBatchBytes int
	// MaxDecompressPollBytes bounds what a consumer decompresses between
	// two polls, all batches together (KAFKA_MAX_DECOMPRESS_POLL_BYTES):
	// many batches each under MaxDecompressBatchBytes would otherwise
	// decompress at once, one fetch holding hundreds of them. A batch
	// past it waits for the next poll (OverBudget). At least
	// MaxDecompressBatchBytes; default twice it.
	MaxDecompressPollBytes int
	// Logger receives franz-go's warnings and errors; nil is silent.
	Logger *slog.Logger
	// TracerProvider, if set, gives every client franz-go's kotel hooks
	// (docs/observability.md): a publish span for each record produced in
	// a trace (its Context carries a span), whose traceparent replaces the
	// record's, and a receive span for each record fetched with one. Nil:
	// no hooks.
	TracerProvider trace.TracerProvider
}

// DefaultMaxDecompressBatchBytes is MaxDecompressBatchBytes unless set:
// sixteen of the largest commands the processor takes by default (1 MiB
// each), uncompressed. A legitimate producer's batch holds its batch limit
// uncompressed (franz-go's ProducerBatchMaxBytes, the relay's and the
// processor's: 1 MiB; Java's batch.size: 16 KiB), or one larger record
// alone; sixteen of them leaves room for producers that batch more.
const DefaultMaxDecompressBatchBytes = 16 << 20

// metadataMinAge is how soon a client may ask for metadata again, franz-go's
// 5 s unless set. A produce that Apache Kafka answers with a retriable error
// (CONCURRENT_TRANSACTIONS right after a commit, under KIP-890) waits for
// the next metadata update before it is sent again: with 5 s it outlived
// the processor's transaction, which ended unknown and cost the session
// (docs/decisions/0056-metadata-min-age.md).
const metadataMinAge = 250 * time.Millisecond

// MaxDecompressBatchBytesFor is the bound that fits a processor taking
// commands of up to maxCommandBytes: sixteen of them, never below the
// default.
func MaxDecompressBatchBytesFor(maxCommandBytes int) int {
	return max(DefaultMaxDecompressBatchBytes, 16*maxCommandBytes)
}

// ParseBrokers splits a comma-separated broker list.
func ParseBrokers(s string) []string {
	var out []string
	for _, b := range strings.Split(s, ",") {
		if b = strings.TrimSpace(b); b != "" {
			out = append(out, b)
		}
	}
	return out
}

func (c Config) validate() error {
	switch c.SASLMechanism {
	case "", "PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512":
	default:
		return fmt.Errorf("kafka: unknown SASL mechanism %q (want PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512)", c.SASLMechanism)
	}
	if c.SASLMechanism != "" && c.SASLUser == "" {
		return errors.New("kafka: SASL needs a user")
	}
	if c.SASLMechanism != "" && !c.TLS && !c.AllowPlaintextSASL {
		return fmt.Errorf("kafka: SASL %s without TLS would send credentials over an unencrypted connection; set KAFKA_TLS=true, or KAFKA_ALLOW_PLAINTEXT_SASL=true on a trusted network", c.SASLMechanism)
	}
	if c.MaxDecompressPollBytes > 0 && c.MaxDecompressPollBytes < cmp.Or(c.MaxDecompressBatchBytes, DefaultMaxDecompressBatchBytes) {
		return fmt.Errorf("kafka: KAFKA_MAX_DECOMPRESS_POLL_BYTES (%d) is below the bound of one batch, KAFKA_MAX_DECOMPRESS_BATCH_BYTES (%d): a batch under the one would never fit in the other",
			c.MaxDecompressPollBytes, cmp.Or(c.MaxDecompressBatchBytes, DefaultMaxDecompressBatchBytes))
	}
	if c.TLSCAFile != "" && !c.TLS {
		return errors.New("kafka: KAFKA_TLS_CA_FILE is set but KAFKA_TLS is not")
	}
	return nil
}

// Opts returns the franz-go options that connect to the cluster. Role
// packages append their own (groups, transactions, isolation).
func (c Config) Opts() ([]kgo.Opt, error) {
	if err := c.validate(); err != nil {
		return nil, err
	}
	brokers := c.Brokers
	if len(brokers) == 0 {
		brokers = []string{"127.0.0.1:9092"}
	}
	id := c.ClientID
	if id == "" {
		id = "onceflow"
	}
	maxBatch := c.MaxDecompressBatchBytes
	if maxBatch <= 0 {
		maxBatch = DefaultMaxDecompressBatchBytes
	}
	inner, err := boundedDecompressor(maxBatch)
	if err != nil {
		return nil, err
	}
	b := &budget{inner: inner, limit: int64(cmp.Or(c.MaxDecompressPollBytes, 2*maxBatch))}
	opts := []kgo.Opt{kgo.SeedBrokers(brokers...), kgo.ClientID(id), kgo.MaxDecompressBatchBytes(maxBatch), kgo.WithDecompressor(b), kgo.WithHooks(b), kgo.MetadataMinAge(metadataMinAge)}
	if c.Logger != nil {
		opts = append(opts, kgo.WithLogger(kgoLogger{c.Logger.With("lib", "franz-go")}))
	}
	if c.TracerProvider != nil {
		kt := kotel.NewTracer(kotel.TracerProvider(tracing.ChildOnly(c.TracerProvider)), kotel.TracerPropagator(tracing.Propagator))
		opts = append(opts, kgo.WithHooks(kotel.NewKotel(kotel.WithTracer(kt)).Hooks()...))
	}
	if m := c.mechanism(); m != nil {
		opts = append(opts, kgo.SASL(m))
	}
	if c.TLS {
		tc := &tls.Config{MinVersion: tls.VersionTLS12}
		if c.TLSCAFile != "" {
			pem, err := os.ReadFile(c.TLSCAFile)
			if err != nil {
				return nil, fmt.Errorf("kafka: read CA file: %w", err)
			}
			pool, err := x509.SystemCertPool()
			if err != nil {
				pool = x509.NewCertPool()
			}
			if !pool.AppendCertsFromPEM(pem) {
				return nil, fmt.Errorf("kafka: no certificates in %s", c.TLSCAFile)
			}
			tc.RootCAs = pool
		}
		opts = append(opts, kgo.DialTLSConfig(tc))
	}
	return opts, nil
}

func (c Config) mechanism() sasl.Mechanism {
	switch c.SASLMechanism {
	case "PLAIN":
		return plain.Auth{User: c.SASLUser, Pass: c.SASLPassword}.AsMechanism()
	case "SCRAM-SHA-256":
		return scram.Auth{User: c.SASLUser, Pass: c.SASLPassword}.AsSha256Mechanism()
	case "SCRAM-SHA-512":
		return scram.Auth{User: c.SASLUser, Pass: c.SASLPassword}.AsSha512Mechanism()
	}
	return nil
}

// BatchTooLarge returns the franz-go error of a fetched batch that
// decompresses beyond MaxDecompressBatchBytes: its partition is not
// fetched again until the consumer sets its offset past the batch
// (NextOffset) or restarts with a larger bound.
func BatchTooLarge(err error) (*kgo.ErrDecompressTooLarge, bool) {
	var e *kgo.ErrDecompressTooLarge
	ok := errors.As(err, &e)
	return e, ok
}

// BlockedPartition is a partition a consumer stopped at a batch that
// decompresses beyond its bound: at Offset, up to NextOffset, where an
// operator's skip moves it.
type BlockedPartition struct {
	Group      string `json:"group"`
	Topic      string `json:"topic"`
	Partition  int32  `json:"partition"`
	Offset     int64  `json:"offset"`
	NextOffset int64  `json:"next_offset"`
}

// decompressor is cl's bounded decompressor (MaxDecompressBatchBytes a
// batch, MaxDecompressPollBytes for the whole response), for reading one
// fetch response by hand: call it for each response.
func decompressor(cl *kgo.Client) kgo.Decompressor {
	switch d := cl.OptValue(kgo.WithDecompressor).(type) {
	case *budget:
		return d.readBudget()
	case kgo.Decompressor:
		return d // a client not made by Config: bounded a batch only
	}
	return kgo.DefaultDecompressor() // a client always has one; never reached
}

// NewClient builds a client from the configuration plus extra options.
func (c Config) NewClient(extra ...kgo.Opt) (*kgo.Client, error) {
	opts, err := c.Opts()
	if err != nil {
		return nil, err
	}
	return kgo.NewClient(append(opts, extra...)...)
}

// GroupMember is the options of a member of group that consumes topic, as
// the processor, the projector and the NATS sink do: committed records
// only (read_committed), a heartbeat at a third of the session timeout (at
// most 3 s), and no rebalance while the member handles what it polled
// (until it polls again or calls AllowRebalance).
func GroupMember(group, topic string, session time.Duration) []kgo.Opt {
	return []kgo.Opt{
		kgo.ConsumerGroup(group),
		kgo.ConsumeTopics(topic),
		kgo.SessionTimeout(session),
		kgo.HeartbeatInterval(min(3*time.Second, session/3)),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		kgo.BlockRebalanceOnPoll(),
	}
}

// RefusedForGood reports whether a produce error means the broker (or the
// client, for a record over its own limit) will never accept the record
// as it is, whatever the retries: too large, or invalid. Errors an
// operator can fix (authorization, a missing topic) are not.
func RefusedForGood(err error) bool {
	return errors.Is(err, kerr.MessageTooLarge) ||
		errors.Is(err, kerr.RecordListTooLarge) ||
		errors.Is(err, kerr.InvalidRecord) ||
		errors.Is(err, kerr.InvalidTimestamp)
}
