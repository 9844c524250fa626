package postgres_test

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/onceflow/onceflow/pipeline"
	"github.com/onceflow/onceflow/pipeline/pipelinetest"
	"github.com/onceflow/onceflow/pipeline/postgres"
)

// Outcome payloads name every id, each under Postgres's payload limit;
// too many ids are "*" (every waiter looks again), and what a payload
// names reads back.
func TestOutcomePayloads(t *testing.T) {
	for _, n := range []int{1, 239, 240, 1000, 3800, 5000} {
		ids := make([]pipeline.ID, n)
		for i := range ids {
			ids[i] = pipeline.NewCommandID()
		}
		payloads := postgres.OutcomePayloads(ids)
		var got []pipeline.ID
		for _, p := range payloads {
			if len(p) >= 8000 {
				t.Fatalf("%d ids: a payload of %d bytes, over Postgres's 8000", n, len(p))
			}
			part, err := postgres.ParseOutcomePayload(p)
			if errors.Is(err, postgres.ErrAllOutcomes) {
				got = nil
				if len(payloads) != 1 {
					t.Fatalf("%d ids: \"*\" among %d payloads", n, len(payloads))
				}
				break
			}
			got = append(got, part...)
		}
		if got != nil && !slices.Equal(got, ids) {
			t.Errorf("%d ids: read back %d of them", n, len(got))
		}
		if got == nil && n < 3000 {
			t.Errorf("%d ids: answered \"*\", want them named", n)
		}
	}
	if _, err := postgres.ParseOutcomePayload(""); !errors.Is(err, postgres.ErrAllOutcomes) {
		t.Errorf("an empty payload (a fresh connection): %v, want ErrAllOutcomes", err)
	}
	if ids, err := postgres.ParseOutcomePayload("zz,0123"); err != nil || len(ids) != 0 {
		t.Errorf("garbage: %v, %v; want nothing named", ids, err)
	}
}

// An outbox payload names the shards a commit wrote to and reads back;
// shards beyond Postgres's payload limit, and anything the relay cannot
// read whole, mean every shard (nil).
func TestOutboxPayloads(t *testing.T) {
	for _, shards := range [][]int{{0}, {3, 15}, {4095, 0, 17}} {
		p := postgres.OutboxPayload(shards)
		if got := postgres.ParseOutboxPayload(p); !slices.Equal(got, shards) {
			t.Errorf("%v: payload %q read back as %v", shards, p, got)
		}
	}
	all := make([]int, 4096)
	for i := range all {
		all[i] = i
	}
	if p := postgres.OutboxPayload(all); p != "" {
		t.Errorf("4096 shards: a payload of %d bytes, want an empty one (every shard)", len(p))
	}
	for _, p := range []string{"", "3,x", "-1", "3,,4"} {
		if got := postgres.ParseOutboxPayload(p); got != nil {
			t.Errorf("%q: read as %v, want nil (every shard)", p, got)
		}
	}
}

// Notify reaches a listener, and its asynchronous commit stays its own:
// the connection it ran on commits synchronously again afterwards.
func TestNotifyDeliversAndLeavesCommitsSynchronous(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	url := pipelinetest.DatabaseURL(t)
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = 1
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	listener, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer listener.Close(context.Background())
	if _, err := listener.Exec(ctx, "LISTEN "+postgres.OutboxChannel); err != nil {
		t.Fatal(err)
	}
	if err := postgres.Notify(ctx, pool, postgres.OutboxChannel, "hello"); err != nil {
		t.Fatal(err)
	}
	n, err := listener.WaitForNotification(ctx)
	if err != nil || n.Payload != "hello" {
		t.Fatalf("notification: %+v %v", n, err)
	}
	var sc string
	if err := pool.QueryRow(ctx, "SHOW synchronous_commit").Scan(&sc); err != nil || sc != "on" {
		t.Errorf("synchronous_commit after Notify: %q (%v), want on", sc, err)
	}
}
