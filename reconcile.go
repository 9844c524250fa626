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

// newReconciler assembles reconciliation for the deployment: the domains'
// authorities (extra wins, `onceflow reconcile -resend`), correcting
// commands encoded by the routes that take them (an ingest server that
// never serves), and every aggregate type's DLQ read with cl.
func newReconciler(cfg Config, rcfg reconcile.Config, pool *pgxpool.Pool, dep *deployment, s serdes, cl *kgo.Client, extra map[string]reconcile.Authority, reg prometheus.Registerer) (*reconcile.Reconciler, error) {
	auth := map[string]reconcile.Authority{}
	for _, d := range dep.domains {
		for kind, a := range d.Authorities {
			if auth[kind] != nil {
				return nil, fmt.Errorf("reconcile: two domains set an authority for %s", kind)
			}
			auth[kind] = a
		}
	}
	for kind, a := range extra {
		auth[kind] = a
	}
	rcfg.Authorities = auth
	if rcfg.Shards == 0 {
		rcfg.Shards = cfg.OutboxShards
	}
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
			for _, a := range dep.aggregates() {
				dls, err := processor.ReadDLQ(ctx, cl, a.topics.DLQ())
				if err != nil {
					return nil, err
				}
				for _, d := range dls {
					out = append(out, reconcile.DeadLetter{Topic: a.topics.DLQ(), CommandsTopic: a.topics.Commands(), DeadLetter: d})
				}
			}
			return out, nil
		}
	}
	return reconcile.New(rcfg, pool, cfg.Logger, reg)
}
