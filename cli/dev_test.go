package cli_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/onceflow/onceflow/examples/ledger/ledgerapp"
	"github.com/onceflow/onceflow/pipeline/admin/status"
	"github.com/onceflow/onceflow/pipeline/apiclient"
	"github.com/onceflow/onceflow/pipeline/natsink/natsinktest"
	"github.com/onceflow/onceflow/pipeline/pipelinetest"
	"github.com/onceflow/onceflow/pipeline/postgres"
	"github.com/onceflow/onceflow/pipeline/webhooks"
	"github.com/onceflow/onceflow/pipeline/webhooks/webhookstest"
)

// startDev runs `onceflow dev` with env on ports of its own until the
// test ends, and returns ingest's base URL once its banner is out.
func startDev(t *testing.T, ctx context.Context, env map[string]string) (string, *pipelinetest.Buffer) {
	t.Helper()
	out := &pipelinetest.Buffer{}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		done <- run(runCtx, []string{"dev", "-data-dir", t.TempDir(), "-broker-addr", "127.0.0.1:0", "-registry-addr", "127.0.0.1:0",
			"-http-addr", "127.0.0.1:0", "-admin-addr", "127.0.0.1:0"}, func(k string) string { return env[k] }, out)
	}()
	t.Cleanup(func() {
		stop()
		if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
			t.Errorf("dev: %v", err)
		}
	})
	ingest := regexp.MustCompile(`ingest +(http://\S+)`)
	var base string
	pipelinetest.Eventually(t, time.Minute, func() error {
		select {
		case err := <-done:
			done <- err
			t.Fatalf("dev stopped: %v\n%s", err, out.String())
		default:
		}
		m := ingest.FindStringSubmatch(out.String())
		if m == nil {
			return errors.New("no banner yet")
		}
		base = m[1]
		return nil
	})
	return base, out
}

// `onceflow dev` with ONCEFLOW_WEBHOOK_ALLOW_NETWORKS, as its banner
// advises for a receiver on the machine, delivers to a receiver on
// 127.0.0.1: the setting reaches dev's worker (dev once ignored it, and
// every delivery ended dead, "address not allowed"), and the banner names
// the network instead of advising the setting again.
func TestDevDeliversToAnAllowedNetwork(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	url := pipelinetest.DatabaseURL(t, ledgerMigrations)
	env := map[string]string{"DATABASE_URL": url, "ONCEFLOW_DEV_API_KEY": "of_dev_test_key",
		"ONCEFLOW_WEBHOOK_ALLOW_NETWORKS": "127.0.0.1/32", "ONCEFLOW_PARTITIONS": "1"}
	base, out := startDev(t, ctx, env)
	if strings.Contains(out.String(), "NATS sink") {
		t.Errorf("dev runs the NATS sink without ONCEFLOW_NATS_URL:\n%s", out.String())
	}

	// The banner says what it allows, rather than advising the setting it
	// was given.
	if banner := out.String(); !strings.Contains(banner, "receivers may also be\nin 127.0.0.1/32 (ONCEFLOW_WEBHOOK_ALLOW_NETWORKS).") {
		t.Errorf("the banner does not name the allowed network:\n%s", banner)
	}
	receiver := webhookstest.New(nil, nil)
	t.Cleanup(receiver.Close)
	pool, err := postgres.Connect(ctx, url, 2)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	sub, _, err := webhooks.Create(ctx, pool, "demo", "hook", receiver.URL, nil)
	if err != nil {
		t.Fatal(err)
	}
	receiver.SetSecrets([]string{sub.Secret})
	api := ledgerapp.Client{Client: &apiclient.Client{BaseURL: base, APIKey: env["ONCEFLOW_DEV_API_KEY"]}}
	if _, _, err := api.OpenAccount(ctx, "open-1", "acc-1", "EUR"); err != nil {
		t.Fatal(err)
	}
	pipelinetest.Eventually(t, time.Minute, func() error {
		ds, err := webhooks.Deliveries(ctx, pool, webhooks.Filter{Tenant: "demo", Limit: 10})
		if err != nil {
			return err
		}
		if len(ds) == 0 {
			return errors.New("no delivery yet")
		}
		if d := ds[0]; d.Status != "delivered" {
			last := ""
			if d.LastError != nil {
				last = *d.LastError
			}
			if d.Status == "dead" {
				t.Fatalf("the delivery is dead: %s", last)
			}
			return fmt.Errorf("delivery %s: %s", d.Status, last)
		}
		return nil
	})
	if receiver.Effects() != 1 {
		t.Errorf("the receiver applied %d deliveries, want 1 (bad: %v)", receiver.Effects(), receiver.Bad())
	}
}

