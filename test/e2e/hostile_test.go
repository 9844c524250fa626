package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/onceflow/onceflow/examples/ledger"
	"github.com/onceflow/onceflow/examples/ledger/ledgerapp"
	"github.com/onceflow/onceflow/pipeline"
	"github.com/onceflow/onceflow/pipeline/apiclient"
	"github.com/onceflow/onceflow/pipeline/ingest"
	"github.com/onceflow/onceflow/pipeline/kafka"
	"github.com/onceflow/onceflow/pipeline/pipelinetest"
	"github.com/onceflow/onceflow/pipeline/processor"
	"github.com/onceflow/onceflow/pipeline/webhooks"
)

// hostileMaxCommandBytes is the processor's MaxCommandBytes in
// TestHostileProducer: small, so a record can be too large for the
// processor and still be one the broker takes.
const hostileMaxCommandBytes = 4096

// A producer writing straight to the commands topic, as the README invites
// any client to do, sends every kind of poison the processor guards
// against, interleaved with good commands over HTTP to eight accounts
// (spread over the partitions) and good commands of its own: every good
// command is applied exactly once, every poison the broker took is in the
// DLQ once with its reason, the poisons that name a valid command of a
// valid account show `failed` with that reason in GET /v1/commands/{id},
// a command id reused on another account and by another tenant is
// another command, applied, and a record over the broker's limit is
// refused to its producer without holding anything up. The tenant has a
// webhook subscription to every event type, so each event also goes
// through the webhooks projection (no worker runs: the deliveries wait),
// which a record dated before year 0 stopped.
func TestHostileProducer(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	d := deployWith(t, ctx, map[string]string{
		"ONCEFLOW_TENANT_RATE_LIMIT":           "0",
		"ONCEFLOW_PROCESSOR_MAX_COMMAND_BYTES": fmt.Sprint(hostileMaxCommandBytes),
	})
	if _, _, err := webhooks.Create(ctx, d.pool, "acme", "every-event", "http://127.0.0.1:1/hook", nil); err != nil {
		t.Fatal(err)
	}
	betaKey := ingest.NewAPIKey()
	if err := ingest.CreateAPIKey(ctx, d.pool, "beta", "e2e", betaKey); err != nil {
		t.Fatal(err)
	}
	beta := &ledgerapp.Client{Client: &apiclient.Client{BaseURL: d.client.BaseURL, APIKey: betaKey}}
	run := fmt.Sprintf("%x", rand.Uint32())
	m := newModel()
	accounts := make([]string, 8)
	open := func(c *ledgerapp.Client, acct string) {
		acc, _, err := send(ctx, c, "open-"+acct, func(k string) (apiclient.Accepted, *apiclient.Response, error) {
			return c.OpenAccount(ctx, k, acct, "EUR")
		})
		if err != nil {
			t.Fatal(err)
		}
		m.accepted(acc.CommandID, acct, 0)
		// Opened before this producer's deposits to it arrive, which do
		// not wait for the relay.
		if cmd, err := c.WaitCommand(ctx, acc.CommandID); err != nil || cmd.Status != "accepted" {
			t.Fatalf("open %s: %+v, %v", acct, cmd, err)
		}
	}
	for i := range accounts {
		accounts[i] = fmt.Sprintf("acc-%s-%d", run, i)
		open(d.client, accounts[i])
	}
	foreign := "acc-" + run + "-beta"
	open(beta, foreign)
	acct0 := accounts[0]
	agg := func(tenant, acct string) string { return pipeline.AggregateID(tenant, acct) }

	// Good traffic over HTTP, all through the hostile records.
	stop := make(chan struct{})
	var wg sync.WaitGroup
	errs := make(chan error, len(accounts))
	for i, acct := range accounts {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for n := 0; ; n++ {
				select {
				case <-stop:
					return
				default:
				}
				amount := int64(1 + (i+n)%50)
				acc, _, err := send(ctx, d.client, fmt.Sprintf("dep-%s-%d", acct, n), func(k string) (apiclient.Accepted, *apiclient.Response, error) {
					return d.client.Deposit(ctx, k, acct, amount)
				})
				if err != nil {
					errs <- err
					return
				}
				m.accepted(acc.CommandID, acct, amount)
				time.Sleep(2 * time.Millisecond)
			}
		}()
	}

	serdes := registrySerdes(t, ctx, d.Pipeline)
	topic := d.Prefix + ".commands"
	record := func(aggregate string, id pipeline.ID, payload pipeline.Message) *kgo.Record {
		t.Helper()
		value, err := serdes.Commands.Encode(ctx, payload)
		if err != nil {
			t.Fatal(err)
		}
		rec, err := kafka.CommandRecord(topic, aggregate, id, payload.MessageType(), value, time.Now(), "")
		if err != nil {
			t.Fatal(err)
		}
		return rec
	}
	deposit := func(aggregate string) *kgo.Record {
		return record(aggregate, pipeline.NewCommandID(), ledger.Deposit{Amount: 7})
	}
	setHeader := func(r *kgo.Record, key, value string) *kgo.Record {
		for i := range r.Headers {
			if r.Headers[i].Key == key {
				r.Headers[i].Value = []byte(value)
			}
		}
		return r
	}
	withKey := func(key string) *kgo.Record {
		r := deposit(agg("acme", acct0))
		r.Key = []byte(key)
		return r
	}
	transfer := func(transferID, to string) *kgo.Record {
		return record(agg("acme", acct0), pipeline.NewCommandID(), ledger.RequestTransfer{TransferID: transferID, To: to, Amount: 1})
	}
	// Past the processor's MaxClockSkew (15 minutes) and inside Apache
	// Kafka 4's message.timestamp.after.max.ms (an hour), which refuses a
	// record dated later at produce (INVALID_TIMESTAMP; kfake takes it).
	future := deposit(agg("acme", acct0))
	future.Timestamp = time.Now().Add(30 * time.Minute)
	dated := func(at time.Time) *kgo.Record {
		r := deposit(agg("acme", acct0))
		r.Timestamp = at
		return r
	}
	type poison struct {
		name, reason string
		rec          *kgo.Record
		// failed: the key, tenant and command id are valid, so the
		// failure is recorded on the account and GET shows it.
		failed bool
	}
	poisons := []poison{
		{"key with invalid UTF-8", processor.ReasonInvalidKey, withKey("acme/acc\xff" + run), false},
		{"key with a NUL", processor.ReasonInvalidKey, withKey("acme/acc\x00" + run), false},
		{"key with an oversized local id", processor.ReasonInvalidKey, withKey("acme/" + strings.Repeat("a", pipeline.MaxLocalIDLen+1)), false},
		{"key without a tenant", processor.ReasonInvalidKey, withKey(acct0), false},
		{"field with a NUL", processor.ReasonInvalidField, transfer("t\x00"+run, accounts[1]), true},
		{"field with invalid UTF-8", processor.ReasonInvalidField, transfer("t\xc3\x28"+run, accounts[1]), true},
		{"oversized field", processor.ReasonInvalidField, transfer("t-"+run, strings.Repeat("b", pipeline.MaxLocalIDLen+1)), true},
		{"oversized command id", processor.ReasonInvalidCommandID, setHeader(deposit(agg("acme", acct0)), pipeline.HeaderCommandID, strings.Repeat("0", 300)), false},
		{"command id that is no UUID", processor.ReasonInvalidCommandID, setHeader(deposit(agg("acme", acct0)), pipeline.HeaderCommandID, "42"), false},
		{"tenant header of another tenant", processor.ReasonTenantMismatch, setHeader(deposit(agg("acme", acct0)), pipeline.HeaderTenant, "beta"), false},
		{"command type unlike the value", processor.ReasonCommandTypeMismatch, setHeader(deposit(agg("acme", acct0)), pipeline.HeaderCommandType, "Withdraw"), true},
		{"value that is not Avro", processor.ReasonUndecodable, func() *kgo.Record { r := deposit(agg("acme", acct0)); r.Value = []byte("{\"amount\": 7}"); return r }(), true},
		{"value over the processor's limit", processor.ReasonTooLarge, transfer("t-"+run, strings.Repeat("c", hostileMaxCommandBytes)), true},
		{"timestamp 30 minutes ahead", processor.ReasonFutureTimestamp, future, true},
		// Older than the commands topic keeps records (7 days) and a day;
		// before year 0 (no JSON encoder of a time takes it: the webhooks
		// projection retried it for ever); before 4713 BC (Postgres holds
		// no such date: the read models' partition parked).
		{"timestamp nine days back", processor.ReasonPastTimestamp, dated(time.Now().Add(-9 * 24 * time.Hour)), true},
		{"timestamp before year 0", processor.ReasonPastTimestamp, dated(time.Date(-1, 6, 1, 0, 0, 0, 0, time.UTC)), true},
		{"timestamp before 4713 BC", processor.ReasonPastTimestamp, dated(time.Date(-5000, 1, 1, 0, 0, 0, 0, time.UTC)), true},
		// 2 MiB that compress to a few KiB: the broker measures the
		// compressed batch and takes it; the DLQ copy leaves the value
		// out (dlq-omitted).
		{"value of 2 MiB, compressed", processor.ReasonTooLarge, transfer("t-"+run, strings.Repeat("z", 2<<20)), true},
	}

	// A command id the HTTP client had accepted for acct0, reused by this
	// producer for another account and by another tenant: two more
	// commands.
	first, _, err := send(ctx, d.client, "shared-"+run, func(k string) (apiclient.Accepted, *apiclient.Response, error) {
		return d.client.Deposit(ctx, k, acct0, 100)
	})
	if err != nil {
		t.Fatal(err)
	}
	m.accepted(first.CommandID, acct0, 100)
	sharedID := pipeline.MustParseID(first.CommandID)

	producer := pipelinetest.Client(t, d.Brokers(), kgo.ProducerBatchMaxBytes(4<<20), kgo.ProducerBatchCompression(kgo.ZstdCompression()))
	plain := pipelinetest.Client(t, d.Brokers(), kgo.ProducerBatchMaxBytes(4<<20), kgo.ProducerBatchCompression(kgo.NoCompression()))
	produceWith := func(cl *kgo.Client, r *kgo.Record) error {
		pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		return cl.ProduceSync(pctx, r).FirstErr()
	}
	produce := func(r *kgo.Record) error { return produceWith(producer, r) }
	var reused []*kgo.Record
	for _, a := range []string{agg("acme", accounts[1]), agg("beta", foreign)} {
		reused = append(reused, record(a, sharedID, ledger.Deposit{Amount: 100}))
	}
	taken := poisons[:0:0]
	for i, p := range poisons {
		if err := produce(p.rec); err != nil {
			// A broker may refuse a time before the epoch itself (Apache
			// Kafka's INVALID_TIMESTAMP; kfake takes it): refused at the
			// door is as good as the DLQ.
			if !(errors.Is(err, kerr.InvalidTimestamp) && p.rec.Timestamp.UnixMilli() < 0) {
				t.Fatalf("produce %s: %v", p.name, err)
			}
			t.Logf("%s: refused by the broker (%v)", p.name, err)
		} else {
			taken = append(taken, p)
		}
		if i < len(reused) {
			if err := produce(reused[i]); err != nil {
				t.Fatal(err)
			}
		}
		time.Sleep(20 * time.Millisecond) // interleaved with the HTTP traffic
	}
	poisons = taken
	// Over the topic's max.message.bytes (1 MiB) as sent: the broker
	// refuses it to its producer, for good.
	huge := transfer("t-"+run, strings.Repeat("d", 2<<20))
	if err := produceWith(plain, huge); !errors.Is(err, kerr.MessageTooLarge) {
		t.Errorf("a 2 MiB record: produce error %v, want MESSAGE_TOO_LARGE", err)
	}
	time.Sleep(500 * time.Millisecond) // good commands keep coming after it
	close(stop)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	m.balance[accounts[1]] += 100
	m.balance[foreign] += 100

	// Every good command has its outcome, and only the expected ones:
	// the client's, the two reused ids, the poisons recorded as failed.
	ids := make([]string, 0, len(m.commands))
	for id := range m.commands {
		ids = append(ids, id)
	}
	pipelinetest.Eventually(t, 90*time.Second, func() error {
		var notAccepted []string
		err := d.pool.QueryRow(ctx, `SELECT coalesce(array_agg(format('%s %s %s %s', command_id, aggregate_id, command_type, status)), '{}')
			FROM command_status WHERE command_id = ANY($1::uuid[]) AND status <> 'accepted'`, ids).Scan(&notAccepted)
		if err != nil {
			return err
		}
		if len(notAccepted) > 0 {
			return fmt.Errorf("%d of %d good commands not accepted yet: %v", len(notAccepted), len(ids), notAccepted[:min(len(notAccepted), 5)])
		}
		return nil
	})
	for acct, want := range m.balance {
		c := d.client
		if acct == foreign {
			c = beta
		}
		a, err := c.Account(ctx, acct)
		if err != nil {
			t.Fatalf("account %s: %v", acct, err)
		}
		if a.Balance != want {
			t.Errorf("account %s: balance %d, want %d", acct, a.Balance, want)
		}
	}
	for _, a := range []struct {
		c   *ledgerapp.Client
		agg string
	}{{d.client, agg("acme", acct0)}, {d.client, agg("acme", accounts[1])}, {beta, agg("beta", foreign)}} {
		var cmd apiclient.Command
		resp, err := a.c.Do(ctx, "GET", "/v1/commands/"+first.CommandID+"?aggregate_id="+url.QueryEscape(a.agg), "", nil)
		if err == nil && resp.Status == 200 {
			err = json.Unmarshal(resp.Body, &cmd)
		}
		if err != nil || resp.Status != 200 || cmd.Status != "accepted" || cmd.AggregateID != a.agg {
			t.Errorf("GET the reused command id on %s: %v %+v, want it accepted there", a.agg, err, cmd)
		}
	}

	// The DLQ holds each poison once, read_committed, with its reason.
	var dlq []*kgo.Record
	pipelinetest.Eventually(t, 30*time.Second, func() error {
		dlq = readEvents(t, ctx, d.BrokerAddr, d.Prefix+".commands.dlq")
		if len(dlq) < len(poisons) {
			return fmt.Errorf("DLQ holds %d records, want %d", len(dlq), len(poisons))
		}
		return nil
	})
	byID := map[string][]string{}
	for _, r := range dlq {
		byID[header(r, pipeline.HeaderCommandID)] = append(byID[header(r, pipeline.HeaderCommandID)], header(r, pipeline.HeaderDLQReason))
	}
	if len(dlq) != len(poisons) {
		t.Errorf("DLQ holds %d records, want %d (one per poison): %v", len(dlq), len(poisons), byID)
	}
	for _, p := range poisons {
		id := header(p.rec, pipeline.HeaderCommandID)
		found := false
		for _, r := range dlq {
			if header(r, pipeline.HeaderCommandID) == id && string(r.Key) == string(p.rec.Key) && header(r, pipeline.HeaderDLQReason) == p.reason {
				found = true
			}
		}
		if !found {
			t.Errorf("%s: not in the DLQ with reason %s (DLQ by command id: %v)", p.name, p.reason, byID[id])
		}
		for _, r := range dlq {
			if header(r, pipeline.HeaderCommandID) != id {
				continue
			}
			omitted, want := header(r, processor.HeaderDLQOmitted), ""
			if len(p.rec.Value) > 1<<20 {
				want = "value"
			}
			if omitted != want || (want == "" && !bytes.Equal(r.Value, p.rec.Value)) {
				t.Errorf("%s: DLQ copy of %d value bytes omits %q; want %q (and the value as it came otherwise)", p.name, len(r.Value), omitted, want)
			}
		}
		if !p.failed {
			continue
		}
		cmd, err := d.client.Command(ctx, id)
		if err != nil || cmd.Status != "failed" || cmd.Reason != p.reason {
			t.Errorf("%s: GET /v1/commands/%s = %+v, %v; want failed with reason %s", p.name, id, cmd, err, p.reason)
		}
	}

	// The events topic holds each event once, versions 1..n per account;
	// a CommandFailed carries the account's current version and does not
	// advance it (docs/consumers.md).
	seen := map[string]bool{}
	versions := map[string]int64{}
	failedEvents := map[string]int{}
	for _, r := range readEvents(t, ctx, d.BrokerAddr, d.Prefix+".events") {
		id := header(r, pipeline.HeaderEventID)
		if seen[id] {
			t.Errorf("event %s appears twice", id)
		}
		seen[id] = true
		var ver int64
		fmt.Sscan(header(r, pipeline.HeaderAggregateVersion), &ver)
		if header(r, pipeline.HeaderEventType) == "CommandFailed" {
			failedEvents[header(r, pipeline.HeaderCommandID)]++
			if ver != versions[string(r.Key)] {
				t.Errorf("%s: CommandFailed at version %d, want the current %d", r.Key, ver, versions[string(r.Key)])
			}
			continue
		}
		if ver != versions[string(r.Key)]+1 {
			t.Errorf("%s: version %d after %d", r.Key, ver, versions[string(r.Key)])
		}
		versions[string(r.Key)] = ver
	}
	wantFailed := map[string]int{}
	for _, p := range poisons {
		if p.failed {
			wantFailed[header(p.rec, pipeline.HeaderCommandID)]++
		}
	}
	// One event per good command (the reused id's two more included),
	// one per poison recorded as failed.
	if want := len(ids) + len(reused) + len(wantFailed); !maps.Equal(failedEvents, wantFailed) || len(seen) != want {
		t.Errorf("events topic: %d events, CommandFailed by command id %v; want %d events and %v", len(seen), failedEvents, want, wantFailed)
	}
}

