package onceflow

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/onceflow/onceflow/pipeline/kafka"
	"github.com/onceflow/onceflow/pipeline/projector"
)

// Which consumers' lag a process exports (RunConfig.LagExport,
// ONCEFLOW_LAG_EXPORT).
const (
	// LagExportOwn: the consumers the process runs (its processor group,
	// its projector), the default of the component binaries. Replicas of a
	// component export the same series (dashboards take the max).
	LagExportOwn = "own"
	// LagExportCluster: every consumer group on the cluster and every
	// consumer with offsets in Postgres, what `onceflow lag` shows; the
	// default of `onceflow dev` and of `onceflow lag -serve`. Run it in
	// one process per cluster, as one would run Kafka Lag Exporter: sums
	// over a group's partitions count each exporter once.
	LagExportCluster = "cluster"
	// LagExportOff: no lag metrics.
	LagExportOff = "off"
)

func validLagExport(s string) error {
	switch s {
	case "", LagExportOwn, LagExportCluster, LagExportOff:
		return nil
	}
	return fmt.Errorf("ONCEFLOW_LAG_EXPORT %q: want own, cluster or off", s)
}

// lagMetrics is the process's consumer lag collector (Kafka Lag Exporter's
// metrics, see kafka.LagCollector) with the client it measures with; each
// consumer component adds itself, or a finder adds every consumer.
type lagMetrics struct {
	*kafka.LagCollector
	cl *kgo.Client
}

// NewLagCollector returns a lag collector registered on reg and the client
// it measures with, to close after use.
func NewLagCollector(cfg Config, reg prometheus.Registerer) (*kafka.LagCollector, *kgo.Client, error) {
	cl, err := cfg.Kafka.NewClient()
	if err != nil {
		return nil, nil, err
	}
	c := kafka.NewLagCollector(cl, cfg.Logger)
	if err := reg.Register(c); err != nil {
		cl.Close()
		return nil, nil, err
	}
	return c, cl, nil
}

func newLagMetrics(cfg Config, reg prometheus.Registerer) (*lagMetrics, error) {
	c, cl, err := NewLagCollector(cfg, reg)
	if err != nil {
		return nil, err
	}
	return &lagMetrics{LagCollector: c, cl: cl}, nil
}

func (l *lagMetrics) close() { l.cl.Close() }

// LagSources returns every consumer to measure: each consumer group on the
// cluster and, with a pool, each consumer with offsets in Postgres for a
// domain's events topic (projectors and rebuilds). A consumer's Postgres
// offsets replace its Kafka group's, which are a copy for monitoring that
// trails after a crash. Sorted by name.
func (dep *Deployment) LagSources(ctx context.Context, cl *kgo.Client, pool *pgxpool.Pool) ([]kafka.LagSource, error) {
	var out []kafka.LagSource
	inPostgres := map[string]bool{}
	if pool != nil {
		for _, d := range dep.Domains {
			consumers, err := projector.Consumers(ctx, pool, d.EventsTopic())
			if err != nil {
				return nil, err
			}
			for _, name := range consumers {
				inPostgres[name] = true
				out = append(out, projector.LagSource(pool, name, d.EventsTopic()))
			}
		}
	}
	groups, err := kafka.Groups(ctx, cl)
	if err != nil {
		return nil, err
	}
	for _, g := range groups {
		if !inPostgres[g.Group] {
			out = append(out, g)
		}
	}
	slices.SortFunc(out, func(a, b kafka.LagSource) int { return strings.Compare(a.Group, b.Group) })
	return out, nil
}
