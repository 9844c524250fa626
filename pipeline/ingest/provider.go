package ingest

import (
	"bytes"
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Provider is one sender of webhooks whose events ingest accepts at POST
// /v1/inbound/{Name} and turns into commands (docs/inbound.md). Providers
// are configuration (ParseProviders reads them from JSON), not code.
type Provider struct {
	// Name is the path segment: lowercase letters, digits, '-' and '_'.
	// Required.
	Name string
	// Scheme is how deliveries are signed: SchemeStandardWebhooks or
	// SchemeStripe. Required.
	Scheme string
	// Secrets are the signing secrets; a delivery signed with any of them
	// is accepted (rotation). Required.
	Secrets []string
	// Tolerance is how far a delivery's signed timestamp may be from now,
	// either way; beyond it the delivery is refused as stale (a replay).
	// Default 5m.
	Tolerance time.Duration
	// Tenant owns the aggregates the provider's commands go to. Required.
	Tenant string
	// EventID, EventType, AggregateID and Version say where a delivery
	// holds the provider's event id, its type, the tenant-local id of the
	// aggregate it is about, and its version or sequence: a JSON pointer
	// into the body (RFC 6901, "/data/object/id") or "header:Name". EventID
	// defaults to header:webhook-id under Standard Webhooks and to /id
	// under Stripe's scheme; EventType to /type. AggregateID is required
	// unless every event type sets its own. Version is optional: without
	// it, order is by Precedence alone.
	EventID, EventType, AggregateID, Version string
	// Events maps an event type to the command it becomes. A type not in
	// it is stored as ignored and answered 200 (providers send many types
	// and retry a refusal for days).
	Events map[string]ProviderEvent
}

// ProviderEvent is what one event type becomes.
type ProviderEvent struct {
	// Command is the command type (one an HTTP route of the deployment
	// accepts, whose aggregate type then receives it). Empty: the event is
	// stored and takes part in ordering, and makes no command.
	Command string
	// Fields maps each field of the command (its JSON name, as in the
	// route's body) to a JSON pointer into the delivery's body. Every
	// required field of the command must be mapped.
	Fields map[string]string
	// Precedence ranks the event type among the provider's types for one
	// aggregate: an event never wins over one already applied with a
	// higher precedence (payment.succeeded 2 over payment.failed 1, so a
	// late failure never undoes a success). Default 0.
	Precedence int
	// AggregateID, if set, replaces the provider's AggregateID for this
	// type.
	AggregateID string
}

// DefaultInboundTolerance is a provider's default timestamp tolerance.
const DefaultInboundTolerance = 5 * time.Minute

// DefaultInboundRetention is how long a provider's event ids are kept by
// default: longer than any provider retries (Stripe: 3 days, Standard
// Webhooks senders: days), with room for manual replays.
const DefaultInboundRetention = 30 * 24 * time.Hour

var providerNameRe = regexp.MustCompile(`^[a-z0-9][a-z0-9_-]{0,62}$`)

// providerFile is the JSON form of the providers' configuration.
type providerFile struct {
	Providers []struct {
		Name        string   `json:"name"`
		Scheme      string   `json:"scheme"`
		Secrets     []string `json:"secrets"`
		SecretsEnv  string   `json:"secrets_env"`
		Tolerance   string   `json:"tolerance"`
		Tenant      string   `json:"tenant"`
		EventID     string   `json:"event_id"`
		EventType   string   `json:"event_type"`
		AggregateID string   `json:"aggregate_id"`
		Version     string   `json:"version"`
		Events      map[string]struct {
			Command     string            `json:"command"`
			Fields      map[string]string `json:"fields"`
			Precedence  int               `json:"precedence"`
			AggregateID string            `json:"aggregate_id"`
		} `json:"events"`
	} `json:"providers"`
}

// ParseProviders reads the providers' configuration (ONCEFLOW_INBOUND_CONFIG,
// docs/inbound.md): {"providers": [{"name", "scheme", "secrets" or
// "secrets_env", "tolerance", "tenant", "event_id", "event_type",
// "aggregate_id", "version", "events": {type: {"command", "fields",
// "precedence", "aggregate_id"}}}]}. secrets_env names an environment
// variable (read with getenv) holding the secrets, comma separated, so the
// file itself need hold none.
func ParseProviders(data []byte, getenv func(string) string) ([]Provider, error) {
	var f providerFile
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&f); err != nil {
		return nil, fmt.Errorf("inbound providers: %w", err)
	}
	var out []Provider
	for _, fp := range f.Providers {
		p := Provider{
			Name: fp.Name, Scheme: fp.Scheme, Secrets: fp.Secrets, Tenant: fp.Tenant,
			EventID: fp.EventID, EventType: fp.EventType, AggregateID: fp.AggregateID, Version: fp.Version,
			Events: map[string]ProviderEvent{},
		}
		if fp.SecretsEnv != "" {
			for _, s := range strings.Split(getenv(fp.SecretsEnv), ",") {
				if s = strings.TrimSpace(s); s != "" {
					p.Secrets = append(p.Secrets, s)
				}
			}
			if len(p.Secrets) == 0 {
				return nil, fmt.Errorf("inbound provider %q: %s is not set", fp.Name, fp.SecretsEnv)
			}
		}
		if fp.Tolerance != "" {
			d, err := time.ParseDuration(fp.Tolerance)
			if err != nil || d <= 0 {
				return nil, fmt.Errorf("inbound provider %q: tolerance %q: want a positive duration such as 5m", fp.Name, fp.Tolerance)
			}
			p.Tolerance = d
		}
		for t, e := range fp.Events {
			p.Events[t] = ProviderEvent{Command: e.Command, Fields: e.Fields, Precedence: e.Precedence, AggregateID: e.AggregateID}
		}
		out = append(out, p)
	}
	return out, nil
}

