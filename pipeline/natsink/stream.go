package natsink

import (
	"context"
	"errors"
	"fmt"
	"strings"

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
