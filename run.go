package onceflow

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sync/errgroup"

	"github.com/onceflow/onceflow/pipeline/admin"
	"github.com/onceflow/onceflow/pipeline/avro"
	"github.com/onceflow/onceflow/pipeline/ingest"
	"github.com/onceflow/onceflow/pipeline/jobs"
	"github.com/onceflow/onceflow/pipeline/kafka"
	"github.com/onceflow/onceflow/pipeline/natsink"
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
	// NATSink forwards each domain's events topic to a NATS JetStream
	// stream (docs/consumers.md#nats-jetstream); it needs
	// RunConfig.NATSink.URL.
	NATSink bool
}

// All is every component (the dev stack); the NATS sink runs in it when
// RunConfig.NATSink.URL is set.
var All = Components{Ingest: true, Relay: true, Processor: true, Projector: true, Worker: true}

// String lists the components, "ingest,relay,processor,projector,worker"
// for All: how a process's connections are named in Postgres
// (application_name "onceflow ingest,relay,...").
func (c Components) String() string {
	var names []string
	for _, n := range []struct {
		on   bool
		name string
	}{{c.Ingest, "ingest"}, {c.Relay, "relay"}, {c.Processor, "processor"}, {c.Projector, "projector"}, {c.Worker, "worker"}, {c.NATSink, "natsink"}} {
		if n.on {
			names = append(names, n.name)
		}
	}
	return strings.Join(names, ",")
}

// kafka says whether the components use Kafka (a worker alone does not).
func (c Components) kafka() bool { return c.decode() || c.NATSink }

// decode says whether the components encode or decode records, and so
// need the schema registry (the NATS sink forwards the bytes as they
// are).
func (c Components) decode() bool { return c.Ingest || c.Relay || c.Processor || c.Projector }

// RunConfig is one process: which components, their settings, and where
// it listens.
type RunConfig struct {
	Config
	Components Components
	// HTTPAddr is ingest's address (HTTP_ADDR). Default ":8080".
	HTTPAddr string
	// AdminAddr serves /metrics, /healthz, /readyz and the status page
	// (ADMIN_ADDR). Default admin.DefaultAddr, loopback only: they answer
	// without credentials, so Prometheus and probes on other machines
	// reach them once it names an interface they can reach (":9090", a
	// private address; docs/security.md).
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
	// NATSink is the NATS sink's settings; each domain's sink takes its
	// topic, group, stream and subject from the domain.
	NATSink natsink.Config

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
	// registry URL (dev.Run).
	Kafka, RegistryURL string
}

// RunComponents builds and runs the selected components until ctx ends,
// then shuts them down gracefully. A component that fails ends the
// process.
func RunComponents(ctx context.Context, rc RunConfig) error {
	rc.traced()
	p, err := newProcess(ctx, rc)
	if err != nil {
		return err
	}
	defer p.close()
	for _, start := range []func(context.Context) error{p.startRelay, p.startIngest, p.startProjectors, p.startWorker, p.startProcessors, p.startNATSinks, p.startAdmin} {
		if err := start(ctx); err != nil {
			return err
		}
	}
	if rc.Started != nil {
		rc.Started(p.addrs)
	}
	return p.wait(ctx)
}

// traced gives the components Config.TracerProvider: the Kafka clients
// (and the relay's, processor's and projector's own spans, made with the
// provider of their Kafka configuration), ingest, the jobs and the
// webhook deliveries.
func (rc *RunConfig) traced() {
	tp := rc.TracerProvider
	if tp == nil {
		return
	}
	rc.Kafka.TracerProvider = tp
	rc.Ingest.TracerProvider = tp
	rc.Worker.TracerProvider = tp
	rc.Webhooks.TracerProvider = tp
}

// process is one process's components while RunComponents builds and
// runs them: what they share, and the group they run in.
type process struct {
	rc      RunConfig
	dep     *Deployment
	serdes  serdes // nil when no component uses Kafka
	metrics *prometheus.Registry
	adm     *admin.Server
	adminLn net.Listener
	pool    *pgxpool.Pool // nil when no component uses Postgres
	lag     *lagMetrics
	rel     *relay.Relay // the relay, when the process runs one
	// blockers are the processors, for the status page's blocked
	// partitions and their skip.
	blockers []batchBlocker
	addrs    Addrs
	// cancel ends the components (runCtx): when ctx ends, or when any of
	// them fails (g's context).
	cancel  context.CancelFunc
	g       *errgroup.Group
	gctx    context.Context
	closers []func()
}

