package ingest

import (
	"errors"
	"time"
)

// Config configures the ingest server. Zero values mean the defaults.
type Config struct {
	// Addr is the HTTP listen address (HTTP_ADDR). Default ":8080".
	Addr string
	// CommandsTopic is where accepted commands go ({prefix}.commands).
	// Required.
	CommandsTopic string
	// Shards is the number of outbox shards; it must match the relay's.
	// Default 16.
	Shards int
	// IdempotencyRetention is how long a key is remembered. Default 24h.
	IdempotencyRetention time.Duration
	// MaxBodyBytes bounds request bodies. Default 1 MiB.
	MaxBodyBytes int64
	// OnAccept, if set, is called after each transaction that accepted
	// commands commits: `onceflow dev` wires it to the relay's wake-up so
	// commands leave the outbox at once instead of at the next poll.
	OnAccept func()
}

func (c *Config) setDefaults() {
	if c.Addr == "" {
		c.Addr = ":8080"
	}
	if c.Shards == 0 {
		c.Shards = 16
	}
	if c.IdempotencyRetention == 0 {
		c.IdempotencyRetention = 24 * time.Hour
	}
	if c.MaxBodyBytes == 0 {
		c.MaxBodyBytes = 1 << 20
	}
}

func (c *Config) validate() error {
	var errs []error
	if c.CommandsTopic == "" {
		errs = append(errs, errors.New("ingest: CommandsTopic is required"))
	}
	if c.Shards < 1 {
		errs = append(errs, errors.New("ingest: Shards must be positive"))
	}
	if c.IdempotencyRetention < time.Minute {
		errs = append(errs, errors.New("ingest: IdempotencyRetention must be at least a minute"))
	}
	return errors.Join(errs...)
}
