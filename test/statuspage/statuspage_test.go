// Package statuspage checks the status page (docs/architecture.md#status-page)
// in a real browser: headless Chromium loads /status of the embedded
// default while a workload runs, and what its JavaScript drew must be
// what /metrics says; an action without the operator token is refused,
// and with it, after the confirmation, it acts.
package statuspage

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/onceflow/onceflow"
	"github.com/onceflow/onceflow/examples/ledger/accounts"
	"github.com/onceflow/onceflow/examples/ledger/ledgerapp"
	"github.com/onceflow/onceflow/onceflowtest"
	"github.com/onceflow/onceflow/pipeline"
	"github.com/onceflow/onceflow/pipeline/admin/status/statustest"
	"github.com/onceflow/onceflow/pipeline/apiclient"
	"github.com/onceflow/onceflow/pipeline/kafka"
	"github.com/onceflow/onceflow/pipeline/pipelinetest"
	"github.com/onceflow/onceflow/pipeline/postgres"
)

var screenshot = flag.String("screenshot", "", "write a PNG of the page, with a parked partition and a DLQ record, to this file (docs/status-page.png)")

const (
	adminToken = "status-page-test-token"
	projector  = "onceflow-projector" // the ledger's projector consumer
	events     = "ledger.events"
	dlqTopic   = "ledger.commands.dlq"
)