// newProcess checks rc, sets up what the components share (the admin
// server and its listener, the deployment's topics and serdes, the lag
// metrics, the database pool) and the group they will run in.
func newProcess(ctx context.Context, rc RunConfig) (_ *process, err error) {
	c := rc.Components
	if !c.kafka() && !c.Worker {
		return nil, errors.New("no component selected")
	}
	if c.NATSink && rc.NATSink.URL == "" {
		return nil, errors.New("the NATS sink needs the NATS server's URL (ONCEFLOW_NATS_URL)")
	}
	if rc.ShutdownTimeout == 0 {
		rc.ShutdownTimeout = 20 * time.Second
	}
	if err := validLagExport(rc.LagExport); err != nil {
		return nil, err
	}
	if err := checkOutboxShards(rc.Config, map[string]int{"RunConfig.Ingest.Shards": rc.Ingest.Shards, "RunConfig.Relay.Shards": rc.Relay.Shards, "RunConfig.Reconcile.Shards": rc.Reconcile.Shards}); err != nil {
		return nil, err
	}
	p := &process{rc: rc, metrics: rc.Metrics}
	defer func() {
		if err != nil {
			p.close()
		}
	}()
	if p.metrics == nil {
		p.metrics = admin.NewRegistry()
	}
	p.adm = admin.New(rc.AdminAddr, p.metrics, rc.Logger)
	p.adm.SetToken(rc.AdminToken)
	if rc.AdminRoutes != nil {
		rc.AdminRoutes(p.adm)
	}
	if p.dep, err = rc.Deployment(); err != nil {
		return nil, err
	}
	if c.kafka() {
		// Ingest writes Postgres only: alone, it needs no Kafka
		// permission (docs/security.md#kafka-acls).
		if c.Relay || c.Processor || c.Projector {
			if err := rc.Config.EnsureTopics(ctx); err != nil {
				return nil, fmt.Errorf("topics: %w", err)
			}
			if err := checkAccess(ctx, rc, p.dep); err != nil {
				return nil, err
			}
		}
	}
	if c.decode() {
		reg := rc.Registry
		if reg == nil {
			if reg, err = registry(ctx, rc.Config, p.dep); err != nil {
				return nil, err
			}
		}
		if p.serdes, err = newSerdes(ctx, reg, p.dep); err != nil {
			return nil, err
		}
	}
	// Listeners are bound before anything runs, so Started can report them.
	if p.adminLn, err = net.Listen("tcp", p.adm.Addr()); err != nil {
		return nil, fmt.Errorf("admin listen: %w", err)
	}
	p.closers = append(p.closers, func() { p.adminLn.Close() })
	p.addrs.Admin = p.adminLn.Addr().String()
	if err := p.openLag(); err != nil {
		return nil, err
	}
	// A cluster-wide lag export reads projectors' offsets from Postgres,
	// even in a process that runs none of the components using it.
	if c.Ingest || c.Relay || c.Projector || c.Worker || rc.LagExport == LagExportCluster && rc.DatabaseURL != "" {
		db := rc.Config
		db.applicationName = "onceflow " + c.String()
		if p.pool, err = db.OpenDatabase(ctx, rc.DatabaseMaxConns); err != nil {
			return nil, err
		}
		p.closers = append(p.closers, p.pool.Close)
		p.adm.AddCheck("postgres", func(ctx context.Context) error { return p.pool.Ping(ctx) })
	}
	if rc.LagExport == LagExportCluster {
		p.lag.AddFinder(func(ctx context.Context) ([]kafka.LagSource, error) { return p.dep.LagSources(ctx, p.lag.cl, p.pool) })
	}
	runCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	p.cancel = cancel
	p.closers = append(p.closers, cancel)
	p.g, p.gctx = errgroup.WithContext(runCtx)
	return p, nil
}

// openLag sets up the lag metrics the process exports: its own consumers'
// (each consumer component adds itself), the cluster's, or none. A
// process of no Kafka component (a worker) has no lag of its own to
// export, and needs no Kafka unless told to export the cluster's.
func (p *process) openLag() error {
	p.lag = &lagMetrics{}
	if p.rc.LagExport == LagExportCluster || p.rc.LagExport != LagExportOff && p.rc.Components.kafka() {
		lag, err := newLagMetrics(p.rc.Config, p.metrics)
		if err != nil {
			return err
		}
		p.lag = lag
		p.closers = append(p.closers, lag.close)
	}
	return nil
}

// ownLag exports the lag of one of the process's consumers, unless the
// process exports the cluster's or none.
func (p *process) ownLag(s kafka.LagSource) {
	if p.rc.LagExport == "" || p.rc.LagExport == LagExportOwn {
		p.lag.Add(s)
	}
}

// startRelay starts the relay and, with a reconcile interval, the
// periodic reconciliation.
func (p *process) startRelay(context.Context) error {
	if !p.rc.Components.Relay {
		return nil
	}
	rel, err := newRelay(p.rc.Config, p.rc.Relay, p.pool, p.dep, p.metrics)
	if err != nil {
		return err
	}
	p.rel = rel
	p.g.Go(func() error { return rel.Run(p.gctx) })
	if p.rc.Reconcile.Interval <= 0 {
		return nil
	}
	cl, err := p.rc.Kafka.NewClient()
	if err != nil {
		return err
	}
	p.closers = append(p.closers, cl.Close)
	rec, err := newReconciler(p.rc.Config, p.rc.Reconcile, p.pool, p.dep, p.serdes, cl, p.metrics)
	if err != nil {
		return err
	}
	p.g.Go(func() error { return rec.Run(p.gctx) })
	return nil
}