// inboundProvider is a Provider checked against the deployment's routes.
type inboundProvider struct {
	Provider
	verifier verifier
	events   map[string]inboundEvent
}

type inboundEvent struct {
	ProviderEvent
	route       *Route // the route of the command type: its fields, topic and encoder
	aggregateID string
}

func (s *Server) prepareProviders(providers []Provider, byType map[string]*Route) (map[string]*inboundProvider, error) {
	out := map[string]*inboundProvider{}
	var errs []error
	for _, p := range providers {
		bad := func(format string, args ...any) {
			errs = append(errs, fmt.Errorf("ingest: inbound provider %q: "+format, append([]any{p.Name}, args...)...))
		}
		if !providerNameRe.MatchString(p.Name) {
			bad("name: want lowercase letters, digits, '-' and '_'")
		}
		if out[p.Name] != nil {
			bad("declared twice")
		}
		if p.Tolerance == 0 {
			p.Tolerance = DefaultInboundTolerance
		}
		if p.EventID == "" {
			p.EventID = "/id"
			if p.Scheme == SchemeStandardWebhooks {
				p.EventID = "header:webhook-id"
			}
		}
		if p.EventType == "" {
			p.EventType = "/type"
		}
		v, err := newVerifier(p.Scheme, p.Secrets, p.Tolerance)
		if err != nil {
			bad("%v", err)
		}
		if err := validateTenant(p.Tenant); err != nil {
			bad("tenant: %v", err)
		}
		// Sorted, so the error lists its problems in one order.
		for _, w := range [][2]string{{"event_id", p.EventID}, {"event_type", p.EventType}, {"aggregate_id", p.AggregateID}, {"version", p.Version}} {
			if what, loc := w[0], w[1]; loc != "" && !validLocation(loc) {
				bad("%s %q: want a JSON pointer (/a/b) or header:Name", what, loc)
			} else if why := unsigned(p.Scheme, loc); why != "" {
				bad("%s %q: %s", what, loc, why)
			}
		}
		ip := &inboundProvider{Provider: p, verifier: v, events: map[string]inboundEvent{}}
		for t, e := range p.Events {
			ie := inboundEvent{ProviderEvent: e, aggregateID: cmp.Or(e.AggregateID, p.AggregateID)}
			if e.AggregateID != "" && !validLocation(e.AggregateID) {
				bad("event %q: aggregate_id %q: want a JSON pointer or header:Name", t, e.AggregateID)
			} else if why := unsigned(p.Scheme, e.AggregateID); why != "" {
				bad("event %q: aggregate_id %q: %s", t, e.AggregateID, why)
			}
			if ie.aggregateID == "" {
				bad("event %q: no aggregate_id (set the provider's or the event's)", t)
			}
			if e.Command != "" {
				r := byType[e.Command]
				if r == nil {
					bad("event %q: command %q is no command type a route of this deployment accepts", t, e.Command)
					continue
				}
				ie.route = r
				for name, ptr := range e.Fields {
					if !slices.ContainsFunc(r.fields, func(f bodyField) bool { return f.name == name }) {
						bad("event %q: %s has no field %q", t, e.Command, name)
					}
					if !validLocation(ptr) {
						bad("event %q: field %q: %q is not a JSON pointer or header:Name", t, name, ptr)
					} else if why := unsigned(p.Scheme, ptr); why != "" {
						bad("event %q: field %q: %q: %s", t, name, ptr, why)
					}
				}
				for _, f := range r.fields {
					if _, ok := e.Fields[f.name]; !ok && !f.optional {
						bad("event %q: %s needs field %q mapped", t, e.Command, f.name)
					}
				}
			} else if len(e.Fields) > 0 {
				bad("event %q: fields without a command", t)
			}
			ip.events[t] = ie
		}
		out[p.Name] = ip
	}
	return out, errors.Join(errs...)
}

