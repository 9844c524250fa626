package status

import (
	"bytes"
	"context"
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/onceflow/onceflow/pipeline/admin"
	"github.com/onceflow/onceflow/pipeline/kafka"
	"github.com/onceflow/onceflow/pipeline/problem"
)

// Config is what a page reads from. Zero durations take their defaults.
type Config struct {
	// Gatherer is the process's registry, the one /metrics serves.
	// Required.
	Gatherer prometheus.Gatherer
	// Components names what the process runs, for the page's heading.
	Components []string
	// Pool, if set, is where parked and retrying partitions are read and
	// unparked: the processes with a database.
	Pool *pgxpool.Pool
	// Kafka, if set, reads the DLQ topics and produces redriven records.
	// It is not closed.
	Kafka *kgo.Client
	// DLQs are the deployment's DLQ topics, each with the commands topic
	// its records are redriven to.
	DLQs []DLQTopicConfig
	// CommandTopics and EventTopics say which topics the flow's queues
	// are (the consumers' lag on them).
	CommandTopics, EventTopics []string
	// Interval is the time between samples. Default 10s.
	Interval time.Duration
	// History is how long samples are kept, what the plots show. Default
	// 15m.
	History time.Duration
	// Window is what rates and quantiles are taken over. Default 1m.
	Window time.Duration
	// DLQInterval bounds how often the DLQ topics are read: a reading is
	// reused for that long. Default 10s.
	DLQInterval time.Duration
	// DatabaseInterval bounds how often the parked and retrying
	// partitions are read from Pool: a reading is reused for that long,
	// however many ask for /status.json meanwhile (an unpark reads again).
	// Default 2s.
	DatabaseInterval time.Duration
	// Blocked, if set, lists the commands partitions this process's
	// processors stopped at a batch too large to decompress; the lag marks
	// them. SkipBatch, if set, skips one on an operator's say-so
	// (POST /status/skip-batch): it returns the offset the partition goes
	// on from (processor.ErrNotBlocked when no processor here holds it).
	Blocked   func() []kafka.BlockedPartition
	SkipBatch func(ctx context.Context, topic string, partition int32, offset int64, note, operator string) (int64, error)
	Logger    *slog.Logger
}

// DLQTopicConfig is one DLQ topic and where its records are redriven.
type DLQTopicConfig struct {
	Topic, Commands string
}

func (c *Config) setDefaults() {
	if c.Interval <= 0 {
		c.Interval = 10 * time.Second
	}
	if c.History <= 0 {
		c.History = 15 * time.Minute
	}
	if c.Window <= 0 {
		c.Window = time.Minute
	}
	if c.DLQInterval <= 0 {
		c.DLQInterval = 10 * time.Second
	}
	if c.DatabaseInterval <= 0 {
		c.DatabaseInterval = 2 * time.Second
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
}

// Page is one process's status page.
type Page struct {
	cfg    Config
	tracks map[string]track
	acts   func() bool // whether the admin server's actions answer

	mu      sync.Mutex
	ring    *ring
	dlq     *dlqReader
	parked  *parkedReader
	failing admin.Failures // what could not be read, logged
}

//go:embed web
var web embed.FS

// New returns a page reading from cfg.
func New(cfg Config) (*Page, error) {
	if cfg.Gatherer == nil {
		return nil, errors.New("status: a Gatherer is required")
	}
	cfg.setDefaults()
	samples := int(cfg.History/cfg.Interval) + 1
	p := &Page{cfg: cfg, tracks: tracked(), acts: func() bool { return false }, ring: newRing(samples)}
	p.dlq = newDLQReader(cfg.Kafka, cfg.DLQs, cfg.DLQInterval)
	p.parked = &parkedReader{pool: cfg.Pool, every: cfg.DatabaseInterval}
	return p, nil
}

// Register adds the page's routes to the admin server: the page and its
// JSON for anyone who reaches it, the actions behind its token.
func (p *Page) Register(s *admin.Server) {
	p.acts = s.ActsEnabled
	assets, _ := fs.Sub(web, "web")
	s.Handle("GET /{$}", http.RedirectHandler("/status", http.StatusFound))
	first, err := p.servePage(assets)
	if err != nil {
		panic(err) // the embedded index.html is not a template: a build that cannot run
	}
	s.Handle("GET /status", first)
	s.Handle("GET /status/{asset}", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.PathValue("asset") == "index.html" { // a template: /status draws it
			http.NotFound(w, r)
			return
		}
		page(assets, r.PathValue("asset")).ServeHTTP(w, r)
	}))
	s.Handle("GET /status.json", http.HandlerFunc(p.serveJSON))
	s.Act("POST /status/unpark", http.HandlerFunc(p.unpark))
	s.Act("POST /status/redrive", http.HandlerFunc(p.redrive))
	s.Act("POST /status/skip-batch", http.HandlerFunc(p.skipBatch))
}

