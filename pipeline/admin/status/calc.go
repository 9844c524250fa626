package status

import (
	"math"
	"strconv"
)

// perSecond is a counter's rate between two readings: nil without an
// earlier reading. A counter the earlier reading lacks started since, at 0;
// one that went down was reset, and its rate counts from 0 (as
// Prometheus's rate does).
func perSecond(now, then *reading, k key) *float64 {
	if then == nil {
		return nil
	}
	dt := now.at.Sub(then.at).Seconds()
	if dt <= 0 {
		return nil
	}
	v, ok := now.get(k)
	if !ok {
		return nil
	}
	was, _ := then.get(k)
	inc := v - was
	if inc < 0 {
		inc = v
	}
	r := inc / dt
	return &r
}

// windowHistogram is a histogram's increase between two readings (then
// nil: since the start): its observation count and cumulative buckets.
type windowHistogram struct {
	count, sum float64
	bounds     []float64 // finite upper bounds, ascending
	cumulative []float64 // observations at or below each bound
}

func histogramBetween(now, then *reading, metric string) (windowHistogram, bool) {
	count, ok := now.get(key{metric, countKey})
	if !ok {
		return windowHistogram{}, false
	}
	h := windowHistogram{count: count, bounds: now.bounds[metric]}
	h.sum, _ = now.get(key{metric, sumKey})
	h.cumulative = make([]float64, len(h.bounds))
	for i, b := range h.bounds {
		h.cumulative[i], _ = now.get(key{metric, bucketKey + strconv.FormatFloat(b, 'g', -1, 64)})
	}
	if then == nil {
		return h, true
	}
	was, ok := then.get(key{metric, countKey})
	if !ok || was > count { // not there yet, or reset: the whole histogram is the window's
		return h, true
	}
	h.count -= was
	s, _ := then.get(key{metric, sumKey})
	h.sum -= s
	for i, b := range h.bounds {
		c, _ := then.get(key{metric, bucketKey + strconv.FormatFloat(b, 'g', -1, 64)})
		h.cumulative[i] -= c
	}
	return h, true
}

// quantile estimates the q-quantile of the observations the way
// Prometheus's histogram_quantile does: find the bucket the rank falls
// in and interpolate linearly within it, from 0 for the first bucket; a
// rank above the highest finite bound is that bound. Nil without
// observations.
func (h windowHistogram) quantile(q float64) *float64 {
	if h.count <= 0 || len(h.bounds) == 0 {
		return nil
	}
	rank := q * h.count
	lower, below := 0.0, 0.0
	for i, ub := range h.bounds {
		c := h.cumulative[i]
		if c >= rank {
			v := ub
			if in := c - below; in > 0 {
				v = lower + (ub-lower)*(rank-below)/in
			}
			return &v
		}
		lower, below = ub, c
	}
	v := h.bounds[len(h.bounds)-1]
	return &v
}

func (h windowHistogram) mean() *float64 {
	if h.count <= 0 {
		return nil
	}
	v := h.sum / h.count
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return nil
	}
	return &v
}