// signedHeaders are the headers each scheme's signature covers: Standard
// Webhooks signs "id.timestamp.body", Stripe "t.body".
var signedHeaders = map[string][]string{
	SchemeStandardWebhooks: {"webhook-id", "webhook-timestamp"},
	SchemeStripe:           nil,
}

// unsigned says why loc cannot be read, "" if it can: a header the
// scheme's signature does not cover can be changed by whoever replays a
// captured delivery within its tolerance (a proxy, a log reader), and an
// event id, type, aggregate, version or field read from it would let them
// make another command of a signed body.
func unsigned(scheme, loc string) string {
	h, ok := strings.CutPrefix(loc, "header:")
	if !ok {
		return ""
	}
	for _, s := range signedHeaders[scheme] {
		if strings.EqualFold(h, s) {
			return ""
		}
	}
	return fmt.Sprintf("the %s signature does not cover that header; read it from the body, which is signed", scheme)
}

func validLocation(loc string) bool {
	if h, ok := strings.CutPrefix(loc, "header:"); ok {
		return h != ""
	}
	return strings.HasPrefix(loc, "/")
}

// delivery is a delivery's body and headers, read by location.
type delivery struct {
	header func(string) string
	body   json.RawMessage
}

// raw returns the JSON value at loc (a header's value as a JSON string).
func (d delivery) raw(loc string) (json.RawMessage, bool) {
	if h, ok := strings.CutPrefix(loc, "header:"); ok {
		v := d.header(h)
		if v == "" {
			return nil, false
		}
		b, _ := json.Marshal(v)
		return b, true
	}
	return jsonPointer(d.body, loc)
}

// text returns the value at loc as text: a string, or an integer's digits.
func (d delivery) text(loc string) (string, bool) {
	raw, ok := d.raw(loc)
	if !ok {
		return "", false
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s, s != ""
	}
	if _, err := strconv.ParseInt(string(raw), 10, 64); err == nil {
		return string(raw), true
	}
	return "", false
}

// jsonPointer resolves an RFC 6901 pointer in doc.
func jsonPointer(doc json.RawMessage, ptr string) (json.RawMessage, bool) {
	cur := doc
	for _, tok := range strings.Split(ptr, "/")[1:] {
		tok = strings.ReplaceAll(strings.ReplaceAll(tok, "~1", "/"), "~0", "~")
		cur = bytes.TrimSpace(cur)
		if len(cur) == 0 {
			return nil, false
		}
		switch cur[0] {
		case '{':
			var m map[string]json.RawMessage
			if json.Unmarshal(cur, &m) != nil {
				return nil, false
			}
			v, ok := m[tok]
			if !ok {
				return nil, false
			}
			cur = v
		case '[':
			var a []json.RawMessage
			i, err := strconv.Atoi(tok)
			if json.Unmarshal(cur, &a) != nil || err != nil || i < 0 || i >= len(a) {
				return nil, false
			}
			cur = a[i]
		default:
			return nil, false
		}
	}
	cur = bytes.TrimSpace(cur)
	if len(cur) == 0 || string(cur) == "null" {
		return nil, false
	}
	return cur, true
}
