package onceflow

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/onceflow/onceflow/pipeline/ingest"
	"github.com/onceflow/onceflow/pipeline/processor"
	"github.com/onceflow/onceflow/pipeline/reconcile"
)

// NewReconciler assembles reconciliation for the deployment
// (docs/operations.md#reconcile): the domains' authorities, except where
// rcfg.Authorities sets one for a kind (it wins: `onceflow reconcile
// -resend`), correcting commands encoded by the routes that take them, and
// every aggregate type's DLQ read with cl (none without one).
func (cfg Config) NewReconciler(ctx context.Context, rcfg reconcile.Config, pool *pgxpool.Pool, cl *kgo.Client) (*reconcile.Reconciler, error) {
	dep, err := cfg.Deployment()
	if err != nil {
		return nil, err
	}
	s, err := cfg.TopicSerdes(ctx)
	if err != nil {
		return nil, err
	}
	return newReconciler(cfg, rcfg, pool, dep, s, cl, nil)
}

// newReconciler is NewReconciler over the deployment's serdes, its
// metrics registered on reg (none if nil); an ingest server that never
// serves encodes the corrections.
func newReconciler(cfg Config, rcfg reconcile.Config, pool *pgxpool.Pool, dep *Deployment, s serdes, cl *kgo.Client, reg prometheus.Registerer) (*reconcile.Reconciler, error) {
	auth := map[string]reconcile.Authority{}
	for _, d := range dep.Domains {
		for kind, a := range d.Authorities {
			if auth[kind] != nil {
				return nil, fmt.Errorf("reconcile: two domains set an authority for %s", kind)
			}
			auth[kind] = a
		}
	}
	for kind, a := range rcfg.Authorities {
		auth[kind] = a
	}
	rcfg.Authorities = auth
	if err := checkOutboxShards(cfg, map[string]int{"reconcile.Config.Shards": rcfg.Shards}); err != nil {
		return nil, err
	}
	rcfg.Shards = cfg.outboxShards()
	srv, err := newIngest(cfg, ingest.Config{}, pool, dep, s, prometheus.NewRegistry())
	if err != nil {
		return nil, err
	}
	rcfg.Encode = func(ctx context.Context, commandType, localID string, fields json.RawMessage) (string, []byte, error) {
		return srv.EncodeCommand(ctx, commandType, localID, fields)
	}
	if cl != nil {
		rcfg.DeadLetters = func(ctx context.Context) ([]reconcile.DeadLetter, error) {
			var out []reconcile.DeadLetter
			for _, a := range dep.Aggregates() {
				dls, err := processor.ReadDLQ(ctx, cl, a.Topics.DLQ())
				if err != nil {
					return nil, err
				}
				for _, d := range dls {
					out = append(out, reconcile.DeadLetter{Topic: a.Topics.DLQ(), CommandsTopic: a.Topics.Commands(), DeadLetter: d})
				}
			}
			return out, nil
		}
	}
	return reconcile.New(rcfg, pool, cfg.Logger, reg)
}
