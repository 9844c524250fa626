package onceflow

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"regexp"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/onceflow/onceflow/pipeline"
	"github.com/onceflow/onceflow/pipeline/apiclient"
	"github.com/onceflow/onceflow/pipeline/ingest"
	"github.com/onceflow/onceflow/pipeline/kafka"
	"github.com/onceflow/onceflow/pipeline/processor"
	"github.com/onceflow/onceflow/pipeline/projector"
	"github.com/onceflow/onceflow/pipeline/reconcile"
)

// Domain is one domain a deployment runs: its aggregate types, their
// commands, events and state, the read models projected from its events
// and the HTTP routes that accept its commands. docs/your-first-domain.md
// builds one step by step.
//
// Each aggregate type has its own commands, state, dedup and DLQ topics and
// its own processor group; the domain's events, from every aggregate type,
// go to one events topic, which one projector (a consumer group) applies to
// the domain's read models. Topic names (docs/architecture.md#topics-keys-and-headers):
// {prefix}.events for the domain, and {prefix}.commands, .state, .dedup,
// .commands.dlq for a domain with one aggregate type, or
// {prefix}.{aggregate}.commands and so on for each of several.
type Domain struct {
	// Name names the domain: its topic prefix unless ONCEFLOW_TOPIC_PREFIX
	// says otherwise (in a deployment of one domain), and its projector's
	// consumer name. Required: lowercase letters, digits, '-' and '_'.
	Name string
	// Events is the schema of the domain's events: a union of records, one
	// per event type. The records pipeline.CommandRejected and
	// pipeline.CommandFailed are added to it (in the namespace of its first
	// record) unless it declares them. Required.
	Events Schema
	// Aggregates are the domain's aggregate types (see Aggregate). At
	// least one is required.
	Aggregates []AggregateType
	// Projections are the domain's read models in Postgres, applied in the
	// projector's transactions (docs/projector.md). Every domain's
	// projector also applies command_status and audit_log.
	Projections []pipeline.Projection[pgx.Tx]
	// Migrations holds the goose migrations of the read models' tables
	// (NNNNN_name.sql at its root), applied after onceflow's own, with
	// their version in a table of the domain's own
	// (goose_db_version_{name}).
	Migrations fs.FS
	// Routes are the HTTP routes that accept the domain's commands; the
	// application sets each one's topic and encoder from the aggregate
	// type that handles its command.
	Routes []Route
	// Queries are its read routes.
	Queries []Query
	// Consumer is the projector's consumer name: its consumer group, its
	// inbox rows and its stored offsets. Default
	// "onceflow-projector-{name}".
	Consumer string
	// CommandTypeOf, if set, names the command an event answers, for the
	// domain's events written before the processor recorded it in each
	// event (the command-type header): command_status shows it for
	// commands produced straight to Kafka. A new domain needs none.
	CommandTypeOf func(event pipeline.Message) string
	// Demo, if set, is the workload `onceflow demo` drives against a
	// running ingest as the tenant of client; it returns an error unless
	// the read models show what it expects. `make demo` runs it.
	Demo func(ctx context.Context, client *apiclient.Client, out io.Writer) error
	// Authorities are the status checks `onceflow reconcile` asks about
	// the domain's stuck commands, by kind (reconcile.KindPending, …;
	// docs/operations.md#reconcile): the services that know what really
	// happened under an Idempotency-Key or a provider event. Two domains
	// of a deployment may not both set one kind. None: reported only.
	Authorities map[string]reconcile.Authority
	// Jobs are the domain's job kinds (Job): effects beyond the database
	// its events cause, enqueued in its projector's transaction and run
	// by the worker (docs/jobs.md#writing-a-job). Kind names are unique
	// in a deployment.
	Jobs []JobKind
}

// Route is one HTTP route that accepts a command (ingest.Route).
type Route = ingest.Route

// Query is one HTTP route answered from the read models (ingest.Query).
type Query = ingest.Query