// A producer writes a batch of a few KiB that decompresses to 32 MiB (the
// broker measures it compressed) among a tenant's commands. The processor
// (bounded at 16 MiB, the default) does not decompress it: that
// partition stops, and says so — the metric, `onceflow lag`
// (batch-too-large@OFFSET), the status page's lag — while the other
// partitions go on. An operator skips it with `onceflow commands
// skip-batch` on the processor's admin port, with the token: the DLQ records who skipped which offsets and why, and
// the command waiting behind the batch is applied.
func TestDecompressionBomb(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	const token = "e2e-admin-token"
	d := deployWith(t, ctx, map[string]string{"ONCEFLOW_ADMIN_TOKEN": token})
	run, acct, other := twoAccountsApart(t, ctx, d)
	serdes := registrySerdes(t, ctx, d.Pipeline)
	value, err := serdes.Commands.Encode(ctx, ledger.Deposit{Amount: 7})
	if err != nil {
		t.Fatal(err)
	}
	bomb, err := kafka.CommandRecord(d.Prefix+".commands", pipeline.AggregateID("acme", acct), pipeline.NewCommandID(), "Deposit", value, time.Now(), "")
	if err != nil {
		t.Fatal(err)
	}
	bomb.Value = make([]byte, 32<<20)
	bomber := pipelinetest.Client(t, []string{d.BrokerAddr}, kgo.ProducerBatchCompression(kgo.ZstdCompression()), kgo.ProducerBatchMaxBytes(64<<20))
	got, err := bomber.ProduceSync(ctx, bomb).First()
	if err != nil {
		t.Fatal(err)
	}
	behind, _, err := send(ctx, d.client, "dep-behind-"+run, func(k string) (apiclient.Accepted, *apiclient.Response, error) {
		return d.client.Deposit(ctx, k, acct, 5)
	})
	if err != nil {
		t.Fatal(err)
	}
	elsewhere, _, err := send(ctx, d.client, "dep-other-"+run, func(k string) (apiclient.Accepted, *apiclient.Response, error) {
		return d.client.Deposit(ctx, k, other, 3)
	})
	if err != nil {
		t.Fatal(err)
	}
	proc := d.comps["processor"]
	pipelinetest.Eventually(t, 60*time.Second, func() error {
		n, err := proc.Metric(ctx, "onceflow_processor_blocked_partitions")
		if err == nil && n != 1 {
			err = fmt.Errorf("blocked partitions %v, want 1", n)
		}
		return err
	})
	if cmd, err := d.client.WaitCommand(ctx, elsewhere.CommandID); err != nil || cmd.Status != "accepted" {
		t.Errorf("a deposit on another partition: %+v %v, want accepted", cmd, err)
	}
	if cmd, err := d.client.Command(ctx, behind.CommandID); err != nil || cmd.Status != "pending" {
		t.Errorf("the deposit behind the bomb: %+v %v, want pending", cmd, err)
	}
	want := fmt.Sprintf("batch-too-large@%d", got.Offset)
	out, err := runCLI(ctx, d.Pipeline, "lag", "-group", "onceflow-processor")
	if err != nil || !strings.Contains(out, want) {
		t.Errorf("onceflow lag does not show %s (%v):\n%s", want, err, out)
	}
	var st struct {
		Lag struct {
			Groups []struct {
				Group      string `json:"group"`
				Partitions []struct {
					Partition int32  `json:"partition"`
					Parked    string `json:"parked"`
				} `json:"partitions"`
			} `json:"groups"`
		} `json:"lag"`
	}
	pipelinetest.Eventually(t, 30*time.Second, func() error {
		if err := getJSON(ctx, proc.Admin+"/status.json", &st); err != nil {
			return err
		}
		for _, g := range st.Lag.Groups {
			for _, p := range g.Partitions {
				if g.Group == "onceflow-processor" && p.Partition == got.Partition && p.Parked == "batch-too-large" {
					return nil
				}
			}
		}
		return fmt.Errorf("the status page does not mark partition %d: %+v", got.Partition, st.Lag)
	})

	// The operator's command, as a user runs it: `onceflow commands
	// skip-batch` against the processor's admin address, with the token.
	skip := func(tok string, offset int64) (string, error) {
		return runCLIWith(ctx, d.Pipeline, map[string]string{"ONCEFLOW_ADMIN_TOKEN": tok}, "commands", "skip-batch",
			"-note", "32 MiB of zeros", "-operator", "e2e", "-admin-addr", proc.Admin, fmt.Sprint(got.Partition), fmt.Sprint(offset))
	}
	if out, err := skip("wrong", got.Offset); err == nil || !strings.Contains(out, "refused (401") {
		t.Errorf("a skip without the token: %v, want refused (401):\n%s", err, out)
	}
	if out, err := skip(token, got.Offset+1); err == nil || !strings.Contains(out, "nothing skipped") {
		t.Errorf("a skip at another offset: %v, want nothing skipped:\n%s", err, out)
	}
	if out, err := skip(token, got.Offset); err != nil || !strings.Contains(out, `skipped by admin-token (operator says "e2e"): 32 MiB of zeros`) {
		t.Fatalf("the skip: %v\n%s", err, out)
	}
	if cmd, err := d.client.WaitCommand(ctx, behind.CommandID); err != nil || cmd.Status != "accepted" {
		t.Errorf("the deposit behind the bomb after the skip: %+v %v, want accepted", cmd, err)
	}
	var audit *kgo.Record
	pipelinetest.Eventually(t, 30*time.Second, func() error {
		for _, r := range readEvents(t, ctx, d.BrokerAddr, d.Prefix+".commands.dlq") {
			if header(r, pipeline.HeaderDLQReason) == processor.ReasonBatchTooLarge {
				audit = r
				return nil
			}
		}
		return fmt.Errorf("no batch-too-large record in the DLQ")
	})
	if header(audit, pipeline.HeaderDLQSourceOffset) != fmt.Sprint(got.Offset) || !strings.Contains(header(audit, processor.HeaderDLQDetail), `admin-token (operator says "e2e"): 32 MiB of zeros`) {
		t.Errorf("the skip's DLQ record: offset %s, detail %q", header(audit, pipeline.HeaderDLQSourceOffset), header(audit, processor.HeaderDLQDetail))
	}
}