// page serves one embedded file under a policy that lets it load only
// what the binary serves: no CDN, no inline script, no framing.
func page(assets fs.FS, name string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, err := fs.ReadFile(assets, name)
		if err != nil || name == "" || strings.ContainsAny(name, "/\\") {
			http.NotFound(w, r)
			return
		}
		securityHeaders(w)
		http.ServeContent(w, r, name, time.Time{}, bytes.NewReader(b))
	})
}

func securityHeaders(w http.ResponseWriter) {
	h := w.Header()
	h.Set("Content-Security-Policy", "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Referrer-Policy", "no-referrer")
	h.Set("Cache-Control", "no-store")
}

// Run samples the registry every Interval until ctx ends.
func (p *Page) Run(ctx context.Context) error {
	t := time.NewTicker(p.cfg.Interval)
	defer t.Stop()
	for {
		p.Sample()
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// Sample gathers the registry once and keeps what the page tracks.
func (p *Page) Sample() {
	r, err := p.gather()
	p.note("metrics", err)
	p.mu.Lock()
	defer p.mu.Unlock()
	p.ring.add(r)
}

// note logs a source's failure when it starts or its error changes, and
// its recovery: a database down while a page polls every 2 s is one line,
// not one per poll.
func (p *Page) note(source string, err error) {
	switch {
	case !p.failing.Changed(source, err):
	case err != nil:
		p.cfg.Logger.Warn("status page: cannot read", "source", source, "err", err)
	default:
		p.cfg.Logger.Info("status page: can read again", "source", source)
	}
}

// Kept returns how many samples the ring holds and how many series each
// has a column for: its memory is about samples × series × 8 bytes.
func (p *Page) Kept() (samples, series int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.ring.len(), len(p.ring.keys)
}

// gather reads the registry now. A collector that failed (a database
// that did not answer the outbox count) leaves its series out and the
// rest in, as /metrics does.
func (p *Page) gather() (reading, error) {
	families, err := p.cfg.Gatherer.Gather()
	return read(time.Now(), families, p.tracks), err
}

func (p *Page) serveJSON(w http.ResponseWriter, r *http.Request) {
	st := p.Build(r.Context())
	securityHeaders(w)
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(st)
}

// Build reads everything the page shows, now.
func (p *Page) Build(ctx context.Context) Status {
	now, err := p.gather()
	st := Status{
		At:             now.at,
		Components:     p.cfg.Components,
		ActionsEnabled: p.acts(),
		Sampling: Sampling{
			IntervalSeconds: p.cfg.Interval.Seconds(),
			WindowSeconds:   p.cfg.Window.Seconds(),
			HistorySeconds:  p.cfg.History.Seconds(),
		},
	}
	p.note("metrics", err)
	if err != nil {
		st.Unavailable = append(st.Unavailable, "some metrics")
	}

	p.mu.Lock()
	var then *reading
	if i := p.ring.since(now.at.Add(-p.cfg.Window)); i >= 0 {
		r := p.ring.reading(i)
		then = &r
		st.Sampling.WindowTakenSeconds = now.at.Sub(r.at).Seconds()
	}
	st.History = p.history(now)
	p.mu.Unlock()

	if p.cfg.Pool != nil {
		st.Parked.Read = true
		rd := p.parked.read(ctx)
		parked, retrying := rd.parked, rd.retrying
		p.note("parked partitions", rd.parkedErr)
		if rd.parkedErr != nil {
			st.Unavailable = append(st.Unavailable, "parked partitions")
		}
		p.note("retrying partitions", rd.retryingErr)
		if rd.retryingErr != nil {
			st.Unavailable = append(st.Unavailable, "retrying partitions")
		}
		st.Parked.Partitions = make([]ParkedPartition, 0, len(parked))
		for _, x := range parked {
			st.Parked.Partitions = append(st.Parked.Partitions, ParkedPartition{Consumer: x.Consumer, Topic: x.Topic,
				Partition: x.Partition, Offset: x.Offset, Reason: x.Reason, Since: x.Since})
		}
		st.Parked.Retrying = make([]RetryingPartition, 0, len(retrying))
		for _, x := range retrying {
			st.Parked.Retrying = append(st.Parked.Retrying, RetryingPartition{Consumer: x.Consumer, Topic: x.Topic,
				Partition: x.Partition, Class: x.Class, Attempts: x.Attempts, Since: x.Since})
		}
	}

	marked := st.Parked.Partitions
	if p.cfg.Blocked != nil {
		for _, b := range p.cfg.Blocked() {
			marked = append(marked, ParkedPartition{Consumer: b.Group, Topic: b.Topic, Partition: b.Partition, Offset: b.Offset, Reason: "batch-too-large"})
		}
	}
	st.Lag = lagOf(&now, marked)
	st.Flow = p.flowOf(&now, then, st.Lag)
	st.Outbox = outboxOf(&now)
	st.Verify = verifyOf(&now)
	st.DLQ.Sent = sentOf(&now)
	topics, err := p.dlq.read(ctx)
	p.note("DLQ topics", err)
	if err != nil {
		st.Unavailable = append(st.Unavailable, "DLQ topics")
	}
	st.DLQ.Topics = topics
	return st
}

func (p *Page) flowOf(now, then *reading, lag Lag) []StageStatus {
	out := make([]StageStatus, 0, len(flow))
	for _, s := range flow {
		ss := StageStatus{Name: s.name, Rates: []RateStatus{}, Latencies: []LatencyStatus{}}
		// A stage is there when the process exports any of its metrics.
		// Then a metric of it that is missing is a vector none of whose
		// series exists yet (no request answered, no record sent to the
		// DLQ): zero, not unknown.
		for _, r := range s.rates {
			_, ok := now.get(key{r.metric, ""})
			ss.Present = ss.Present || ok
		}
		for _, l := range s.latencies {
			_, ok := now.get(key{l.metric, countKey})
			ss.Present = ss.Present || ok
		}
		if !ss.Present {
			if !s.optional {
				out = append(out, ss)
			}
			continue
		}
		for _, r := range s.rates {
			k := key{r.metric, ""}
			total, ok := now.get(k)
			rs := RateStatus{Title: r.title, Metric: r.metric, Total: total, PerSecond: perSecond(now, then, k), Label: r.by}
			if !ok && then != nil {
				zero := 0.0
				rs.PerSecond = &zero
			}
			if r.by != "" {
				for _, v := range labelValuesOf(now, r.metric) {
					k := key{r.metric, v}
					t, _ := now.get(k)
					rs.By = append(rs.By, LabelRate{Value: v, Total: t, PerSecond: perSecond(now, then, k)})
				}
			}
			ss.Rates = append(ss.Rates, rs)
		}
		for _, l := range s.latencies {
			h, _ := histogramBetween(now, then, l.metric)
			total, _ := now.get(key{l.metric, countKey})
			ss.Latencies = append(ss.Latencies, LatencyStatus{Title: l.title, Metric: l.metric, Count: h.count, Total: total,
				P50: h.quantile(.5), P90: h.quantile(.9), P99: h.quantile(.99), Mean: h.mean()})
		}
		for _, f := range s.facts {
			for _, v := range labelValuesOf(now, f.metric) {
				if x, _ := now.get(key{f.metric, v}); x != 1 {
					continue
				}
				vals := strings.Split(v, sep)
				args := make([]any, len(vals))
				for i, x := range vals {
					args[i] = x
				}
				ss.Facts = append(ss.Facts, FactStatus{Title: f.title, Metric: f.metric, Value: fmt.Sprintf(f.format, args...)})
			}
		}
		switch s.into {
		case outboxQueue:
			q := &Queue{Name: "outbox", Metric: backlogMetric}
			if v, ok := now.get(key{backlogMetric, ""}); ok {
				q.Rows = &v
			}
			if v, ok := now.get(key{oldestMetric, ""}); ok {
				q.Seconds = &v
			}
			ss.Into = q
		case commandTopic:
			ss.Into = topicQueue(lag, p.cfg.CommandTopics)
		case eventTopic:
			ss.Into = topicQueue(lag, p.cfg.EventTopics)
		}
		out = append(out, ss)
	}
	return out
}

// labelValuesOf lists the values of the label a metric is broken down by
// in a reading, sorted.
func labelValuesOf(r *reading, metric string) []string {
	var out []string
	for k := range r.v {
		if k.metric == metric && k.labels != "" && !strings.HasPrefix(k.labels, sep) {
			out = append(out, k.labels)
		}
	}
	slices.Sort(out)
	return out
}

// topicQueue is the lag of every group on the topics: the largest lag
// and age of any group is the queue's (each group reads all of it).
func topicQueue(lag Lag, topics []string) *Queue {
	q := &Queue{Name: strings.Join(topics, ", "), Metric: lagMetric}
	if !lag.Exported {
		return q
	}
	for _, g := range lag.Groups {
		qg := QueueGroup{Group: g.Group}
		on := false
		for _, pl := range g.Partitions {
			if !slices.Contains(topics, pl.Topic) {
				continue
			}
			on = true
			qg.Lag += pl.Lag
			if pl.Seconds != nil && (qg.Seconds == nil || *pl.Seconds > *qg.Seconds) {
				s := *pl.Seconds
				qg.Seconds = &s
			}
		}
		if !on {
			continue
		}
		q.Groups = append(q.Groups, qg)
		if q.Rows == nil || qg.Lag > *q.Rows {
			v := qg.Lag
			q.Rows = &v
		}
		if qg.Seconds != nil && (q.Seconds == nil || *qg.Seconds > *q.Seconds) {
			s := *qg.Seconds
			q.Seconds = &s
		}
	}
	return q
}

// lagOf is the lag series of the reading, by group and partition, with
// the parked partitions marked.
func lagOf(now *reading, parked []ParkedPartition) Lag {
	lag := Lag{Groups: []GroupLag{}}
	byGroup := map[string]*GroupLag{}
	for k, v := range now.v {
		if k.metric != lagMetric || k.labels == "" {
			continue
		}
		group, topic, part, ok := partitionKey(k.labels)
		if !ok {
			continue
		}
		g := byGroup[group]
		if g == nil {
			g = &GroupLag{Group: group}
			if s, ok := now.get(key{sumLagMetric, group}); ok {
				g.Sum = s
			}
			if s, ok := now.get(key{maxSecondsMetric, group}); ok {
				g.MaxSeconds = &s
			}
			byGroup[group] = g
		}
		pl := PartitionLag{Topic: topic, Partition: part, Lag: v}
		if s, ok := now.get(key{lagSecondsMetric, k.labels}); ok {
			pl.Seconds = &s
		}
		for _, x := range parked {
			if x.Consumer == group && x.Topic == topic && x.Partition == part {
				pl.Parked = x.Reason
			}
		}
		g.Partitions = append(g.Partitions, pl)
	}
	for _, g := range byGroup {
		slices.SortFunc(g.Partitions, func(a, b PartitionLag) int {
			if c := strings.Compare(a.Topic, b.Topic); c != 0 {
				return c
			}
			return int(a.Partition - b.Partition)
		})
		lag.Groups = append(lag.Groups, *g)
	}
	slices.SortFunc(lag.Groups, func(a, b GroupLag) int { return strings.Compare(a.Group, b.Group) })
	lag.Exported = len(lag.Groups) > 0
	return lag
}

func partitionKey(labels string) (group, topic string, part int32, ok bool) {
	f := strings.Split(labels, sep)
	if len(f) != 3 {
		return "", "", 0, false
	}
	n, err := strconv.ParseInt(f[2], 10, 32)
	if err != nil {
		return "", "", 0, false
	}
	return f[0], f[1], int32(n), true
}

func outboxOf(now *reading) *Outbox {
	backlog, ok := now.get(key{backlogMetric, ""})
	if !ok {
		return nil
	}
	o := &Outbox{BacklogRows: backlog}
	o.OldestAgeSeconds, _ = now.get(key{oldestMetric, ""})
	o.DeadRows, _ = now.get(key{deadMetric, ""})
	o.PendingCommands, _ = now.get(key{pendingMetric, ""})
	o.OldestPendingAgeSeconds, _ = now.get(key{oldestPendingMetric, ""})
	return o
}

// verifyOf is the last recorded verification; nil when the process
// exports none.
func verifyOf(now *reading) *Verify {
	at, ok := now.get(key{verifyLastMetric, ""})
	if !ok {
		return nil
	}
	v := &Verify{LastRunTimestampSeconds: at, Findings: []VerifyCount{}}
	clean, _ := now.get(key{verifyOKMetric, ""})
	v.OK = clean == 1
	for _, labels := range labelValuesOf(now, verifyFindingsMetric) {
		stage, kind, _ := strings.Cut(labels, sep)
		n, _ := now.get(key{verifyFindingsMetric, labels})
		v.Findings = append(v.Findings, VerifyCount{Stage: stage, Kind: kind, Count: n})
	}
	return v
}

// sentOf is onceflow_dlq_records_total by reason; nil in a process that
// runs no processor (which always exports its batch histogram; the DLQ
// counter has no series before the first record).
func sentOf(now *reading) []ReasonCount {
	_, dlq := now.get(key{dlqMetric, ""})
	_, processor := now.get(key{processorBatchMetric, countKey})
	if !dlq && !processor {
		return nil
	}
	out := []ReasonCount{}
	for _, reason := range labelValuesOf(now, dlqMetric) {
		v, _ := now.get(key{dlqMetric, reason})
		out = append(out, ReasonCount{Reason: reason, Records: v})
	}
	return out
}

// history lays the ring and the reading now out for the plots; p.mu is
// held.
func (p *Page) history(now reading) History {
	n := p.ring.len()
	h := History{At: make([]float64, 0, n+1)}
	rows := make([]row, 0, n)
	for i := range n {
		rows = append(rows, p.ring.row(i))
		h.At = append(h.At, float64(rows[i].at.UnixMilli())/1000)
	}
	h.At = append(h.At, float64(now.at.UnixMilli())/1000)
	values := func(k key) []*float64 {
		out := make([]*float64, 0, n+1)
		for _, r := range rows {
			if v, ok := p.ring.get(r, k); ok {
				out = append(out, &v)
			} else {
				out = append(out, nil)
			}
		}
		if v, ok := now.get(k); ok {
			out = append(out, &v)
		} else {
			out = append(out, nil)
		}
		return out
	}

	// Every partition that had lag in a sample kept or has it now.
	seen := map[key]bool{}
	var lagKeys []key
	for k := range now.v {
		if k.metric == lagMetric && k.labels != "" {
			seen[k] = true
			lagKeys = append(lagKeys, k)
		}
	}
	for _, k := range p.ring.keys {
		if k.metric == lagMetric && k.labels != "" && !seen[k] {
			seen[k] = true
			lagKeys = append(lagKeys, k)
		}
	}
	slices.SortFunc(lagKeys, func(a, b key) int {
		ga, ta, pa, _ := partitionKey(a.labels)
		gb, tb, pb, _ := partitionKey(b.labels)
		if c := strings.Compare(ga, gb); c != 0 {
			return c
		}
		if c := strings.Compare(ta, tb); c != 0 {
			return c
		}
		return int(pa - pb)
	})
	h.Lag = []LagSeries{}
	for _, k := range lagKeys {
		group, topic, part, ok := partitionKey(k.labels)
		if !ok {
			continue
		}
		h.Lag = append(h.Lag, LagSeries{Group: group, Topic: topic, Partition: part, Lag: values(k)})
	}
	h.Outbox = values(key{backlogMetric, ""})

	h.Rates = []RateHistory{}
	for _, s := range flow {
		for _, r := range s.rates {
			k := key{r.metric, ""}
			totals := values(k)
			if !slices.ContainsFunc(totals, func(v *float64) bool { return v != nil }) {
				continue
			}
			rates := make([]*float64, len(totals))
			for i := 1; i < len(totals); i++ {
				dt := h.At[i] - h.At[i-1]
				if totals[i] == nil || totals[i-1] == nil || dt <= 0 {
					continue
				}
				inc := *totals[i] - *totals[i-1]
				if inc < 0 {
					inc = *totals[i]
				}
				v := inc / dt
				rates[i] = &v
			}
			h.Rates = append(h.Rates, RateHistory{Metric: r.metric, PerSecond: rates})
		}
	}
	return h
}

// writeJSON answers an action.
func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(code)
	json.NewEncoder(w).Encode(v)
}

// actionResult is every action's answer: what happened, in a sentence
// the page shows.
type actionResult struct {
	Message string `json:"message"`
	Count   int64  `json:"count"`
}

// fail refuses an action: a problem (RFC 9457) of type slug, titled after
// its status, whose detail says what to do.
func fail(w http.ResponseWriter, code int, slug, format string, args ...any) {
	w.Header().Set("Cache-Control", "no-store")
	problem.Write(w, problem.New(code, slug, http.StatusText(code), fmt.Sprintf(format, args...)))
}