// DB is what a Query's Get reads through: a read-only transaction scoped
// to the caller's tenant (ingest.DB).
type DB = ingest.DB

// ErrNotFound is a Query's answer for what the tenant does not have.
var ErrNotFound = ingest.ErrNotFound

// Schema is an Avro schema and the Go types of its records.
type Schema struct {
	// Avro is the schema's JSON text: a union of records.
	Avro string
	// Types are zero values of the records' Go types; each is matched to
	// the record named by its MessageType (short or full name).
	Types []pipeline.Message
}

// AggregateType is one aggregate type of a domain, made by Aggregate.
type AggregateType interface {
	aggregate() *aggregateSpec
}

// Aggregate is an aggregate type: its decider, the schema of the
// commands it handles and of its state, and the names of its processor.
// S is its state.
type Aggregate[S any] struct {
	// Name names the aggregate type within its domain ("account"): in the
	// topics of a domain with several aggregate types, {prefix}.{name}.*.
	// Required: lowercase letters, digits, '-' and '_'.
	Name string
	// Decider decides its commands: one decide function per command type
	// (pipeline.Handle), one evolve. Required.
	Decider *pipeline.Aggregate[S]
	// Commands is the schema of its commands topic: a union with a record
	// per command type the decider handles. Every command type belongs to
	// one aggregate type: a decision that sends a command of another
	// aggregate type's (pipeline.Effect) sends it to that type's topic.
	Commands Schema
	// State is the Avro schema of S: one record. The snapshots on the
	// state topic wrap it (pipeline.SnapshotSchema). Implement
	// processor.AvroState on *S for fast restores.
	State string
	// Group is its processor's consumer group, and its processors'
	// transactional ids are "{group}-{instance id}". Default
	// "onceflow-processor-{topic prefix}".
	Group string
}

func (a Aggregate[S]) aggregate() *aggregateSpec {
	spec := &aggregateSpec{
		name: a.Name, commands: a.Commands, state: a.State, group: a.Group,
		stateType: processor.Snapshot[S]{},
	}
	if a.Decider != nil {
		spec.commandTypes = a.Decider.CommandTypes()
		spec.newProcessor = func(cfg processor.Config, kcfg kafka.Config, serdes processor.Serdes, logger *slog.Logger, reg prometheus.Registerer) (runner, error) {
			return processor.New(cfg, kcfg, a.Decider, serdes, logger, reg)
		}
	}
	return spec
}

// aggregateSpec is an Aggregate without its state type.
type aggregateSpec struct {
	name         string
	commands     Schema
	state        string
	group        string
	commandTypes []string // what the decider handles
	stateType    any      // processor.Snapshot[S]{}, for the state serde
	newProcessor func(processor.Config, kafka.Config, processor.Serdes, *slog.Logger, prometheus.Registerer) (runner, error)
}

// runner is a component that runs until its context ends.
type runner interface {
	Run(ctx context.Context) error
	Ready() <-chan struct{}
}

var nameRE = regexp.MustCompile(`^[a-z][a-z0-9_-]{0,62}$`)

// Deployment is the domains one process runs, with the names of their
// topics and consumers resolved.
type Deployment struct {
	Domains []*DeployedDomain
}

// DeployedDomain is a Domain with its prefix and topics.
type DeployedDomain struct {
	*Domain
	prefix     string
	aggregates []*DeployedAggregate
}

// DeployedAggregate is an aggregate type with its topics and names.
type DeployedAggregate struct {
	*aggregateSpec
	Domain *DeployedDomain
	Topics kafka.Topics
}

// EventsTopic is the domain's events topic.
func (d *DeployedDomain) EventsTopic() string { return kafka.Topics{Prefix: d.prefix}.Events() }

// ProjectorConsumer is the domain's projector's consumer name: its
// consumer group, its inbox rows and its stored offsets.
func (d *DeployedDomain) ProjectorConsumer() string {
	if d.Consumer != "" {
		return d.Consumer
	}
	return "onceflow-projector-" + d.prefix
}