// TestStatusPage runs the embedded default, loads its status page in
// headless Chromium during a workload, and checks:
//
//   - while commands flow, the page draws a rate and a command's age for
//     ingest, and a lag plot from its samples;
//   - once the pipeline is quiet, each figure the page shows is the one
//     /metrics serves: commands accepted and decided, the DLQ by reason
//     (and what the DLQ topic holds), every group's lag, the lag of a
//     partition parked on purpose (a CHECK constraint the projection's
//     UPDATE violates: data-error), with its reason;
//   - unparking it without the token is refused (401, counted, the
//     partition still parked), a canceled confirmation sends nothing, and
//     with the token, once the cause is gone, it unparks and the read
//     model catches up; a DLQ record redriven from the page comes back to
//     the DLQ (it is still poison), which the page and /metrics count.
func TestStatusPage(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the embedded default and a browser")
	}
	tab := statustest.Browser(t)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	s := startDev(t, 4, nil, time.Second)
	page := "http://" + s.addrs.Admin + "/status"
	statustest.Open(t, tab, page)

	// A workload: four accounts and deposits on them until the page has
	// drawn a rate of requests and a lag plot.
	for i := range 4 {
		accept(t, ctx, s.api, true, func() (apiclient.Accepted, *apiclient.Response, error) {
			return s.api.OpenAccount(ctx, fmt.Sprintf("open-%d", i), fmt.Sprintf("acc-%d", i), "EUR")
		})
	}
	work := s.workload(t, ctx)
	pipelinetest.Eventually(t, 60*time.Second, func() error {
		got, err := statustest.Texts(tab, map[string]string{
			"rate": `[data-stage="ingest"] tr.rate[data-metric="onceflow_api_requests_total"] .per-second`,
			"age":  `[data-stage="ingest"] tr.latency[data-metric="onceflow_api_command_age_seconds"] .p50`,
		})
		if err != nil {
			return err
		}
		if r, err := statustest.Number(got["rate"]); err != nil || r <= 0 {
			return fmt.Errorf("ingest's request rate on the page: %q", got["rate"])
		}
		if a, err := statustest.Number(got["age"]); err != nil || a <= 0 {
			return fmt.Errorf("the p50 age of a command when ingest accepted it, on the page: %q", got["age"])
		}
		n, err := chromedp.Run(tab, chromedp.Evaluate[int](`Math.max(0, ...[...document.querySelectorAll('svg.lag-plot polyline')].map((p) => Number(p.dataset.points)))`))
		if err != nil {
			return err
		}
		if n < 3 {
			return fmt.Errorf("the longest line of the lag plots has %d points", n)
		}
		return nil
	})
	lastIDs := work.stop()
	for _, id := range lastIDs {
		if cmd, err := s.api.WaitCommand(ctx, id); err != nil || cmd.Status != "accepted" {
			t.Fatalf("workload command %s: %+v %v", id, cmd, err)
		}
	}

	// A partition parked on purpose: the read model refuses a balance over
	// a million, and a deposit goes over it.
	accept(t, ctx, s.api, true, func() (apiclient.Accepted, *apiclient.Response, error) {
		return s.api.OpenAccount(ctx, "open-park", "acc-park", "EUR")
	})
	if _, err := s.pool.Exec(ctx, `ALTER TABLE accounts ADD CONSTRAINT statuspage_test_cap CHECK (balance <= 1000000) NOT VALID`); err != nil {
		t.Fatal(err)
	}
	for i, amount := range []int64{2_000_000, 1, 2, 3} {
		// Not waited for: their outcomes wait behind the parked record.
		accept(t, ctx, s.api, false, func() (apiclient.Accepted, *apiclient.Response, error) {
			return s.api.Deposit(ctx, fmt.Sprintf("park-%d", i), "acc-park", amount)
		})
	}
	var part int32
	pipelinetest.Eventually(t, 60*time.Second, func() error {
		var reason string
		err := s.pool.QueryRow(ctx, `SELECT partition, reason FROM projector_parked WHERE consumer = $1 AND topic = $2`, projector, events).Scan(&part, &reason)
		if err != nil {
			return fmt.Errorf("no parked partition: %w", err)
		}
		if reason != "data-error" {
			return fmt.Errorf("parked on %s, want data-error", reason)
		}
		return nil
	})

	// A poison command, straight to Kafka: the DLQ.
	rec, err := kafka.CommandRecord("ledger.commands", onceflow.DemoTenant+"/acc-0", pipeline.NewCommandID(), "Deposit", []byte("not avro"), time.Time{}, "")
	if err != nil {
		t.Fatal(err)
	}
	if err := pipelinetest.Client(t, []string{s.addrs.Kafka}).ProduceSync(ctx, rec).FirstErr(); err != nil {
		t.Fatal(err)
	}
	var reason string
	pipelinetest.Eventually(t, 60*time.Second, func() error {
		m := s.metrics(t)
		accepted, _ := m.value("onceflow_api_commands_accepted_total")
		decided, _ := m.value("onceflow_processor_commands_total")
		for _, r := range m.labelValues("onceflow_dlq_records_total", "reason") {
			if v, _ := m.value("onceflow_dlq_records_total", "reason", r); v > 0 {
				reason = r
			}
		}
		if reason == "" || decided != accepted {
			return fmt.Errorf("processor: %v of %v accepted commands decided, DLQ reason %q", decided, accepted, reason)
		}
		return nil
	})

	// The page, once quiet, draws the numbers /metrics serves.
	partRow := fmt.Sprintf(`#lag tr[data-group=%q][data-topic=%q][data-partition="%d"]`, projector, events, part)
	pipelinetest.Eventually(t, 60*time.Second, func() error {
		got, err := statustest.Texts(tab, map[string]string{
			"accepted":     `tr.rate[data-metric="onceflow_api_commands_accepted_total"] .total`,
			"decided":      `tr.rate[data-metric="onceflow_processor_commands_total"] .total`,
			"sent":         fmt.Sprintf(`#dlq-sent tr[data-reason=%q] .records`, reason),
			"held":         fmt.Sprintf(`.dlq-topic[data-topic=%q] tr[data-reason=%q] .records`, dlqTopic, reason),
			"partLag":      partRow + " .lag",
			"partParked":   partRow + " .parked-reason",
			"parkedReason": fmt.Sprintf(`#parked-table tr[data-consumer=%q][data-partition="%d"] .reason`, projector, part),
			"backlog":      `#outbox tr[data-metric="onceflow_outbox_backlog_rows"] .value`,
		})
		if err != nil {
			return err
		}
		m := s.metrics(t)
		for _, c := range []struct {
			name, text string
			want       figure
		}{
			{"commands accepted", got["accepted"], m.figure("onceflow_api_commands_accepted_total")},
			{"commands decided", got["decided"], m.figure("onceflow_processor_commands_total")},
			{"DLQ records sent, " + reason, got["sent"], m.figure("onceflow_dlq_records_total", "reason", reason)},
			{"DLQ records held, " + reason, got["held"], m.figure("onceflow_dlq_records_total", "reason", reason)},
			{"lag of the parked partition", got["partLag"], m.figure("kafka_consumergroup_group_lag", "group", projector, "topic", events, "partition", strconv.Itoa(int(part)))},
			{"outbox rows", got["backlog"], m.figure("onceflow_outbox_backlog_rows")},
		} {
			if err := same(c.name, c.text, c.want); err != nil {
				return err
			}
		}
		if v, _ := statustest.Number(got["partLag"]); v <= 0 {
			return fmt.Errorf("the parked partition has lag %q on the page, want some", got["partLag"])
		}
		if got["partParked"] != "parked: data-error" || got["parkedReason"] != "data-error" {
			return fmt.Errorf("the parked partition on the page: %q and %q, want data-error", got["partParked"], got["parkedReason"])
		}
		// Every group's lag.
		sums, err := chromedp.Run(tab, chromedp.Evaluate[map[string]string](
			`Object.fromEntries([...document.querySelectorAll('#lag .sum')].map((e) => [e.dataset.group, e.textContent]))`))
		if err != nil {
			return err
		}
		groups := m.labelValues("kafka_consumergroup_group_sum_lag", "group")
		if len(sums) != len(groups) || len(groups) < 2 {
			return fmt.Errorf("the page shows the lag of groups %v, /metrics of %v", sums, groups)
		}
		for _, g := range groups {
			if err := same("lag of "+g, sums[g], m.figure("kafka_consumergroup_group_sum_lag", "group", g)); err != nil {
				return err
			}
		}
		return nil
	})
	if *screenshot != "" {
		png, err := chromedp.Run(tab, chromedp.FullScreenshot(100))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(*screenshot, png, 0o644); err != nil {
			t.Fatal(err)
		}
		t.Logf("wrote %s", *screenshot)
	}

	// Unpark without the token: refused, counted, still parked.
	unpark := chromedp.CSS(fmt.Sprintf(`#parked-table tr[data-consumer=%q][data-partition="%d"] button.unpark`, projector, part))
	if err := statustest.Do(tab, chromedp.Click(unpark), chromedp.WaitVisible(chromedp.CSS("#confirm[open]"))); err != nil {
		t.Fatal(err)
	}
	text, err := chromedp.Run(tab, chromedp.TextContent(chromedp.CSS("#confirm-text")))
	if err != nil || !strings.Contains(text, fmt.Sprintf("Unpark partition %d of %s", part, events)) {
		t.Fatalf("the confirmation says %q (%v)", text, err)
	}
	if err := statustest.Do(tab, chromedp.Click(chromedp.CSS("#confirm-ok"))); err != nil {
		t.Fatal(err)
	}
	waitResult(t, tab, "refused", "refused (401)")
	if !s.parked(t, ctx, part) {
		t.Fatal("an unpark without the token unparked")
	}
	if v, _ := s.metrics(t).value("onceflow_admin_denied_requests_total", "reason", "unauthorized"); v != 1 {
		t.Errorf("refused requests counted: %v, want 1", v)
	}

	// A canceled confirmation sends nothing.
	if err := statustest.Do(tab, chromedp.Click(unpark), chromedp.WaitVisible(chromedp.CSS("#confirm[open]")),
		chromedp.SendKeys(chromedp.CSS("#token"), adminToken), chromedp.Click(chromedp.CSS("#confirm-cancel"))); err != nil {
		t.Fatal(err)
	}
	waitResult(t, tab, "", "canceled")
	if !s.parked(t, ctx, part) {
		t.Fatal("a canceled unpark unparked")
	}

	// With the token, once the cause is gone: unparked, and the read model
	// catches up.
	if _, err := s.pool.Exec(ctx, `ALTER TABLE accounts DROP CONSTRAINT statuspage_test_cap`); err != nil {
		t.Fatal(err)
	}
	if err := statustest.Do(tab, chromedp.Click(unpark), chromedp.WaitVisible(chromedp.CSS("#confirm[open]")),
		chromedp.SendKeys(chromedp.CSS("#token"), adminToken), chromedp.Click(chromedp.CSS("#confirm-ok"))); err != nil {
		t.Fatal(err)
	}
	waitResult(t, tab, "ok", fmt.Sprintf("unparked %s partition %d of %s", projector, part, events))
	pipelinetest.Eventually(t, 60*time.Second, func() error {
		var balance int64
		if err := s.pool.QueryRow(ctx, `SELECT balance FROM accounts WHERE account_id = 'acc-park'`).Scan(&balance); err != nil {
			return err
		}
		if balance != 2_000_006 {
			return fmt.Errorf("acc-park's balance %d, want 2000006", balance)
		}
		got, err := statustest.Texts(tab, map[string]string{"none": "#none-parked", "lag": partRow + " .lag"})
		if err != nil {
			return err
		}
		if got["none"] == "" {
			return errors.New("the page still lists a parked partition")
		}
		return same("lag of the unparked partition", got["lag"],
			s.metrics(t).figure("kafka_consumergroup_group_lag", "group", projector, "topic", events, "partition", strconv.Itoa(int(part))))
	})

	// Redrive the DLQ record: still poison, it comes back.
	records, err := chromedp.Run(tab, chromedp.Evaluate[[]string](
		fmt.Sprintf(`[...document.querySelectorAll('.dlq-topic[data-topic=%q] tr[data-record]')].map((e) => e.dataset.record)`, dlqTopic)))
	if err != nil || len(records) != 1 {
		t.Fatalf("DLQ records on the page: %q (%v), want 1", records, err)
	}
	redrive := chromedp.CSS(fmt.Sprintf(`.dlq-topic[data-topic=%q] tr[data-record=%q] button.redrive`, dlqTopic, records[0]))
	if err := statustest.Do(tab, chromedp.Click(redrive), chromedp.WaitVisible(chromedp.CSS("#confirm[open]")),
		chromedp.SendKeys(chromedp.CSS("#token"), adminToken), chromedp.Click(chromedp.CSS("#confirm-ok"))); err != nil {
		t.Fatal(err)
	}
	waitResult(t, tab, "ok", "redrove 1 record(s) of "+dlqTopic)
	pipelinetest.Eventually(t, 60*time.Second, func() error {
		got, err := statustest.Texts(tab, map[string]string{
			"sent": fmt.Sprintf(`#dlq-sent tr[data-reason=%q] .records`, reason),
			"held": fmt.Sprintf(`.dlq-topic[data-topic=%q] .records`, dlqTopic),
		})
		if err != nil {
			return err
		}
		sent := s.metrics(t).figure("onceflow_dlq_records_total", "reason", reason)
		if sent.v != 2 {
			return fmt.Errorf("/metrics counts %v DLQ records, want 2", sent.v)
		}
		if err := same("DLQ records sent", got["sent"], sent); err != nil {
			return err
		}
		return same("DLQ records held", got["held"], figure{2, true})
	})

	// The token went with the requests and stayed nowhere.
	html, err := chromedp.Run(tab, chromedp.Evaluate[string](`document.documentElement.outerHTML + document.querySelector('#token').value`))
	if err != nil || strings.Contains(html, adminToken) {
		t.Errorf("the page keeps the token (%v)", err)
	}
	if strings.Contains(s.logs.String(), adminToken) {
		t.Error("the log carries the token")
	}
}

