package status

import (
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	dto "github.com/prometheus/client_model/go"
)

// track says how the series of one metric are keyed in a reading: summed
// over every label but those kept.
type track struct {
	keep []string
}

// key names one value of a reading: a metric's total (labels ""), its
// value for the kept labels' values (joined by sep), or a histogram's
// count, sum or bucket.
type key struct {
	metric string
	labels string
}

const sep = "\x00"

// Keys of a histogram's parts; label values never start with sep.
const (
	countKey  = sep + "count"
	sumKey    = sep + "sum"
	bucketKey = sep + "le" + sep // + the bucket's upper bound
)

// reading is what the page takes from one gathering of the registry.
type reading struct {
	at time.Time
	v  map[key]float64
	// bounds are each histogram's finite bucket upper bounds, ascending.
	bounds map[string][]float64
}

// read extracts the tracked series from gathered families.
func read(at time.Time, families []*dto.MetricFamily, tracks map[string]track) reading {
	r := reading{at: at, v: map[key]float64{}, bounds: map[string][]float64{}}
	for _, f := range families {
		t, ok := tracks[f.GetName()]
		if !ok {
			continue
		}
		name := f.GetName()
		for _, m := range f.GetMetric() {
			if h := m.GetHistogram(); h != nil {
				r.v[key{name, countKey}] += float64(h.GetSampleCount())
				r.v[key{name, sumKey}] += h.GetSampleSum()
				var bounds []float64
				for _, b := range h.GetBucket() {
					ub := b.GetUpperBound()
					if math.IsInf(ub, +1) {
						continue // the count is the +Inf bucket
					}
					bounds = append(bounds, ub)
					r.v[key{name, bucketKey + strconv.FormatFloat(ub, 'g', -1, 64)}] += float64(b.GetCumulativeCount())
				}
				if _, seen := r.bounds[name]; !seen {
					slices.Sort(bounds)
					r.bounds[name] = bounds
				}
				continue
			}
			v, ok := value(m)
			if !ok {
				continue
			}
			r.v[key{name, ""}] += v
			if len(t.keep) > 0 {
				r.v[key{name, labelValues(m, t.keep)}] += v
			}
		}
	}
	return r
}

func value(m *dto.Metric) (float64, bool) {
	switch {
	case m.Counter != nil:
		return m.Counter.GetValue(), true
	case m.Gauge != nil:
		return m.Gauge.GetValue(), true
	case m.Untyped != nil:
		return m.Untyped.GetValue(), true
	}
	return 0, false
}

// labelValues joins the values of names in m (missing: "").
func labelValues(m *dto.Metric, names []string) string {
	vals := make([]string, len(names))
	for _, l := range m.GetLabel() {
		if i := slices.Index(names, l.GetName()); i >= 0 {
			vals[i] = l.GetValue()
		}
	}
	return strings.Join(vals, sep)
}

// get returns a value of the reading and whether it has it.
func (r reading) get(k key) (float64, bool) {
	v, ok := r.v[k]
	return v, ok
}

// ring keeps the last readings: one column per series ever seen in them,
// one row of float64 per reading (NaN where a reading lacks the series),
// so a sample costs a slice, not a map.
type ring struct {
	size  int
	cols  map[key]int
	keys  []key
	rows  []row // oldest first once full: rows[start], rows[start+1], ...
	start int
	added int
	// bounds are the histograms' bucket bounds seen so far.
	bounds map[string][]float64
}

type row struct {
	at time.Time
	v  []float64
}

func newRing(size int) *ring {
	return &ring{size: max(size, 2), cols: map[key]int{}, bounds: map[string][]float64{}}
}

// add appends a reading, dropping the oldest one once full.
func (g *ring) add(r reading) {
	for name, b := range r.bounds {
		g.bounds[name] = b
	}
	for k := range r.v {
		if _, ok := g.cols[k]; !ok {
			g.cols[k] = len(g.keys)
			g.keys = append(g.keys, k)
		}
	}
	v := make([]float64, len(g.keys))
	for i := range v {
		v[i] = math.NaN()
	}
	for k, x := range r.v {
		v[g.cols[k]] = x
	}
	if len(g.rows) < g.size {
		g.rows = append(g.rows, row{at: r.at, v: v})
	} else {
		g.rows[g.start] = row{at: r.at, v: v}
		g.start = (g.start + 1) % g.size
	}
	// Once per turn of the ring, forget the series no reading in it has
	// (a consumer group deleted, a partition gone), so the columns stay
	// as many as the live series.
	if g.added++; g.added%g.size == 0 {
		g.compact()
	}
}

func (g *ring) compact() {
	live := make([]bool, len(g.keys))
	for _, r := range g.rows {
		for i, x := range r.v {
			if !math.IsNaN(x) {
				live[i] = true
			}
		}
	}
	if !slices.Contains(live, false) {
		return
	}
	var keys []key
	cols := map[key]int{}
	for i, k := range g.keys {
		if live[i] {
			cols[k] = len(keys)
			keys = append(keys, k)
		}
	}
	for ri, r := range g.rows {
		v := make([]float64, 0, len(keys))
		for i, x := range r.v {
			if live[i] {
				v = append(v, x)
			}
		}
		g.rows[ri].v = v
	}
	g.keys, g.cols = keys, cols
}

// len is the number of readings kept.
func (g *ring) len() int { return len(g.rows) }

// row returns the i-th oldest reading.
func (g *ring) row(i int) row { return g.rows[(g.start+i)%len(g.rows)] }

// get returns a series' value in a row.
func (g *ring) get(r row, k key) (float64, bool) {
	i, ok := g.cols[k]
	if !ok || i >= len(r.v) || math.IsNaN(r.v[i]) {
		return 0, false
	}
	return r.v[i], true
}

// reading returns row i as a reading (for the rate and quantile
// arithmetic, which takes the bounds from the reading now).
func (g *ring) reading(i int) reading {
	r := g.row(i)
	out := reading{at: r.at, v: make(map[key]float64, len(r.v))}
	for c, x := range r.v {
		if !math.IsNaN(x) {
			out.v[g.keys[c]] = x
		}
	}
	return out
}

// since returns the index of the newest reading taken at or before t, or
// else the oldest; -1 when the ring is empty.
func (g *ring) since(t time.Time) int {
	best := -1
	for i := range g.len() {
		if !g.row(i).at.After(t) {
			best = i
		}
	}
	if best < 0 && g.len() > 0 {
		return 0
	}
	return best
}
