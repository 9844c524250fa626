package main

import (
	"context"
	"fmt"
	"math"
	"net/http"
	"sort"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// stageMetrics are the age histograms each stage observes when it is done
// with a command or its event (docs/architecture.md#observability): the
// age at ingest's commit, at the relay's acknowledgement, at the
// processor's commit, at the projector's commit. All have the same buckets
// (pipeline.StageAgeBuckets), so they compare.
var stageMetrics = []struct{ name, metric string }{
	{"accepted", "onceflow_api_command_age_seconds"},
	{"shipped", "onceflow_outbox_ship_latency_seconds"},
	{"decided", "onceflow_processor_command_age_seconds"},
	{"projected", "onceflow_projector_event_age_seconds"},
}

// workMetrics are the durations of each stage's unit of work (a batch, a
// commit), whose count per second and length show how a stage spends the
// time its age grows by.
var workMetrics = []struct{ name, metric string }{
	{"ingest accept batch", "onceflow_api_accept_batch_duration_seconds"},
	{"relay publish", "onceflow_outbox_publish_duration_seconds"},
	{"processor batch", "onceflow_processor_batch_duration_seconds"},
	{"processor commit", "onceflow_processor_commit_duration_seconds"},
	{"projector batch", "onceflow_projector_batch_duration_seconds"},
}

// hist is a histogram summed over every series of a metric in every
// process scraped: upper bound -> cumulative count.
type hist struct {
	buckets map[float64]float64
	count   float64
	sum     float64
}

// stage is one stage's ages over a load step (the difference of two
// scrapes), in milliseconds.
type stage struct {
	Name           string
	Count          float64
	Mean, P50, P99 float64
}

// scrape reads the stage histograms of every /metrics URL, summed.
func scrape(ctx context.Context, urls []string) (map[string]*hist, error) {
	out := map[string]*hist{}
	for _, u := range urls {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
		if err != nil {
			return nil, err
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return nil, fmt.Errorf("scrape %s: %w", u, err)
		}
		p := expfmt.NewTextParser(model.UTF8Validation)
		fams, err := p.TextToMetricFamilies(resp.Body)
		resp.Body.Close()
		if err != nil {
			return nil, fmt.Errorf("scrape %s: %w", u, err)
		}
		for _, s := range append(append([]struct{ name, metric string }{}, stageMetrics...), workMetrics...) {
			f, ok := fams[s.metric]
			if !ok || f.GetType() != dto.MetricType_HISTOGRAM {
				continue
			}
			h := out[s.metric]
			if h == nil {
				h = &hist{buckets: map[float64]float64{}}
				out[s.metric] = h
			}
			for _, m := range f.GetMetric() {
				hh := m.GetHistogram()
				h.count += float64(hh.GetSampleCount())
				h.sum += hh.GetSampleSum()
				for _, b := range hh.GetBucket() {
					h.buckets[b.GetUpperBound()] += float64(b.GetCumulativeCount())
				}
			}
		}
	}
	return out, nil
}

// stagesBetween is each of metrics' distribution between two scrapes.
func stagesBetween(metrics []struct{ name, metric string }, before, after map[string]*hist) []stage {
	var out []stage
	for _, s := range metrics {
		a := after[s.metric]
		if a == nil {
			continue
		}
		b := before[s.metric]
		if b == nil {
			b = &hist{buckets: map[float64]float64{}}
		}
		d := &hist{buckets: map[float64]float64{}, count: a.count - b.count, sum: a.sum - b.sum}
		for le, c := range a.buckets {
			d.buckets[le] = c - b.buckets[le]
		}
		st := stage{Name: s.name, Count: d.count}
		if d.count > 0 {
			st.Mean = d.sum / d.count * 1000
			st.P50 = d.quantile(0.5) * 1000
			st.P99 = d.quantile(0.99) * 1000
		}
		out = append(out, st)
	}
	return out
}

// quantile interpolates linearly within the bucket that holds q, as
// Prometheus' histogram_quantile does; in the +Inf bucket it answers the
// largest finite bound.
func (h *hist) quantile(q float64) float64 {
	les := make([]float64, 0, len(h.buckets))
	for le := range h.buckets {
		les = append(les, le)
	}
	sort.Float64s(les)
	if len(les) == 0 || h.count == 0 {
		return math.NaN()
	}
	rank := q * h.count
	prevLe, prevC := 0.0, 0.0
	for _, le := range les {
		c := h.buckets[le]
		if c >= rank {
			if math.IsInf(le, 1) {
				return prevLe
			}
			if c == prevC {
				return le
			}
			return prevLe + (le-prevLe)*(rank-prevC)/(c-prevC)
		}
		prevLe, prevC = le, c
	}
	return prevLe
}