// figure is a value of /metrics, if it has it.
type figure struct {
	v  float64
	ok bool
}

// same compares a figure the page shows with the one /metrics has.
func same(name, text string, want figure) error {
	if !want.ok {
		return fmt.Errorf("%s: not on /metrics", name)
	}
	got, err := statustest.Number(text)
	if err != nil {
		return fmt.Errorf("%s on the page: %w", name, err)
	}
	if got != want.v {
		return fmt.Errorf("%s: the page shows %v, /metrics %v", name, got, want.v)
	}
	return nil
}

func waitResult(t *testing.T, tab context.Context, class, text string) {
	t.Helper()
	pipelinetest.Eventually(t, 20*time.Second, func() error {
		got, err := chromedp.Run(tab, chromedp.Evaluate[map[string]string](
			`(() => { const r = document.querySelector('#action-result'); return { class: r.className, text: r.hidden ? '' : r.textContent }; })()`))
		if err != nil {
			return err
		}
		if got["class"] != class || !strings.Contains(got["text"], text) {
			return fmt.Errorf("the page's answer: %q (class %q), want %q (class %q)", got["text"], got["class"], text, class)
		}
		return nil
	})
}

// accept sends a command and, if wait, waits for it to be accepted.
func accept(t *testing.T, ctx context.Context, api *ledgerapp.Client, wait bool, send func() (apiclient.Accepted, *apiclient.Response, error)) {
	t.Helper()
	a, _, err := send()
	if err != nil {
		t.Fatal(err)
	}
	if !wait {
		return
	}
	if cmd, err := api.WaitCommand(ctx, a.CommandID); err != nil || cmd.Status != "accepted" {
		t.Fatalf("command %s: %+v %v", a.CommandID, cmd, err)
	}
}