// ProcessorGroup is the consumer group of the aggregate type's processor
// on its commands topic.
func (a *DeployedAggregate) ProcessorGroup() string { return a.group }

// NATSinkGroup is the consumer group of the domain's NATS sink: its
// offsets say which events JetStream has acknowledged.
func (d *DeployedDomain) NATSinkGroup() string { return "onceflow-natsink-" + d.prefix }

// newDeployment checks the domains and resolves their names: prefix, if
// not empty, replaces the one domain's name as its topic prefix
// (ONCEFLOW_TOPIC_PREFIX); topics gives the partitions and retentions.
func newDeployment(domains []*Domain, prefix string, topics kafka.Topics) (*Deployment, error) {
	if len(domains) == 0 {
		return nil, errors.New("no domain: give cli.Main (or Config) the domains to run")
	}
	if prefix != "" && len(domains) > 1 {
		return nil, fmt.Errorf("ONCEFLOW_TOPIC_PREFIX %q names the topics of one domain; this deployment runs %d (each uses its name)", prefix, len(domains))
	}
	dep := &Deployment{}
	seenPrefix, seenType, seenRoute, seenKind := map[string]string{}, map[string]string{}, map[string]string{}, map[string]string{}
	for _, d := range domains {
		if d == nil || !nameRE.MatchString(d.Name) {
			return nil, fmt.Errorf("domain name %q: want lowercase letters, digits, '-' and '_', starting with a letter", nameOf(d))
		}
		rd := &DeployedDomain{Domain: d, prefix: d.Name}
		if prefix != "" {
			rd.prefix = prefix
		}
		if other, dup := seenPrefix[rd.prefix]; dup {
			return nil, fmt.Errorf("domains %s and %s have the same topic prefix %q", other, d.Name, rd.prefix)
		}
		seenPrefix[rd.prefix] = d.Name
		if d.Events.Avro == "" {
			return nil, fmt.Errorf("domain %s: the Events schema is required", d.Name)
		}
		if len(d.Aggregates) == 0 {
			return nil, fmt.Errorf("domain %s: at least one aggregate type is required", d.Name)
		}
		for _, a := range d.Aggregates {
			spec := a.aggregate()
			if !nameRE.MatchString(spec.name) {
				return nil, fmt.Errorf("domain %s: aggregate type name %q: want lowercase letters, digits, '-' and '_'", d.Name, spec.name)
			}
			if spec.newProcessor == nil || spec.commands.Avro == "" || spec.state == "" {
				return nil, fmt.Errorf("domain %s, aggregate type %s: Decider, Commands and State are required", d.Name, spec.name)
			}
			t := topics
			t.Prefix = rd.prefix
			if len(d.Aggregates) > 1 {
				t.Prefix = rd.prefix + "." + spec.name
				t.EventsPrefix = rd.prefix
			}
			at := &DeployedAggregate{aggregateSpec: spec, Domain: rd, Topics: t}
			if at.group == "" {
				at.group = "onceflow-processor-" + t.Prefix
			}
			for _, ct := range spec.commandTypes {
				if other, dup := seenType[ct]; dup {
					return nil, fmt.Errorf("command type %s is handled by %s and by %s/%s: a command type belongs to one aggregate type", ct, other, d.Name, spec.name)
				}
				seenType[ct] = d.Name + "/" + spec.name
			}
			rd.aggregates = append(rd.aggregates, at)
		}
		for _, k := range d.Jobs {
			if k == nil {
				return nil, fmt.Errorf("domain %s: a nil job kind", d.Name)
			}
			spec := k.jobKind()
			if err := spec.validate(d.Name); err != nil {
				return nil, err
			}
			if other, dup := seenKind[spec.kind]; dup {
				return nil, fmt.Errorf("job kind %s is declared by %s and by %s", spec.kind, other, d.Name)
			}
			seenKind[spec.kind] = d.Name
		}
		for _, r := range d.Routes {
			if other, dup := seenRoute[r.Pattern]; dup {
				return nil, fmt.Errorf("route %s is declared by %s and by %s", r.Pattern, other, d.Name)
			}
			seenRoute[r.Pattern] = d.Name
		}
		dep.Domains = append(dep.Domains, rd)
	}
	return dep, nil
}

