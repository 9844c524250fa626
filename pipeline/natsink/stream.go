package natsink

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// errRefused is a stream the sink will not publish to: a configuration an
// operator must change, not a failure to wait out.
var errRefused = errors.New("natsink: refused")

// ensureStream creates the stream if it does not exist: file storage,
// the configured replicas, limits retention with no limit (like the events
// topic, kept forever), the subjects {Subject}.> and the duplicate window.
// A stream that exists is left as its operator made it, and refused when
// its duplicate window is shorter than the configured one or its subjects
// do not take {Subject}.>. It returns the stream's duplicate window.
func ensureStream(ctx context.Context, js jetstream.JetStream, cfg Config) (jetstream.StreamConfig, error) {
	want := jetstream.StreamConfig{
		Name:        cfg.Stream,
		Description: "onceflow: the events of " + cfg.Topic + ", forwarded once per event id",
		Subjects:    []string{cfg.Subject + ".>"},
		Retention:   jetstream.LimitsPolicy,
		Storage:     jetstream.FileStorage,
		Replicas:    cfg.Replicas,
		Duplicates:  cfg.DuplicateWindow,
	}
	s, err := js.Stream(ctx, cfg.Stream)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		s, err = js.CreateStream(ctx, want)
		if errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
			s, err = js.Stream(ctx, cfg.Stream) // another member created it meanwhile
		}
	}
	if err != nil {
		// The server answered and said no (subjects another stream takes,
		// more replicas than servers, no JetStream for the account):
		// waiting will not change that. Anything else (no answer, a 503:
		// JetStream not enabled or not ready yet) is retried.
		var apiErr *jetstream.APIError
		if errors.As(err, &apiErr) && apiErr.Code >= 400 && apiErr.Code < 500 {
			return jetstream.StreamConfig{}, fmt.Errorf("%w: stream %s with subjects %s.>: %v", errRefused, cfg.Stream, cfg.Subject, err)
		}
		return jetstream.StreamConfig{}, fmt.Errorf("stream %s: %w", cfg.Stream, err)
	}
	got := s.CachedInfo().Config
	if err := durable(got, cfg); err != nil {
		return got, err
	}
	if got.Duplicates < cfg.DuplicateWindow {
		return got, fmt.Errorf("%w: stream %s keeps message ids for %s, less than the duplicate window %s: a re-publish after that is stored again; "+
			"raise the stream's (nats stream edit %s --dupe-window %s) or lower the sink's duplicate window",
			errRefused, cfg.Stream, got.Duplicates, cfg.DuplicateWindow, cfg.Stream, cfg.DuplicateWindow)
	}
	for _, subj := range got.Subjects {
		if covers(subj, want.Subjects[0]) {
			return got, nil
		}
	}
	return got, fmt.Errorf("%w: stream %s takes subjects %s, which do not include %s",
		errRefused, cfg.Stream, strings.Join(got.Subjects, ", "), want.Subjects[0])
}

// durable refuses a stream that can lose what JetStream acknowledged,
// since the sink commits its offsets on the acknowledgement: one in
// memory (a server restart empties it), or of one replica unless
// AllowSingleReplica says its server syncs every write
// (docs/consumers.md#nats-jetstream).
func durable(got jetstream.StreamConfig, cfg Config) error {
	if got.Storage == jetstream.MemoryStorage {
		return fmt.Errorf("%w: stream %s keeps its messages in memory: a restart of its servers loses what JetStream acknowledged, which the sink will not send again; "+
			"use a stream with file storage", errRefused, cfg.Stream)
	}
	if max(got.Replicas, 1) == 1 && !cfg.AllowSingleReplica {
		return fmt.Errorf("%w: stream %s has one replica, which acknowledges a message before it is on disk (synced every 2 minutes by default): "+
			"a crash of its server's machine loses it; give it 3 replicas (nats stream edit %s --replicas 3), or set ONCEFLOW_NATS_ALLOW_SINGLE_REPLICA=true on a server that syncs every write (sync_interval: always)",
			errRefused, cfg.Stream, cfg.Stream)
	}
	return nil
}

// covers reports whether every subject filter matches is also matched by
// pattern (both may hold wildcards).
func covers(pattern, filter string) bool {
	p, f := strings.Split(pattern, "."), strings.Split(filter, ".")
	for i, tok := range p {
		switch {
		case tok == ">":
			return i < len(f)
		case i >= len(f):
			return false
		case tok == "*":
			if f[i] == ">" {
				return false
			}
		case tok != f[i]:
			return false
		}
	}
	return len(p) == len(f)
}

// StreamInfo is what `onceflow lag` says of a sink's stream: whether it
// keeps what JetStream acknowledged (Durable, else Why not), and how far
// it is.
type StreamInfo struct {
	Stream   string `json:"stream"`
	Storage  string `json:"storage"` // file or memory
	Replicas int    `json:"replicas"`
	Messages uint64 `json:"messages"`
	LastSeq  uint64 `json:"last_sequence"`
	Durable  bool   `json:"durable"`
	Why      string `json:"why,omitempty"` // why not durable, as the sink would refuse it
}

// Describe connects to cfg's NATS servers as the sink does and reads its
// stream: its storage, replicas and state. It waits for no server.
func Describe(ctx context.Context, cfg Config) (StreamInfo, error) {
	// Replicas 1 without AllowSingleReplica is the sink's refusal to
	// create such a stream; Describe creates nothing.
	allow := cfg.AllowSingleReplica
	cfg.AllowSingleReplica = true
	if err := cfg.setDefaults(); err != nil {
		return StreamInfo{}, err
	}
	cfg.AllowSingleReplica = allow
	opts := []nats.Option{nats.Name("onceflow lag"), nats.Timeout(5 * time.Second)}
	if cfg.CredsFile != "" {
		opts = append(opts, nats.UserCredentials(cfg.CredsFile))
	}
	if cfg.CAFile != "" {
		opts = append(opts, nats.RootCAs(cfg.CAFile))
	}
	nc, err := nats.Connect(cfg.URL, opts...)
	if err != nil {
		return StreamInfo{}, fmt.Errorf("nats: connect: %w", err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return StreamInfo{}, err
	}
	s, err := js.Stream(ctx, cfg.Stream)
	if err != nil {
		return StreamInfo{}, fmt.Errorf("stream %s: %w", cfg.Stream, err)
	}
	info := s.CachedInfo()
	out := StreamInfo{Stream: cfg.Stream, Storage: strings.ToLower(info.Config.Storage.String()), Replicas: max(info.Config.Replicas, 1),
		Messages: info.State.Msgs, LastSeq: info.State.LastSeq, Durable: true}
	if err := durable(info.Config, cfg); err != nil {
		out.Durable, out.Why = false, strings.TrimPrefix(err.Error(), errRefused.Error()+": ")
	}
	return out, nil
}
