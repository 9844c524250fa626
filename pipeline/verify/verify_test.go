package verify_test

import (
	"context"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/onceflow/onceflow/pipeline"
	"github.com/onceflow/onceflow/pipeline/pipelinetest"
	"github.com/onceflow/onceflow/pipeline/verify"
)

// The stages cli's TestVerify does not break, on records written as the
// pipeline writes them (the embedded broker, a real Postgres): a command
// on the commands topic its processor group is past with no event (lost
// at the processor) and one it is not past yet (pending), a command
// waiting in the outbox past the bound (pending at the relay) and one
// within it (nothing), another tenant's lost command left out with
// -tenant, and an event older than the inbox's retention, which has no
// inbox row and is not reported lost but said not checked.
func TestStages(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	brokers := pipelinetest.Broker(t).Addrs()
	topics := pipelinetest.Topics(t, brokers, 1)
	cl := pipelinetest.Client(t, brokers)
	pool, _ := pipelinetest.Pool(t)
	exec := func(sql string, args ...any) {
		t.Helper()
		if _, err := pool.Exec(ctx, sql, args...); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	command := func(agg, id string) *kgo.Record {
		return &kgo.Record{Topic: topics.Commands(), Key: []byte(agg), Value: []byte("x"), Headers: []kgo.RecordHeader{
			{Key: pipeline.HeaderCommandID, Value: []byte(id)}, {Key: pipeline.HeaderTenant, Value: []byte("acme")}}}
	}
	past, behind, other := pipeline.NewCommandID().String(), pipeline.NewCommandID().String(), pipeline.NewCommandID().String()
	old := pipeline.NewCommandID().String()
	oldEvent := &kgo.Record{Topic: topics.Events(), Key: []byte("acme/acc-9"), Value: []byte("x"), Timestamp: time.Now().Add(-40 * 24 * time.Hour),
		Headers: []kgo.RecordHeader{{Key: pipeline.HeaderEventID, Value: []byte(pipeline.NewCommandID().String())},
			{Key: pipeline.HeaderCommandID, Value: []byte(old)}, {Key: pipeline.HeaderTenant, Value: []byte("acme")}}}
	if err := cl.ProduceSync(ctx, command("acme/acc-1", past), command("beta/acc-1", other), oldEvent).FirstErr(); err != nil {
		t.Fatal(err)
	}
	// The processor has read both, and the projector every event.
	offs := kadm.Offsets{}
	offs.AddOffset(topics.Commands(), 0, 2, -1)
	if err := kadm.NewClient(cl).CommitAllOffsets(ctx, "processor", offs); err != nil {
		t.Fatal(err)
	}
	if err := cl.ProduceSync(ctx, command("acme/acc-2", behind)).FirstErr(); err != nil {
		t.Fatal(err)
	}
	exec(`INSERT INTO consumer_offsets (consumer, topic, partition, next_offset) VALUES ('projector', $1, 0, 1)`, topics.Events())
	waiting, fresh := pipeline.NewCommandID().String(), pipeline.NewCommandID().String()
	for _, c := range []struct {
		id, agg string
		age     time.Duration
	}{{past, "acme/acc-1", 0}, {behind, "acme/acc-2", 0}, {other, "beta/acc-1", 0}, {waiting, "acme/acc-3", 10 * time.Minute}, {fresh, "acme/acc-4", 0}} {
		exec(`INSERT INTO command_status (command_id, tenant, aggregate_id, command_type, status, ingested, created_at)
			VALUES ($1, split_part($2, '/', 1), $2, 'Deposit', 'pending', true, now() - $3::interval)`, c.id, c.agg, c.age.String())
	}
	for _, c := range []struct {
		id, agg string
		age     time.Duration
	}{{waiting, "acme/acc-3", 10 * time.Minute}, {fresh, "acme/acc-4", 0}} {
		exec(`INSERT INTO outbox (shard, topic, key, value, headers, created_at) VALUES (0, $1, convert_to($2, 'UTF8'), '\x00', jsonb_build_object('command-id', $3::text), now() - $4::interval)`,
			topics.Commands(), c.agg, c.id, c.age.String())
	}

	cfg := verify.Config{From: time.Now().Add(-time.Hour), Tenant: "acme",
		Commands: []verify.CommandsTopic{{Topic: topics.Commands(), Group: "processor"}},
		Events:   []verify.EventsTopic{{Topic: topics.Events(), Projectors: []string{"projector"}}}}
	check := func(cfg verify.Config, want map[string]string) *verify.Report {
		t.Helper()
		rep, err := verify.Run(ctx, cfg, pool, cl)
		if err != nil {
			t.Fatal(err)
		}
		got := map[string]string{}
		for _, f := range rep.Findings {
			got[f.CommandID] = f.Stage + " " + f.Kind
		}
		for id, w := range want {
			if got[id] != w {
				t.Errorf("command %s: %q, want %q (findings %+v)", id, got[id], w, rep.Findings)
			}
		}
		if len(rep.Findings) != len(want) {
			t.Errorf("%d findings, want %d: %+v", len(rep.Findings), len(want), rep.Findings)
		}
		return rep
	}
	// A bound of a minute: the command behind the processor is pending
	// only once it waited that long; the one in the outbox for 10 minutes
	// is.
	cfg.PendingBound = time.Minute
	rep := check(cfg, map[string]string{past: "processor lost", waiting: "relay pending"})
	if rep.OK() {
		t.Error("a lost command: OK")
	}
	cfg.PendingBound = time.Nanosecond
	check(cfg, map[string]string{past: "processor lost", waiting: "relay pending", fresh: "relay pending", behind: "processor pending"})
	cfg.Tenant = ""
	check(cfg, map[string]string{past: "processor lost", other: "processor lost", waiting: "relay pending", fresh: "relay pending", behind: "processor pending"})
	// A window reaching past the inbox's retention: the old event is not
	// checked at the projector, and the report says so.
	cfg.From, cfg.PendingBound = time.Now().Add(-45*24*time.Hour), time.Hour
	rep = check(cfg, map[string]string{past: "processor lost", other: "processor lost"})
	if len(rep.NotChecked) != 1 {
		t.Errorf("not checked %q, want the inbox's retention", rep.NotChecked)
	}
}