type devStack struct {
	addrs onceflow.Addrs
	api   *ledgerapp.Client
	pool  *pgxpool.Pool
	logs  *pipelinetest.Buffer
}

// startDev runs the embedded default with topics of partitions
// partitions, its metrics into metrics if set, the status page sampling
// every interval.
func startDev(t testing.TB, partitions int32, metrics *prometheus.Registry, interval time.Duration) *devStack {
	t.Helper()
	pool, url := pipelinetest.Pool(t, postgres.Migrations{Name: ledgerapp.Name, FS: accounts.Migrations})
	logs := &pipelinetest.Buffer{}
	logger := slog.New(slog.NewTextHandler(logs, nil))
	const apiKey = "status-page-test-key"
	// The stack runs until the test's cleanup, so a failed test can still
	// see where it stands (diagnose) before stopping it.
	addrs, stop := onceflowtest.Dev(t, onceflow.DevConfig{
		RunConfig: onceflow.RunConfig{
			Config: onceflow.Config{
				Domains: []*onceflow.Domain{ledgerapp.Domain()},
				Topics:  kafka.Topics{Prefix: "ledger", Partitions: partitions}, DatabaseURL: url,
				Kafka:  kafka.Config{Logger: logger},
				Logger: logger, InstanceID: "statuspage-test",
			},
			AdminToken: adminToken, StatusInterval: interval, Metrics: metrics,
		},
		APIKey: apiKey, Out: io.Discard,
	})
	s := &devStack{addrs: addrs, pool: pool, logs: logs,
		api: &ledgerapp.Client{Client: &apiclient.Client{BaseURL: "http://" + addrs.HTTP, APIKey: apiKey}}}
	t.Cleanup(func() {
		if t.Failed() {
			s.diagnose(t)
		}
		stop()
	})
	return s
}

