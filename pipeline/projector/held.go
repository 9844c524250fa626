package projector

import (
	"context"
	"errors"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"
)

// retryLogInterval is how often a batch that keeps failing is logged and
// its projector_retrying rows refreshed (it is retried more often).
const retryLogInterval = 30 * time.Second

// failures is a batch's run of failures.
type failures struct {
	n       int       // attempts that failed
	unknown int       // of them, in a row, by a projection's error of no known kind (classify)
	since   time.Time // the first
	logged  time.Time // last logged and saved to projector_retrying
	unsaved int64     // attempts not counted in projector_retrying yet
}

// retrying is the transient error a partition's batch is retried on.
type retrying struct{ class, err string }

const saveRetryingSQL = `INSERT INTO projector_retrying AS r (consumer, topic, partition, class, error, attempts)
	SELECT $1, $2, p, $4, $5, $6 FROM unnest($3::int[]) AS p
	ON CONFLICT (consumer, topic, partition) DO UPDATE SET
		class = EXCLUDED.class, error = EXCLUDED.error, attempts = r.attempts + EXCLUDED.attempts, last_at = now()`

// failed records a transient failure of a batch: counted at once, logged
// and written to projector_retrying at the first failure and then every
// retryLogInterval (best-effort: Postgres may be what failed).
func (p *Projector) failed(ctx context.Context, records []*kgo.Record, err error, f *failures, wait time.Duration) {
	kind, class := classify(err)
	if isProjectionError(err) && kind == unknown {
		f.unknown++
	} else {
		f.unknown = 0
	}
	p.metrics.errors.WithLabelValues(class).Inc()
	parts := partitionsOf(records)
	p.setRetrying(parts, retrying{class, err.Error()})
	f.n++
	f.unsaved++
	if f.n == 1 {
		f.since = time.Now()
	} else if time.Since(f.logged) < retryLogInterval {
		return
	}
	f.logged = time.Now()
	p.logger.Warn("apply batch failed; retrying", "class", class, "kind", kind, "err", err, "failures", f.n, "since", f.since,
		"backoff", wait, "records", len(records), "partitions", parts)
	saveCtx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	if _, err := p.pool.Exec(saveCtx, saveRetryingSQL, p.cfg.Consumer, p.cfg.Topic, parts, class, cleanText(err.Error()), f.unsaved); err == nil {
		f.unsaved = 0
	}
}

// recovered ends a batch's run of failures: its transaction has deleted
// the projector_retrying rows.
func (p *Projector) recovered(records []*kgo.Record, f *failures) {
	parts := partitionsOf(records)
	p.mu.Lock()
	for _, part := range parts {
		delete(p.retrying, part)
	}
	p.setRetryingGauge()
	p.mu.Unlock()
	p.logger.Info("batch applied after retrying", "failures", f.n, "since", f.since, "partitions", parts)
}

func (p *Projector) setRetrying(parts []int32, r retrying) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, part := range parts {
		p.retrying[part] = r
	}
	p.setRetryingGauge()
}

// setRetryingGauge sets onceflow_projector_retrying_partitions; p.mu is held.
func (p *Projector) setRetryingGauge() {
	setByLabel(p.metrics.retrying, retryClasses, p.retrying, func(r retrying) string { return r.class })
}

// setParkedGauge sets onceflow_projector_parked_partitions; p.mu is held.
func (p *Projector) setParkedGauge() {
	setByLabel(p.metrics.parked, parkReasons, p.parked, func(pk park) string { return pk.reason })
}

// setByLabel sets g's series of each of labels to the number of m's
// partitions that label gives.
func setByLabel[V any](g *prometheus.GaugeVec, labels []string, m map[int32]V, label func(V) string) {
	n := make(map[string]int, len(labels))
	for _, v := range m {
		n[label(v)]++
	}
	for _, l := range labels {
		g.WithLabelValues(l).Set(float64(n[l]))
	}
}

