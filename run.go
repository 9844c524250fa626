package onceflow

import (
	"context"
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sync/errgroup"

	"github.com/onceflow/onceflow/pipeline/admin"
	"github.com/onceflow/onceflow/pipeline/avro"
	"github.com/onceflow/onceflow/pipeline/ingest"
	"github.com/onceflow/onceflow/pipeline/jobs"
	"github.com/onceflow/onceflow/pipeline/kafka"
	"github.com/onceflow/onceflow/pipeline/processor"
	"github.com/onceflow/onceflow/pipeline/projector"
	"github.com/onceflow/onceflow/pipeline/reconcile"
	"github.com/onceflow/onceflow/pipeline/relay"
	"github.com/onceflow/onceflow/pipeline/webhooks"
)

// Components selects what one process runs.
type Components struct {
	Ingest, Relay, Processor, Projector bool
	// Worker runs jobs (docs/jobs.md): webhook deliveries.
	Worker bool
}

// All is every component (the dev stack).
var All = Components{Ingest: true, Relay: true, Processor: true, Projector: true, Worker: true}

// kafka says whether the components use Kafka (a worker alone does not).
func (c Components) kafka() bool { return c.Ingest || c.Relay || c.Processor || c.Projector }

// RunConfig is one process: which components, their settings, and where
// it listens.
type RunConfig struct {
	Config
	Components Components
	// HTTPAddr is ingest's address (HTTP_ADDR). Default ":8080".
	HTTPAddr string
	// AdminAddr serves /metrics, /healthz, /readyz (ADMIN_ADDR). Default
	// ":9090", every interface, so that Prometheus and probes on other
	// machines reach it; bind it to loopback or a private interface where
	// they can (docs/security.md). `onceflow dev` defaults to loopback.
	AdminAddr string
	// AdminToken is the bearer token the admin routes that act require
	// (ONCEFLOW_ADMIN_TOKEN); empty disables them.
	AdminToken string
	// Registry, if set, is used instead of building one (the dev stack
	// shares the registry it serves over HTTP).
	Registry avro.Registry
	// Metrics, if set, receives the metrics instead of a new registry.
	Metrics *prometheus.Registry
	// Admin, if set, also receives the process's routes (the dev stack
	// adds the schema registry).
	AdminRoutes func(*admin.Server)
	// StatusInterval is how often the status page (/status on the admin
	// address) samples the metrics for its rates and plots. Default 10s.
	StatusInterval time.Duration
	// LagExport is which consumers' lag the process exports
	// (ONCEFLOW_LAG_EXPORT): LagExportOwn, LagExportCluster or
	// LagExportOff. Default LagExportOwn.
	LagExport string

	Ingest    ingest.Config
	Relay     relay.Config
	Processor processor.Config
	Projector projector.Config
	// Reconcile, with an Interval, makes the relay component reconcile
	// periodically (ONCEFLOW_RECONCILE_INTERVAL; docs/operations.md#reconcile)
	// with the domains' authorities. Default: it does not.
	Reconcile reconcile.Config
	// Worker is the worker's jobs settings; its Queue and MaxAttempts are
	// also the projector's, which enqueues the jobs.
	Worker   jobs.Config
	Webhooks webhooks.Config

	// ShutdownTimeout bounds the graceful shutdown after ctx ends: work in
	// flight is finished and committed, then Run returns. Default 20s.
	ShutdownTimeout time.Duration
	// Started, if set, is called once every component has started (the
	// admin and HTTP listeners are bound).
	Started func(Addrs)
}

// Addrs are the addresses a running process listens on.
type Addrs struct {
	HTTP, Admin string
	// Kafka and RegistryURL are the dev stack's broker address and schema
	// registry URL (RunDev).
	Kafka, RegistryURL string
}