func nameOf(d *Domain) string {
	if d == nil {
		return "<nil>"
	}
	return d.Name
}

// Aggregates is every aggregate type of the deployment.
func (dep *Deployment) Aggregates() []*DeployedAggregate {
	var out []*DeployedAggregate
	for _, d := range dep.Domains {
		out = append(out, d.aggregates...)
	}
	return out
}

// Handler is the aggregate type that handles commandType, or nil.
func (dep *Deployment) Handler(commandType string) *DeployedAggregate {
	for _, a := range dep.Aggregates() {
		for _, ct := range a.commandTypes {
			if ct == commandType {
				return a
			}
		}
	}
	return nil
}

// CommandTypes lists every command type of the deployment, for usages.
func (dep *Deployment) CommandTypes() string {
	var out []string
	for _, a := range dep.Aggregates() {
		out = append(out, a.commandTypes...)
	}
	return strings.Join(out, ", ")
}

// FindAggregate finds the aggregate type named DOMAIN/TYPE, or the only
// one when name is empty.
func (dep *Deployment) FindAggregate(name string) (*DeployedAggregate, error) {
	all := dep.Aggregates()
	var names []string
	for _, a := range all {
		if name == "" && len(all) == 1 || a.String() == name {
			return a, nil
		}
		names = append(names, a.String())
	}
	if name == "" {
		return nil, fmt.Errorf("the deployment has %d aggregate types: choose one with -aggregate-type (%s)", len(all), strings.Join(names, ", "))
	}
	return nil, fmt.Errorf("no aggregate type %q (the deployment's: %s)", name, strings.Join(names, ", "))
}

// shared reports whether p is a read model of every domain
// (command_status, audit_log).
func shared(p pipeline.Projection[pgx.Tx]) bool {
	switch p.(type) {
	case projector.CommandStatus, projector.AuditLog:
		return true
	}
	return false
}

// ProjectionNames lists the deployment's projections.
func (dep *Deployment) ProjectionNames() string {
	var names []string
	for _, d := range dep.Domains {
		for _, p := range d.ReadModels() {
			if len(dep.Domains) == 1 || !shared(p) {
				names = append(names, p.Name())
			}
		}
	}
	return strings.Join(names, ", ")
}

// FindProjection finds the projection named name and its domain. A read
// model every domain writes (command_status, audit_log) is rebuilt from
// one events topic only in a deployment of one domain: a rebuild from one
// domain's events would drop the others' rows.
func (dep *Deployment) FindProjection(name string) (*DeployedDomain, pipeline.Projection[pgx.Tx], error) {
	for _, d := range dep.Domains {
		for _, p := range d.ReadModels() {
			if p.Name() != name {
				continue
			}
			if len(dep.Domains) > 1 && shared(p) {
				return nil, nil, fmt.Errorf("%s holds the rows of every domain's events; it cannot be rebuilt from one domain's events topic in a deployment of %d domains", name, len(dep.Domains))
			}
			return d, p, nil
		}
	}
	return nil, nil, fmt.Errorf("no projection named %q (the deployment's: %s)", name, dep.ProjectionNames())
}

// FindDomain finds the domain named name, or the only one when name is empty.
func (dep *Deployment) FindDomain(name string) (*DeployedDomain, error) {
	if name == "" {
		if len(dep.Domains) == 1 {
			return dep.Domains[0], nil
		}
		return nil, fmt.Errorf("the deployment runs %d domains: choose one with -domain", len(dep.Domains))
	}
	for _, d := range dep.Domains {
		if d.Name == name {
			return d, nil
		}
	}
	return nil, fmt.Errorf("no domain %q", name)
}