// twoAccountsApart opens two accounts of tenant acme whose commands are
// on different partitions of the commands topic (8), and returns the
// run's suffix and their ids once both are open.
func twoAccountsApart(t *testing.T, ctx context.Context, d *deployment) (run, acct, other string) {
	t.Helper()
	run = fmt.Sprintf("%x", rand.Uint32())
	part := func(a string) int {
		return kgo.StickyKeyPartitioner(nil).ForTopic("t").Partition(&kgo.Record{Key: []byte(pipeline.AggregateID("acme", a))}, 8)
	}
	acct, other = "acc-"+run+"-0", "acc-"+run+"-1"
	for i := 2; part(other) == part(acct); i++ {
		other = fmt.Sprintf("acc-%s-%d", run, i)
	}
	for _, a := range []string{acct, other} {
		acc, _, err := send(ctx, d.client, "open-"+a, func(k string) (apiclient.Accepted, *apiclient.Response, error) {
			return d.client.OpenAccount(ctx, k, a, "EUR")
		})
		if err != nil {
			t.Fatal(err)
		}
		if cmd, err := d.client.WaitCommand(ctx, acc.CommandID); err != nil || cmd.Status != "accepted" {
			t.Fatalf("open %s: %+v %v", a, cmd, err)
		}
	}
	return run, acct, other
}

// getJSON decodes what GET url answers.
func getJSON(ctx context.Context, url string, v any) error {
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	return json.NewDecoder(resp.Body).Decode(v)
}