// `onceflow dev` with ONCEFLOW_NATS_URL runs the NATS sink too (off
// without it, above): its banner says where the events go, and a command's
// event reaches the stream on its tenant's and type's subject.
func TestDevRunsTheNATSinkWithAURL(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	ns := natsinktest.Start(t)
	env := map[string]string{"DATABASE_URL": pipelinetest.DatabaseURL(t, ledgerMigrations), "ONCEFLOW_DEV_API_KEY": "of_dev_test_key",
		"ONCEFLOW_PARTITIONS": "1", "ONCEFLOW_NATS_URL": ns.URL}
	base, out := startDev(t, ctx, env)
	if !strings.Contains(out.String(), "NATS sink: ledger.events -> JetStream stream ledger_events") {
		t.Errorf("dev's banner does not show the NATS sink:\n%s", out.String())
	}
	api := ledgerapp.Client{Client: &apiclient.Client{BaseURL: base, APIKey: env["ONCEFLOW_DEV_API_KEY"]}}
	if _, _, err := api.OpenAccount(ctx, "open-1", "acc-1", "EUR"); err != nil {
		t.Fatal(err)
	}
	_, js := ns.Connect(t)
	pipelinetest.Eventually(t, time.Minute, func() error {
		msgs, err := natsinktest.Messages(ctx, js, "ledger_events")
		if err != nil {
			return err
		}
		if len(msgs) != 1 {
			return fmt.Errorf("%d messages in the stream, want 1", len(msgs))
		}
		if got := msgs[0].Subject(); got != "ledger.events.demo.AccountOpened" {
			t.Fatalf("subject %q, want ledger.events.demo.AccountOpened", got)
		}
		return nil
	})
	// The status page shows the sink's stage with the event it forwarded.
	admin := regexp.MustCompile(`admin +(http://\S+)/status`).FindStringSubmatch(out.String())
	if admin == nil {
		t.Fatalf("no admin address in the banner:\n%s", out.String())
	}
	pipelinetest.Eventually(t, time.Minute, func() error {
		resp, err := http.Get(admin[1] + "/status.json")
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		var st status.Status
		if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
			return err
		}
		if !slices.Contains(st.Components, "natsink") {
			t.Fatalf("components %v, want natsink among them", st.Components)
		}
		for _, s := range st.Flow {
			if s.Name == "natsink" && s.Present && len(s.Rates) > 0 && s.Rates[0].Total == 1 &&
				len(s.Facts) == 1 && s.Facts[0].Value == "ledger_events, file storage, replicas 1" {
				return nil
			}
		}
		return fmt.Errorf("no natsink stage with 1 event to JetStream on ledger_events, file storage, replicas 1: %+v", st.Flow)
	})

	// onceflow lag says what the stream keeps: a trial's one replica is
	// not durable unless its server syncs every write.
	kafkaAddr := regexp.MustCompile(`kafka +(\S+)`).FindStringSubmatch(out.String())
	if kafkaAddr == nil {
		t.Fatalf("no kafka address in the banner:\n%s", out.String())
	}
	lagEnv := map[string]string{"KAFKA_BROKERS": kafkaAddr[1], "ONCEFLOW_NATS_URL": ns.URL, "DATABASE_URL": env["DATABASE_URL"]}
	var lag bytes.Buffer
	if err := run(ctx, []string{"lag"}, func(k string) string { return lagEnv[k] }, &lag); err != nil {
		t.Fatalf("lag: %v\n%s", err, lag.String())
	}
	if !strings.Contains(lag.String(), "NATS stream ledger_events: file storage, 1 replica, 1 messages") || !strings.Contains(lag.String(), "NOT DURABLE: stream ledger_events has one replica") {
		t.Errorf("lag does not say what the stream keeps:\n%s", lag.String())
	}
	lagEnv["ONCEFLOW_NATS_ALLOW_SINGLE_REPLICA"] = "true"
	lag.Reset()
	if err := run(ctx, []string{"lag"}, func(k string) string { return lagEnv[k] }, &lag); err != nil || strings.Contains(lag.String(), "NOT DURABLE") {
		t.Errorf("lag with one replica allowed: %v\n%s", err, lag.String())
	}
}

// The NATS sink without ONCEFLOW_NATS_URL stops at once, naming it,
// before it reaches for Kafka (here a broker that is not there).
func TestNATSinkNeedsAURL(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err := run(ctx, []string{"natsink", "-kafka-brokers", "127.0.0.1:1", "-admin-addr", "127.0.0.1:0"}, func(string) string { return "" }, &pipelinetest.Buffer{})
	if err == nil || !strings.Contains(err.Error(), "ONCEFLOW_NATS_URL") {
		t.Fatalf("got %v, want an error naming ONCEFLOW_NATS_URL", err)
	}
}
