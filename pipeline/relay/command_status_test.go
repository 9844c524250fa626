package relay_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/onceflow/onceflow/examples/ledger"
	"github.com/onceflow/onceflow/pipeline"
	"github.com/onceflow/onceflow/pipeline/avro"
	"github.com/onceflow/onceflow/pipeline/ingest"
	"github.com/onceflow/onceflow/pipeline/ingest/ingesttest"
	"github.com/onceflow/onceflow/pipeline/pipelinetest"
	"github.com/onceflow/onceflow/pipeline/projector"
	"github.com/onceflow/onceflow/pipeline/relay"
)

// ingestServer runs ingest on the env's database until the test ends and
// returns its URL and an API key of tenant acme.
func (e *env) ingestServer(t *testing.T) (url, key string) {
	t.Helper()
	ctx := context.Background()
	schemaText, err := ledger.SchemaOf(ledger.Commands)
	schema := []byte(schemaText)
	if err != nil {
		t.Fatal(err)
	}
	serde, err := avro.NewSerde(avro.NewEmbedded(), avro.ValueSubject(e.topics.Commands()), string(schema), ledger.CommandTypes())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := serde.Register(ctx); err != nil {
		t.Fatal(err)
	}
	srv, err := ingest.New(ingest.Config{RateLimit: -1}, ledgerRoutes(e.topics.Commands(), serde), nil, e.pool, logger(t), prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(http.DefaultClient.CloseIdleConnections) // after the server stops
	url, _ = ingesttest.Serve(t, srv)
	key = ingest.NewAPIKey()
	if err := ingest.CreateAPIKey(ctx, e.pool, "acme", "test", key); err != nil {
		t.Fatal(err)
	}
	return url, key
}

// call sends one request to ingest and decodes its JSON answer.
func call(t *testing.T, method, url, key, idemKey, body string) (int, map[string]any) {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+key)
	if idemKey != "" {
		req.Header.Set("Idempotency-Key", idemKey)
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	var out map[string]any
	if err := json.Unmarshal(raw, &out); err != nil {
		t.Fatalf("%s %s: %d %s: %v", method, url, resp.StatusCode, raw, err)
	}
	return resp.StatusCode, out
}

// A command accepted over HTTP whose record the broker refuses for good
// is not pending forever: the move of its outbox row to outbox_dead marks
// it failed with the broker's reason, and GET /v1/commands/{id} (even a
// waiting one) shows it. Once the operator raises the limit and re-queues
// the row (docs/relay.md), the command reaches Kafka, and its outcome
// replaces the failure.
func TestDeadRowFailsItsCommand(t *testing.T) {
	pipelinetest.EmbeddedOnly(t, "message.max.bytes lowered for the test", "TestRelayBrokerRestart (test/e2e), whose row over 1 MB Apache Kafka refuses (MESSAGE_TOO_LARGE) to outbox_dead")
	t.Parallel()
	e := newEnv(t, kfake.BrokerConfigs(map[string]string{"message.max.bytes": "100"}))
	ctx := context.Background()
	url, key := e.ingestServer(t)
	status, body := call(t, http.MethodPost, url+"/v1/accounts/acc-1/deposits", key, "d1", `{"amount":5}`)
	if status != http.StatusAccepted {
		t.Fatalf("deposit: %d %v", status, body)
	}
	id := body["command_id"].(string)

	r := e.start(t, relay.Config{})
	e.waitEmpty(t, 30*time.Second)
	status, body = call(t, http.MethodGet, url+"/v1/commands/"+id+"?wait=10s", key, "", "")
	if status != http.StatusOK || body["status"] != "failed" || body["reason"] != "MESSAGE_TOO_LARGE" || !strings.Contains(body["detail"].(string), "MESSAGE_TOO_LARGE") {
		t.Fatalf("GET after the row went to outbox_dead: %d %v, want 200 failed with the broker's reason", status, body)
	}
	if got := testutil.ToFloat64(metric(t, r.reg, "onceflow_outbox_dead_rows_total", "reason", "MESSAGE_TOO_LARGE")); got != 1 {
		t.Errorf("dead rows: %v, want 1", got)
	}

	// The operator raises the topic's limit and re-queues the row.
	adm := kadm.NewClient(pipelinetest.Client(t, e.brokers))
	v := "1048588"
	if _, err := adm.AlterTopicConfigs(ctx, []kadm.AlterConfig{{Name: "max.message.bytes", Value: &v}}, e.topics.Commands()); err != nil {
		t.Fatal(err)
	}
	if _, err := e.pool.Exec(ctx, `WITH d AS (DELETE FROM outbox_dead RETURNING shard, topic, key, value, headers, created_at)
		INSERT INTO outbox (shard, topic, key, value, headers, created_at) SELECT * FROM d`); err != nil {
		t.Fatal(err)
	}
	e.waitEmpty(t, 30*time.Second)
	recs := e.readTopic(t, e.topics.Commands(), 1)
	if len(recs) != 1 || header(recs[0], pipeline.HeaderCommandID) != id {
		t.Fatalf("%d records after the re-queue, want the command", len(recs))
	}
	if _, body = call(t, http.MethodGet, url+"/v1/commands/"+id, key, "", ""); body["status"] != "failed" {
		t.Errorf("GET before the outcome: %v, want failed still", body)
	}
	// Its outcome, as the projector records it.
	cmd, _ := pipeline.ParseID(id)
	agg := pipeline.AggregateID("acme", "acc-1")
	err := pgx.BeginFunc(ctx, e.pool, func(tx pgx.Tx) error {
		return projector.CommandStatus{}.Apply(ctx, tx, pipeline.Event{ID: pipeline.EventID(agg, cmd, 0), CommandID: cmd, Tenant: "acme",
			AggregateID: agg, Version: 1, Time: time.Now(), Payload: ledger.Deposited{Amount: 5}})
	})
	if err != nil {
		t.Fatal(err)
	}
	if status, body = call(t, http.MethodGet, url+"/v1/commands/"+id, key, "", ""); body["status"] != "accepted" || body["reason"] != nil {
		t.Errorf("GET after the outcome: %d %v, want accepted", status, body)
	}
}

// A row that goes to outbox_dead because its headers cannot be shipped
// fails its command: the one its command-id names in its tenant and
// aggregate (the record key), no other; a command that already has an
// outcome keeps it; a command-id that is not a UUID fails nothing and
// does not stop the move.
func TestInvalidHeadersRowFailsOnlyItsCommand(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	agg := "acme/acc-hdr"
	shard := pipeline.OutboxShard(agg, pipeline.DefaultOutboxShards)
	pendingID, decidedID, mismatchID := pipeline.NewCommandID(), pipeline.NewCommandID(), pipeline.NewCommandID()
	for _, r := range []struct {
		id                  pipeline.ID
		tenant, agg, status string
	}{
		{pendingID, "acme", agg, "pending"},
		{pendingID, "acme", "acme/acc-other", "pending"}, // the same id on another aggregate
		{pendingID, "b", "b/acc-hdr", "pending"},         // and in another tenant
		{decidedID, "acme", agg, "accepted"},
		{mismatchID, "acme", agg, "pending"},
	} {
		if _, err := e.pool.Exec(ctx, `INSERT INTO command_status (command_id, tenant, aggregate_id, command_type, status, ingested)
			VALUES ($1, $2, $3, 'Deposit', $4, true)`, r.id.String(), r.tenant, r.agg, r.status); err != nil {
			t.Fatal(err)
		}
	}
	for _, h := range []string{
		`{"command-id": "` + pendingID.String() + `", "tenant": "acme", "command-type": "Deposit", "x-count": 1}`,
		`{"command-id": "` + decidedID.String() + `", "tenant": "acme", "command-type": "Deposit", "x-count": 1}`,
		`{"command-id": "not-a-uuid", "tenant": "acme", "x-count": 1}`,
		// Tenant b's command on acme's aggregate (poison): not acme's.
		`{"command-id": "` + mismatchID.String() + `", "tenant": "b", "command-type": "Deposit", "x-count": 1}`,
		`["` + pendingID.String() + `"]`,
	} {
		if _, err := e.pool.Exec(ctx, `INSERT INTO outbox (shard, topic, key, value, headers) VALUES ($1, $2, $3, 'x', $4::jsonb)`,
			shard, e.topics.Commands(), []byte(agg), h); err != nil {
			t.Fatal(err)
		}
	}
	e.insert(t, agg, 1, 10)
	e.start(t, relay.Config{})
	e.waitEmpty(t, 30*time.Second)
	e.readTopic(t, e.topics.Commands(), 1)

	for _, w := range []struct {
		id                          pipeline.ID
		tenant, agg, status, reason string
	}{
		{pendingID, "acme", agg, "failed", "INVALID_HEADERS"},
		{pendingID, "acme", "acme/acc-other", "pending", ""},
		{pendingID, "b", "b/acc-hdr", "pending", ""},
		{decidedID, "acme", agg, "accepted", ""},
		{mismatchID, "acme", agg, "pending", ""},
	} {
		var status, reason, detail string
		err := e.pool.QueryRow(ctx, `SELECT status, coalesce(reason, ''), coalesce(detail, '') FROM command_status
			WHERE command_id = $1 AND tenant = $2 AND aggregate_id = $3`, w.id.String(), w.tenant, w.agg).Scan(&status, &reason, &detail)
		if err != nil || status != w.status || reason != w.reason || (w.reason != "" && detail == "") {
			t.Errorf("%s %s: %s %q %q (%v), want %s %q", w.tenant, w.agg, status, reason, detail, err, w.status, w.reason)
		}
	}
	var dead int
	if err := e.pool.QueryRow(ctx, `SELECT count(*) FROM outbox_dead`).Scan(&dead); err != nil || dead != 5 {
		t.Errorf("%d dead rows (%v), want 5", dead, err)
	}
}

// The pending-command gauges: how many commands wait for an outcome and
// the age of the oldest, read from command_status at most once per
// BacklogMetricsTTL however often they are scraped.
func TestPendingCommandGauges(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	if _, err := e.pool.Exec(ctx, `INSERT INTO command_status (command_id, tenant, aggregate_id, command_type, status, created_at)
		SELECT gen_random_uuid(), 'acme', 'acme/a', 'Deposit', s, now() - make_interval(mins => m)
		FROM (VALUES ('pending', 5), ('pending', 1), ('accepted', 60), ('failed', 90), ('rejected', 70)) AS v(s, m)`); err != nil {
		t.Fatal(err)
	}
	gauges := func(refresh time.Duration) func() (float64, float64) {
		reg := prometheus.NewRegistry()
		if _, err := relay.New(relay.Config{BacklogMetricsTTL: refresh}, e.pool, e.kafka, logger(t), reg); err != nil {
			t.Fatal(err)
		}
		return func() (float64, float64) {
			return testutil.ToFloat64(metric(t, reg, "onceflow_commands_pending")),
				testutil.ToFloat64(metric(t, reg, "onceflow_commands_oldest_pending_age_seconds"))
		}
	}
	cached, fresh := gauges(time.Hour), gauges(time.Nanosecond)
	for _, g := range []func() (float64, float64){cached, fresh} {
		if n, age := g(); n != 2 || age < 300 || age > 400 {
			t.Errorf("pending %v, oldest %vs; want 2 and about 300s (the 5 minutes old one)", n, age)
		}
	}
	if _, err := e.pool.Exec(ctx, `UPDATE command_status SET status = 'accepted' WHERE status = 'pending'`); err != nil {
		t.Fatal(err)
	}
	if n, _ := cached(); n != 2 {
		t.Errorf("within the TTL: pending %v, want the value read before (2)", n)
	}
	if n, age := fresh(); n != 0 || age != 0 {
		t.Errorf("none pending: %v, oldest %vs; want 0 and 0", n, age)
	}
}
