package status

import (
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// A reading sums a metric's series over the labels it does not keep, and
// keeps a histogram's count, sum and buckets summed the same way.
func TestReadSumsSeries(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	requests := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "onceflow_api_requests_total"}, []string{"route", "code"})
	batch := prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "onceflow_projector_batch_duration_seconds", Buckets: []float64{.01, .1, 1}}, []string{"consumer"})
	other := prometheus.NewCounter(prometheus.CounterOpts{Name: "not_tracked_total"})
	reg.MustRegister(requests, batch, other)
	requests.WithLabelValues("POST /a", "202").Add(3)
	requests.WithLabelValues("POST /b", "202").Add(4)
	requests.WithLabelValues("POST /b", "409").Add(1)
	batch.WithLabelValues("x").Observe(.005)
	batch.WithLabelValues("y").Observe(.5)
	batch.WithLabelValues("y").Observe(5)
	other.Inc()

	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	r := read(time.Now(), families, tracked())
	for _, tc := range []struct {
		k    key
		want float64
	}{
		{key{"onceflow_api_requests_total", ""}, 8},
		{key{"onceflow_api_requests_total", "202"}, 7},
		{key{"onceflow_api_requests_total", "409"}, 1},
		{key{"onceflow_projector_batch_duration_seconds", countKey}, 3},
		{key{"onceflow_projector_batch_duration_seconds", sumKey}, 5.505},
		{key{"onceflow_projector_batch_duration_seconds", bucketKey + "0.01"}, 1},
		{key{"onceflow_projector_batch_duration_seconds", bucketKey + "1"}, 2},
	} {
		if got, ok := r.get(tc.k); !ok || math.Abs(got-tc.want) > 1e-9 {
			t.Errorf("%s %q: got %v (present %v), want %v", tc.k.metric, tc.k.labels, got, ok, tc.want)
		}
	}
	if _, ok := r.get(key{"not_tracked_total", ""}); ok {
		t.Error("a metric the page does not show was kept")
	}
	if got := fmt.Sprint(r.bounds["onceflow_projector_batch_duration_seconds"]); got != "[0.01 0.1 1]" {
		t.Errorf("bounds %s, want [0.01 0.1 1]", got)
	}
}

// Quantiles come from the increase of the buckets over the window,
// interpolated within the bucket the rank falls in as
// histogram_quantile does; rates from the increase of the counter.
func TestWindowArithmetic(t *testing.T) {
	t.Parallel()
	t0 := time.Unix(1000, 0)
	const m = "onceflow_processor_batch_duration_seconds"
	b := func(le string) key { return key{m, bucketKey + le} }
	then := reading{at: t0, v: map[key]float64{
		{m, countKey}: 10, {m, sumKey}: 1, b("0.1"): 10, b("1"): 10,
		{"c", ""}: 100,
	}, bounds: map[string][]float64{m: {0.1, 1}}}
	now := reading{at: t0.Add(10 * time.Second), v: map[key]float64{
		// 100 more: 50 at or below 0.1, 40 in (0.1, 1], 10 above 1
		{m, countKey}: 110, {m, sumKey}: 31, b("0.1"): 60, b("1"): 100,
		{"c", ""}: 150, {"new", ""}: 20,
	}, bounds: then.bounds}

	h, ok := histogramBetween(&now, &then, m)
	if !ok {
		t.Fatal("no histogram")
	}
	if h.count != 100 {
		t.Errorf("window count %v, want 100", h.count)
	}
	for _, tc := range []struct {
		q, want float64
	}{
		{0.25, 0.05},   // rank 25 of the 50 in [0, 0.1]
		{0.5, 0.1},     // rank 50: the top of the first bucket
		{0.7, 0.55},    // rank 70: 20 of the 40 in (0.1, 1]
		{0.99, 1},      // rank 99 is above the highest finite bound: that bound
		{0.001, .0002}, // rank 0.1 of 50 in [0, 0.1]
	} {
		if got := h.quantile(tc.q); got == nil || math.Abs(*got-tc.want) > 1e-9 {
			t.Errorf("q%v: got %v, want %v", tc.q, deref(got), tc.want)
		}
	}
	if got := h.mean(); got == nil || math.Abs(*got-0.3) > 1e-9 {
		t.Errorf("mean %v, want 0.3", deref(got))
	}
	if got := perSecond(&now, &then, key{"c", ""}); got == nil || *got != 5 {
		t.Errorf("rate %v, want 5/s", deref(got))
	}
	if got := perSecond(&now, &then, key{"new", ""}); got == nil || *got != 2 {
		t.Errorf("rate of a counter that appeared in the window %v, want 2/s (from 0)", deref(got))
	}
	if got := perSecond(&now, nil, key{"c", ""}); got != nil {
		t.Errorf("rate without an earlier reading: %v, want none", *got)
	}
	idle, _ := histogramBetween(&now, &now, m)
	if q := idle.quantile(.5); q != nil {
		t.Errorf("a window without observations has p50 %v, want none", *q)
	}
}

// The ring keeps the last readings and forgets a series once no reading
// it keeps has it.
func TestRingForgetsGoneSeries(t *testing.T) {
	t.Parallel()
	g := newRing(3)
	t0 := time.Unix(0, 0)
	gone := key{lagMetric, "old" + sep + "t" + sep + "0"}
	live := key{lagMetric, "g" + sep + "t" + sep + "0"}
	g.add(reading{at: t0, v: map[key]float64{gone: 1, live: 1}})
	for i := 1; i <= 6; i++ {
		g.add(reading{at: t0.Add(time.Duration(i) * time.Second), v: map[key]float64{live: float64(i + 1)}})
	}
	if g.len() != 3 {
		t.Fatalf("kept %d readings, want 3", g.len())
	}
	if first := g.row(0); !first.at.Equal(t0.Add(4 * time.Second)) {
		t.Errorf("oldest kept at %v, want 4s", first.at)
	}
	if _, ok := g.cols[gone]; ok {
		t.Error("a series no kept reading has still has a column")
	}
	if v, ok := g.get(g.row(2), live); !ok || v != 7 {
		t.Errorf("newest value %v %v, want 7", v, ok)
	}
	if i := g.since(t0.Add(5500 * time.Millisecond)); i != 1 {
		t.Errorf("reading at or before 5.5s: index %d, want 1 (5s)", i)
	}
	if i := g.since(t0); i != 0 {
		t.Errorf("reading at or before a time older than all: %d, want the oldest", i)
	}
}

func deref(p *float64) any {
	if p == nil {
		return nil
	}
	return *p
}
