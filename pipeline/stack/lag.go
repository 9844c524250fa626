package stack

import (
	"cmp"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/onceflow/onceflow/pipeline/kafka"
	"github.com/onceflow/onceflow/pipeline/processor"
)

// lagMetrics is the process's consumer lag collector
// (kafka_consumergroup_group_lag and _seconds) with the client it measures
// with; each consumer component adds itself.
type lagMetrics struct {
	*kafka.LagCollector
	cl *kgo.Client
}

func newLagMetrics(cfg Config, reg prometheus.Registerer) (*lagMetrics, error) {
	cl, err := cfg.Kafka.NewClient()
	if err != nil {
		return nil, err
	}
	c := kafka.NewLagCollector(cl, cfg.Logger)
	if err := reg.Register(c); err != nil {
		cl.Close()
		return nil, err
	}
	return &lagMetrics{LagCollector: c, cl: cl}, nil
}

func (l *lagMetrics) close() { l.cl.Close() }

// processorLag is the processor group's lag source: offsets it commits to
// Kafka in its transactions.
func processorLag(cfg Config, pcfg processor.Config) kafka.LagSource {
	return kafka.LagSource{Group: cmp.Or(pcfg.Group, processor.DefaultGroup), Topics: []string{cfg.Topics.Commands()}}
}
