package command

// How the settings' values are read and checked, the logger they make,
// and the test-only hooks some of them install (settings.go declares them).

import (
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/onceflow/onceflow/pipeline/ingest"
	"github.com/onceflow/onceflow/pipeline/jobs"
	"github.com/onceflow/onceflow/pipeline/natsink"
	"github.com/onceflow/onceflow/pipeline/projector"
)

// buildLogger is the process logger; each component adds its own
// component attribute.
func buildLogger(c *config) error {
	var level slog.Level
	if err := level.UnmarshalText([]byte(c.logLevel)); err != nil {
		return fmt.Errorf("LOG_LEVEL %q: want debug, info, warn or error", c.logLevel)
	}
	opts := &slog.HandlerOptions{Level: level}
	switch strings.ToLower(c.logFormat) {
	case "text", "":
		c.Logger = slog.New(slog.NewTextHandler(c.stdout, opts))
	case "json":
		c.Logger = slog.New(slog.NewJSONHandler(c.stdout, opts))
	default:
		return fmt.Errorf("LOG_FORMAT %q: want text or json", c.logFormat)
	}
	return nil
}

// ingestHooks installs ingest's test-only hold after an inbound event
// when ONCEFLOW_INBOUND_HOLD names a prefix (ingest.HoldInbound); unset,
// as in production, ingest runs without it.
func ingestHooks(c *config) error {
	if prefix := c.getenv(ingest.InboundHoldEnv); prefix != "" {
		c.Ingest.AfterInbound = ingest.HoldInbound(prefix)
	}
	return nil
}

// projectorHooks installs the projector's test-only crash-point hook when
// ONCEFLOW_TEST_PROJECTOR_HOLD_DIR names a directory (projector.Hold);
// unset, as in production, the projector runs without it.
func projectorHooks(c *config) error {
	if dir := c.getenv(projector.HoldEnv); dir != "" {
		c.Projector.Hold = projector.HoldInDir(dir)
	}
	return nil
}

// natsinkHooks installs the NATS sink's test-only crash-point hook when
// ONCEFLOW_TEST_NATSINK_HOLD_DIR names a directory (natsink.Hold); unset,
// as in production, the sink runs without it.
func natsinkHooks(c *config) error {
	if dir := c.getenv(natsink.HoldEnv); dir != "" {
		c.NATSink.Hold = natsink.HoldInDir(dir)
	}
	return nil
}

// attempt is a job attempt's bound: the worker's attempt timeout, or half
// its lease (jobs.Config's default).
func attempt(w jobs.Config) time.Duration {
	if w.AttemptTimeout == 0 {
		return w.Lease / 2
	}
	return w.AttemptTimeout
}

// checkAttempt keeps a job attempt inside its lease.
func checkAttempt(c *config) error {
	if c.Worker.Lease > 0 && attempt(c.Worker) >= c.Worker.Lease {
		return fmt.Errorf("ONCEFLOW_WORKER_ATTEMPT_TIMEOUT %s: want less than ONCEFLOW_WORKER_LEASE (%s)", attempt(c.Worker), c.Worker.Lease)
	}
	return nil
}

// checkWebhookTimeout keeps a webhook request inside its job's attempt.
func checkWebhookTimeout(c *config) error {
	if a := attempt(c.Worker); a > 0 && c.Webhooks.Timeout >= a {
		return fmt.Errorf("ONCEFLOW_WEBHOOK_TIMEOUT %s: want less than the attempt timeout (%s: ONCEFLOW_WORKER_ATTEMPT_TIMEOUT, half of ONCEFLOW_WORKER_LEASE by default)", c.Webhooks.Timeout, a)
	}
	return nil
}

// positive parses a duration above zero; like is an example for the error.
func positive(v, like string) (time.Duration, error) {
	d, err := time.ParseDuration(v)
	if err != nil || d <= 0 {
		return 0, fmt.Errorf("want a positive duration like %s", like)
	}
	return d, nil
}

// atLeast parses a whole number of min or more.
func atLeast(v string, min int) (int, error) {
	n, err := strconv.Atoi(v)
	switch {
	case err != nil:
		return 0, errors.New("want a whole number")
	case n < min:
		return n, fmt.Errorf("want %d or more", min)
	}
	return n, nil
}

// boolean parses true or false (1, t, true, 0, f, false in any case, as
// strconv.ParseBool reads them); anything else is an error rather than
// false (KAFKA_TLS=yes once meant no TLS).
func boolean(v string) (bool, error) {
	b, err := strconv.ParseBool(v)
	if err != nil {
		return false, errors.New("want true or false")
	}
	return b, nil
}

// httpURL checks an http:// or https:// URL with a host; "" stays "".
func httpURL(v string) (string, error) {
	if v == "" {
		return "", nil
	}
	if u, err := url.Parse(v); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return "", errors.New("want an http:// or https:// URL")
	}
	return v, nil
}

// networks parses networks in CIDR notation, comma separated.
func networks(v string) ([]netip.Prefix, error) {
	var out []netip.Prefix
	for _, s := range strings.Split(v, ",") {
		if s = strings.TrimSpace(s); s == "" {
			continue
		}
		p, err := netip.ParsePrefix(s)
		if err != nil {
			return nil, errors.New("want networks like 10.0.0.0/8, comma separated")
		}
		out = append(out, p.Masked())
	}
	return out, nil
}

func hostname() string {
	h, _ := os.Hostname()
	return h
}