func (s *devStack) parked(t *testing.T, ctx context.Context, part int32) bool {
	t.Helper()
	var n int
	if err := s.pool.QueryRow(ctx, `SELECT count(*) FROM projector_parked WHERE consumer = $1 AND topic = $2 AND partition = $3`,
		projector, events, part).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n == 1
}

// workload deposits on acc-0..acc-3 until stopped.
type workload struct {
	stopc chan struct{}
	done  chan struct{}
	mu    sync.Mutex
	last  map[string]string // account -> its last command's id
}

func (s *devStack) workload(t *testing.T, ctx context.Context) *workload {
	w := &workload{stopc: make(chan struct{}), done: make(chan struct{}), last: map[string]string{}}
	go func() {
		defer close(w.done)
		for i := 0; ; i++ {
			select {
			case <-w.stopc:
				return
			case <-ctx.Done():
				return
			default:
			}
			acc := fmt.Sprintf("acc-%d", i%4)
			a, _, err := s.api.Deposit(ctx, fmt.Sprintf("work-%d", i), acc, 10)
			if err != nil {
				t.Errorf("workload: %v", err)
				return
			}
			w.mu.Lock()
			w.last[acc] = a.CommandID
			w.mu.Unlock()
		}
	}()
	return w
}

// stop ends the workload and returns each account's last command.
func (w *workload) stop() []string {
	close(w.stopc)
	<-w.done
	w.mu.Lock()
	defer w.mu.Unlock()
	var out []string
	for _, id := range w.last {
		out = append(out, id)
	}
	return out
}