// startIngest binds ingest's listener and starts it; in the relay's
// process, each commit wakes the relay.
func (p *process) startIngest(context.Context) error {
	if !p.rc.Components.Ingest {
		return nil
	}
	icfg := p.rc.Ingest
	if p.rel != nil && icfg.OnAccept == nil {
		icfg.OnAccept = func(shards []int) []int { return p.rel.WakeHeld(shards...) }
	}
	srv, err := newIngest(p.rc.Config, icfg, p.pool, p.dep, p.serdes, p.metrics)
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", orDefault(p.rc.HTTPAddr, ":8080"))
	if err != nil {
		return fmt.Errorf("ingest listen: %w", err)
	}
	p.addrs.HTTP = ln.Addr().String()
	p.g.Go(func() error { return srv.Serve(p.gctx, ln) })
	return nil
}

// startProjectors starts a projector per domain.
func (p *process) startProjectors(context.Context) error {
	if !p.rc.Components.Projector {
		return nil
	}
	for _, d := range p.dep.Domains {
		proj, err := newProjector(p.rc.Config, p.rc.Projector, p.rc.Worker, p.rc.Webhooks, p.pool, d, p.serdes, p.dep.metricsFor(p.metrics, "domain", d.Name, len(p.dep.Domains)))
		if err != nil {
			return err
		}
		p.adm.AddCheck(p.dep.checkName("projector", d.Name, len(p.dep.Domains)), readyCheck(proj.Ready()))
		p.ownLag(proj.LagSource())
		p.g.Go(func() error { return proj.Run(p.gctx) })
	}
	return nil
}

// startWorker starts the worker of onceflow's jobs.
func (p *process) startWorker(context.Context) error {
	if !p.rc.Components.Worker {
		return nil
	}
	w, err := newWorker(p.rc.Config, p.rc.Worker, p.rc.Webhooks, p.pool, p.dep, p.metrics)
	if err != nil {
		return err
	}
	p.adm.AddCheck("worker", readyCheck(w.Ready()))
	p.g.Go(func() error { return w.Run(p.gctx) })
	return nil
}

// startProcessors starts a processor per aggregate type.
func (p *process) startProcessors(context.Context) error {
	if !p.rc.Components.Processor {
		return nil
	}
	all := p.dep.Aggregates()
	for _, a := range all {
		proc, err := newProcessor(p.rc.Config, p.rc.Processor, p.dep, a, p.serdes, p.dep.metricsFor(p.metrics, "aggregate", a.Topics.Prefix, len(all)))
		if err != nil {
			return err
		}
		if b, ok := proc.(batchBlocker); ok {
			p.blockers = append(p.blockers, b)
		}
		p.adm.AddCheck(p.dep.checkName("processor", a.Topics.Prefix, len(all)), readyCheck(proc.Ready()))
		p.ownLag(kafka.LagSource{Group: a.group, Topics: []string{a.Topics.Commands()}})
		p.g.Go(func() error { return proc.Run(p.gctx) })
	}
	return nil
}

// startNATSinks starts a NATS sink per domain.
func (p *process) startNATSinks(context.Context) error {
	if !p.rc.Components.NATSink {
		return nil
	}
	for _, d := range p.dep.Domains {
		sink, err := newNATSink(p.rc.Config, p.rc.NATSink, d, p.dep.metricsFor(p.metrics, "domain", d.Name, len(p.dep.Domains)))
		if err != nil {
			return err
		}
		p.adm.AddCheck(p.dep.checkName("natsink", d.Name, len(p.dep.Domains)), readyCheck(sink.Ready()))
		p.ownLag(sink.LagSource())
		p.g.Go(func() error { return sink.Run(p.gctx) })
	}
	return nil
}

// startAdmin starts the status page and the admin server.
func (p *process) startAdmin(context.Context) error {
	page, closePage, err := statusPage(p.rc, p.adm, p.metrics, p.pool, p.dep, p.blockers)
	if err != nil {
		return err
	}
	p.closers = append(p.closers, closePage)
	p.g.Go(func() error { return page.Run(p.gctx) })
	p.g.Go(func() error { return p.adm.Serve(p.gctx, p.adminLn) })
	return nil
}

// wait returns when a component fails, or after ctx ends and the
// components have finished their work in flight (within the shutdown
// timeout).
func (p *process) wait(ctx context.Context) error {
	done := make(chan error, 1)
	go func() { done <- p.g.Wait() }()
	select {
	case err := <-done: // a component failed (or all stopped)
		return err
	case <-ctx.Done():
	}
	p.rc.Logger.Info("shutting down: finishing work in flight", "timeout", p.rc.ShutdownTimeout)
	p.cancel()
	select {
	case err := <-done:
		return err
	case <-time.After(p.rc.ShutdownTimeout):
		return fmt.Errorf("shutdown did not finish within %s", p.rc.ShutdownTimeout)
	}
}

// close releases what newProcess and the components' starts opened, the
// last first.
func (p *process) close() {
	for i := len(p.closers) - 1; i >= 0; i-- {
		p.closers[i]()
	}
}

func readyCheck(ready <-chan struct{}) func(context.Context) error {
	return func(context.Context) error {
		select {
		case <-ready:
			return nil
		default:
			return admin.ErrStarting
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