func (p *Projector) hasParked() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.parked) > 0
}

func (p *Projector) isParked(part int32) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	_, ok := p.parked[part]
	return ok
}

// park stops fetching a partition whose record at pk.offset cannot be
// applied. Its stored offset and its projector_parked row (both written in
// the batch's transaction) point at that record.
func (p *Projector) park(cl *kgo.Client, pk park) {
	p.markParked(pk)
	cl.PauseFetchPartitions(map[string][]int32{p.cfg.Topic: {pk.partition}})
}

// markParked counts and logs a park; the partition's records are dropped
// from every poll from now on, and the poll loop pauses its fetching
// (pauseUnpaused) unless park did.
func (p *Projector) markParked(pk park) {
	p.mu.Lock()
	p.parked[pk.partition] = pk
	p.unpaused = true
	p.setParkedGauge()
	p.mu.Unlock()
	if pk.reason == reasonGap {
		p.metrics.gaps.Inc()
	}
	p.logger.Error("partition parked; an operator must look at it (onceflow lag, onceflow projections unpark)",
		"partition", pk.partition, "offset", pk.offset, "reason", pk.reason, "detail", pk.detail)
}

// pauseUnpaused pauses the fetching of the partitions parked where the
// client could not be reached (loadOffsets, inside the client's own
// assignment).
func (p *Projector) pauseUnpaused(cl *kgo.Client) {
	p.mu.Lock()
	if !p.unpaused {
		p.mu.Unlock()
		return
	}
	p.unpaused = false
	parts := make([]int32, 0, len(p.parked))
	for part := range p.parked {
		parts = append(parts, part)
	}
	p.mu.Unlock()
	cl.PauseFetchPartitions(map[string][]int32{p.cfg.Topic: parts})
}

// forget drops parked partitions this member no longer owns: the next
// owner (or this one after a restart) starts from the stored offset, at the
// record that parked it, and parks again if it still cannot be applied.
func (p *Projector) forget(parts []int32) {
	p.app.remembered.forget(parts)
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, part := range parts {
		delete(p.parked, part)
		delete(p.retrying, part)
	}
	p.setParkedGauge()
	p.setRetryingGauge()
}

const (
	parkedRowsSQL = `SELECT partition FROM projector_parked WHERE consumer = $1 AND topic = $2`
	offsetOfSQL   = `SELECT next_offset FROM consumer_offsets WHERE consumer = $1 AND topic = $2 AND partition = $3`
)

// checkUnparked resumes the parked partitions whose projector_parked row
// an operator has deleted: fetching starts again at the stored offset.
func (p *Projector) checkUnparked(ctx context.Context, cl *kgo.Client) {
	if !p.hasParked() || time.Since(p.lastParkCheck) < p.cfg.ParkCheckInterval {
		return
	}
	p.lastParkCheck = time.Now()
	rows, err := p.pool.Query(ctx, parkedRowsSQL, p.cfg.Consumer, p.cfg.Topic)
	if err != nil {
		return // checked again next time
	}
	still, err := pgx.CollectRows(rows, pgx.RowTo[int32])
	if err != nil {
		return
	}
	for part := range p.Parked() {
		if slices.Contains(still, part) {
			continue
		}
		var off int64
		if err := p.pool.QueryRow(ctx, offsetOfSQL, p.cfg.Consumer, p.cfg.Topic, part).Scan(&off); err != nil && !errors.Is(err, pgx.ErrNoRows) {
			return
		}
		cl.SetOffsets(map[string]map[int32]kgo.EpochOffset{p.cfg.Topic: {part: {Epoch: -1, Offset: off}}})
		cl.ResumeFetchPartitions(map[string][]int32{p.cfg.Topic: {part}})
		p.forget([]int32{part})
		p.app.remembered.set(part, off)
		p.logger.Info("partition unparked by an operator; trying again", "partition", part, "offset", off)
	}
}