// scrape is one reading of /metrics.
type scrape []sample

type sample struct {
	name   string
	labels map[string]string
	value  float64
}

func (s *devStack) metrics(t testing.TB) scrape {
	t.Helper()
	resp, err := http.Get("http://" + s.addrs.Admin + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out scrape
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 0, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		smp, err := parseSample(line)
		if err != nil {
			t.Fatalf("/metrics: %v", err)
		}
		out = append(out, smp)
	}
	return out
}

// figure sums the series of name whose labels have the given values
// (pairs of name, value).
func (s scrape) figure(name string, labels ...string) figure {
	v, ok := s.value(name, labels...)
	return figure{v, ok}
}

// value sums the series of name whose labels have the given values
// (pairs of name, value); false when there is none.
func (s scrape) value(name string, labels ...string) (float64, bool) {
	sum, found := 0.0, false
next:
	for _, smp := range s {
		if smp.name != name {
			continue
		}
		for i := 0; i+1 < len(labels); i += 2 {
			if smp.labels[labels[i]] != labels[i+1] {
				continue next
			}
		}
		sum, found = sum+smp.value, true
	}
	return sum, found
}

// labelValues lists the values a label takes in the series of name.
func (s scrape) labelValues(name, label string) []string {
	seen := map[string]bool{}
	var out []string
	for _, smp := range s {
		if v, ok := smp.labels[label]; smp.name == name && ok && !seen[v] {
			seen[v] = true
			out = append(out, v)
		}
	}
	return out
}

// parseSample reads a line of the text exposition format:
// name{label="value",...} value.
func parseSample(line string) (sample, error) {
	smp := sample{labels: map[string]string{}}
	rest := line
	if i := strings.IndexAny(line, "{ "); i >= 0 {
		smp.name, rest = line[:i], line[i:]
	}
	if strings.HasPrefix(rest, "{") {
		rest = rest[1:]
		for !strings.HasPrefix(rest, "}") {
			eq := strings.Index(rest, `="`)
			if eq < 0 {
				return smp, fmt.Errorf("bad labels in %q", line)
			}
			name := strings.TrimPrefix(rest[:eq], ",")
			rest = rest[eq+2:]
			var v strings.Builder
			for {
				if rest == "" {
					return smp, fmt.Errorf("bad labels in %q", line)
				}
				c := rest[0]
				rest = rest[1:]
				if c == '\\' && rest != "" {
					switch rest[0] {
					case 'n':
						v.WriteByte('\n')
					default:
						v.WriteByte(rest[0])
					}
					rest = rest[1:]
					continue
				}
				if c == '"' {
					break
				}
				v.WriteByte(c)
			}
			smp.labels[name] = v.String()
			rest = strings.TrimPrefix(rest, ",")
		}
		rest = rest[1:]
	}
	f := strings.Fields(rest)
	if len(f) == 0 {
		return smp, fmt.Errorf("no value in %q", line)
	}
	v, err := strconv.ParseFloat(f[0], 64)
	if err != nil {
		return smp, fmt.Errorf("bad value in %q", line)
	}
	smp.value = v
	return smp, nil
}

// tail is the last n lines of what b holds.
func tail(b *pipelinetest.Buffer, n int) string {
	lines := strings.Split(strings.TrimRight(b.String(), "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}