// RunComponents builds and runs the selected components until ctx ends,
// then shuts them down gracefully. A component that fails ends the
// process.
func RunComponents(ctx context.Context, rc RunConfig) error {
	c := rc.Components
	if !c.kafka() && !c.Worker {
		return errors.New("no component selected")
	}
	if rc.ShutdownTimeout == 0 {
		rc.ShutdownTimeout = 20 * time.Second
	}
	if err := validLagExport(rc.LagExport); err != nil {
		return err
	}
	logger := rc.Logger
	metrics := rc.Metrics
	if metrics == nil {
		metrics = admin.NewRegistry()
	}
	adm := admin.New(rc.AdminAddr, metrics, logger)
	adm.SetToken(rc.AdminToken)
	if rc.AdminRoutes != nil {
		rc.AdminRoutes(adm)
	}

	dep, err := rc.Deployment()
	if err != nil {
		return err
	}
	var serdes serdes
	if c.kafka() {
		if err := rc.Config.EnsureTopics(ctx); err != nil {
			return fmt.Errorf("topics: %w", err)
		}
		reg := rc.Registry
		if reg == nil {
			if reg, err = registry(ctx, rc.Config, dep); err != nil {
				return err
			}
		}
		if serdes, err = newSerdes(ctx, reg, dep); err != nil {
			return err
		}
	}

	// Listeners are bound before anything runs, so Started can report them.
	adminLn, err := net.Listen("tcp", orDefault(rc.AdminAddr, ":9090"))
	if err != nil {
		return fmt.Errorf("admin listen: %w", err)
	}
	defer adminLn.Close()

	// runCtx ends the components; it is canceled when ctx ends or when any
	// of them fails.
	runCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	defer cancel()
	g, gctx := errgroup.WithContext(runCtx)
	addrs := Addrs{Admin: adminLn.Addr().String()}
	// own: each consumer component adds its source below.
	// A process of no Kafka component (a worker) has no lag of its own to
	// export, and needs no Kafka unless told to export the cluster's.
	lag := &lagMetrics{}
	if rc.LagExport == LagExportCluster || rc.LagExport != LagExportOff && c.kafka() {
		if lag, err = newLagMetrics(rc.Config, metrics); err != nil {
			return err
		}
		defer lag.close()
	}
	ownLag := func(s kafka.LagSource) {
		if rc.LagExport == "" || rc.LagExport == LagExportOwn {
			lag.Add(s)
		}
	}

	// A cluster-wide lag export reads projectors' offsets from Postgres,
	// even in a process that runs none of the components using it.
	var pool *pgxpool.Pool
	if c.Ingest || c.Relay || c.Projector || c.Worker || rc.LagExport == LagExportCluster && rc.DatabaseURL != "" {
		if pool, err = rc.Config.OpenDatabase(ctx, rc.DatabaseMaxConns); err != nil {
			return err
		}
		defer pool.Close()
		adm.AddCheck("postgres", func(ctx context.Context) error { return pool.Ping(ctx) })
	}
	if rc.LagExport == LagExportCluster {
		lag.AddFinder(func(ctx context.Context) ([]kafka.LagSource, error) { return dep.LagSources(ctx, lag.cl, pool) })
	}

	if c.Ingest || c.Relay || c.Projector {
		var rel *relay.Relay
		if c.Relay {
			r, err := newRelay(rc.Config, rc.Relay, pool, dep, metrics)
			if err != nil {
				return err
			}
			rel = r
			g.Go(func() error { return rel.Run(gctx) })
			if rc.Reconcile.Interval > 0 {
				cl, err := rc.Kafka.NewClient()
				if err != nil {
					return err
				}
				defer cl.Close()
				rec, err := newReconciler(rc.Config, rc.Reconcile, pool, dep, serdes, cl, metrics)
				if err != nil {
					return err
				}
				g.Go(func() error { return rec.Run(gctx) })
			}
		}
		if c.Ingest {
			icfg := rc.Ingest
			if rel != nil && icfg.OnAccept == nil {
				icfg.OnAccept = rel.Wake // same process: wake the relay after each commit
			}
			srv, err := newIngest(rc.Config, icfg, pool, dep, serdes, metrics)
			if err != nil {
				return err
			}
			ln, err := net.Listen("tcp", orDefault(rc.HTTPAddr, ":8080"))
			if err != nil {
				return fmt.Errorf("ingest listen: %w", err)
			}
			addrs.HTTP = ln.Addr().String()
			g.Go(func() error { return srv.Serve(gctx, ln) })
		}
		if c.Projector {
			for _, d := range dep.Domains {
				proj, err := newProjector(rc.Config, rc.Projector, rc.Worker, pool, d, serdes, dep.metricsFor(metrics, "domain", d.Name, len(dep.Domains)))
				if err != nil {
					return err
				}
				adm.AddCheck(dep.checkName("projector", d.Name, len(dep.Domains)), readyCheck(proj.Ready()))
				ownLag(proj.LagSource())
				g.Go(func() error { return proj.Run(gctx) })
			}
		}
	}
	if c.Worker {
		w, err := newWorker(rc.Config, rc.Worker, rc.Webhooks, pool, metrics)
		if err != nil {
			return err
		}
		adm.AddCheck("worker", readyCheck(w.Ready()))
		g.Go(func() error { return w.Run(gctx) })
	}
	if c.Processor {
		all := dep.Aggregates()
		for _, a := range all {
			proc, err := newProcessor(rc.Config, rc.Processor, dep, a, serdes, dep.metricsFor(metrics, "aggregate", a.Topics.Prefix, len(all)))
			if err != nil {
				return err
			}
			adm.AddCheck(dep.checkName("processor", a.Topics.Prefix, len(all)), readyCheck(proc.Ready()))
			ownLag(kafka.LagSource{Group: a.group, Topics: []string{a.Topics.Commands()}})
			g.Go(func() error { return proc.Run(gctx) })
		}
	}
	page, closePage, err := statusPage(rc, adm, metrics, pool, dep)
	if err != nil {
		return err
	}
	defer closePage()
	g.Go(func() error { return page.Run(gctx) })
	g.Go(func() error { return adm.Serve(gctx, adminLn) })
	if rc.Started != nil {
		rc.Started(addrs)
	}

	done := make(chan error, 1)
	go func() { done <- g.Wait() }()
	select {
	case err := <-done: // a component failed (or all stopped)
		return err
	case <-ctx.Done():
	}
	logger.Info("shutting down: finishing work in flight", "timeout", rc.ShutdownTimeout)
	cancel()
	select {
	case err := <-done:
		return err
	case <-time.After(rc.ShutdownTimeout):
		return fmt.Errorf("shutdown did not finish within %s", rc.ShutdownTimeout)
	}
}

func readyCheck(ready <-chan struct{}) func(context.Context) error {
	return func(context.Context) error {
		select {
		case <-ready:
			return nil
		default:
			return errors.New("starting")
		}
	}
}

func orDefault(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

// metricsFor is the registerer of one of n components of a kind: reg
// itself when there is one, so a deployment of one domain exports the
// series it always did; else reg with a constant label (label=value) that
// tells them apart.
func (dep *Deployment) metricsFor(reg prometheus.Registerer, label, value string, n int) prometheus.Registerer {
	if n == 1 {
		return reg
	}
	return prometheus.WrapRegistererWith(prometheus.Labels{label: value}, reg)
}

// checkName is the /readyz check of one of n components of a kind.
func (dep *Deployment) checkName(kind, name string, n int) string {
	if n == 1 {
		return kind
	}
	return kind + " " + name
}
