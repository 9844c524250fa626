package avro

import (
	"context"
	"errors"
	"fmt"
	"math"
	"reflect"
	"sync"
	"sync/atomic"

	"github.com/linkedin/goavro/v2"

	"github.com/onceflow/onceflow/pipeline"
)

// Serde encodes typed Go values to Confluent-framed Avro and decodes them
// back, for one subject whose schema is a union of records (a commands or
// events topic) or a single record (a state topic). It is safe for
// concurrent use.
//
// Encode writes with the reader schema, the one this binary was built with.
// Decode reads with the writer's schema, found by the id in the header, and
// resolves it to the reader schema (see the package doc).
type Serde struct {
	reg     Registry
	subject string
	text    string // reader schema, as given
	root    *schema
	codec   *goavro.Codec
	b       *builder
	byType  map[reflect.Type]encBranch
	self    *writerPlan // the reader schema read as a writer's

	id    atomic.Int64 // reader schema id, 0 until registered
	regMu sync.Mutex

	plans   sync.Map // writer schema id -> *writerPlan
	mu      sync.Mutex
	pending map[int]*planCall
}

type encBranch struct {
	key string // full record name
	enc encoder
}

// writerPlan decodes data written with one writer schema.
type writerPlan struct {
	codec    *goavro.Codec
	union    bool                     // the writer schema is a union
	branches map[string]branchDecoder // by writer record full name
	root     string                   // the record's name when !union
	err      error                    // the whole writer schema is unusable
}

type branchDecoder struct {
	t   reflect.Type
	dec decoder
	err error
}

type planCall struct {
	done chan struct{}
	plan *writerPlan
	err  error
}

// NewSerde returns a Serde for subject with readerSchema, the schema this
// binary was built with; it is also the schema Encode writes with,
// registered on first use or by Register. types maps each union branch's
// full record name (e.g. "onceflow.ledger.Deposit") to a zero value of its
// Go type (ledger.Deposit{}); for a record schema it maps the record's full
// name. types may also name records nested in the schema, for fields of
// interface type that hold a union of records.
//
// NewSerde checks the Go types against the schema, so a mismatch is found
// at start rather than on the first record: every union branch needs a Go
// type and every Go type a branch; every exported struct field needs an Avro
// field (by `avro:"name"` tag, else snake_case name; `avro:"-"` skips it);
// every Avro field needs a Go field or a default; a type implementing
// pipeline.Message must return its record's name (short or full) from
// MessageType.
func NewSerde(reg Registry, subject, readerSchema string, types map[string]any) (*Serde, error) {
	if reg == nil {
		return nil, errors.New("avro serde: nil registry")
	}
	ps, err := parseSchema(readerSchema)
	if err != nil {
		return nil, fmt.Errorf("avro serde %s: reader schema: %w", subject, err)
	}
	codec, err := goavro.NewCodec(ps.codec)
	if err != nil {
		return nil, fmt.Errorf("avro serde %s: reader schema: %w", subject, err)
	}
	records, err := topRecords(ps.root)
	if err != nil {
		return nil, fmt.Errorf("avro serde %s: %w", subject, err)
	}
	named := map[string]bool{}
	collectRecords(ps.root, named)
	b := &builder{types: map[string]reflect.Type{}}
	for name, zero := range types {
		t := reflect.TypeOf(zero)
		if t != nil && t.Kind() == reflect.Pointer {
			t = t.Elem()
		}
		if t == nil || t.Kind() != reflect.Struct {
			return nil, fmt.Errorf("avro serde %s: types[%q] is %T, want a struct value", subject, name, zero)
		}
		if !named[name] {
			return nil, fmt.Errorf("avro serde %s: types has %s, which is not a record of the schema", subject, name)
		}
		b.types[name] = t
	}
	s := &Serde{
		reg: reg, subject: subject, text: readerSchema, root: ps.root, codec: codec, b: b,
		byType:  map[reflect.Type]encBranch{},
		pending: map[int]*planCall{},
	}
	for _, rec := range records {
		t, ok := b.types[rec.name]
		if !ok {
			return nil, fmt.Errorf("avro serde %s: no Go type for record %s (add it to types)", subject, rec.name)
		}
		if prev, dup := s.byType[t]; dup {
			return nil, fmt.Errorf("avro serde %s: %s is the Go type of both %s and %s", subject, t, prev.key, rec.name)
		}
		if err := checkMessageType(t, rec); err != nil {
			return nil, fmt.Errorf("avro serde %s: %w", subject, err)
		}
		enc, err := b.encoder(rec, t, rec.name)
		if err != nil {
			return nil, fmt.Errorf("avro serde %s: %w", subject, err)
		}
		s.byType[t] = encBranch{key: rec.name, enc: enc}
	}
	// Reading what this binary writes must work: build that plan now.
	s.self = s.newPlan(ps, codec)
	for _, bd := range s.self.branches {
		if bd.err != nil {
			return nil, fmt.Errorf("avro serde %s: %w", subject, bd.err)
		}
	}
	return s, nil
}

// topRecords returns the records a Serde's schema holds at its top.
func topRecords(root *schema) ([]*schema, error) {
	switch root.kind {
	case kindRecord:
		return []*schema{root}, nil
	case kindUnion:
		for i, br := range root.branches {
			if br.kind != kindRecord {
				return nil, fmt.Errorf("union branch %d is %s; a Serde's union holds records only", i, br.describe())
			}
		}
		return root.branches, nil
	}
	return nil, fmt.Errorf("schema is %s; a Serde needs a record or a union of records", root.describe())
}

func collectRecords(s *schema, into map[string]bool) {
	switch s.kind {
	case kindRecord:
		if into[s.name] {
			return
		}
		into[s.name] = true
		for _, f := range s.fields {
			collectRecords(f.typ, into)
		}
	case kindArray:
		collectRecords(s.items, into)
	case kindMap:
		collectRecords(s.values, into)
	case kindUnion:
		for _, b := range s.branches {
			collectRecords(b, into)
		}
	}
}

// checkMessageType checks that a pipeline.Message names its record: the
// type name travels in the command-type / event-type header.
func checkMessageType(t reflect.Type, rec *schema) error {
	if !reflect.PointerTo(t).Implements(typeMessage) {
		return nil
	}
	mt := reflect.New(t).Interface().(pipeline.Message).MessageType()
	if mt != rec.shortName() && mt != rec.name {
		return fmt.Errorf("%s.MessageType() is %q, want the record name %q", t, mt, rec.shortName())
	}
	return nil
}

// Register ensures the reader schema is registered under the subject and
// returns its id. Encode calls it on first use; call it at start to fail
// early when the registry is unreachable or refuses the schema.
func (s *Serde) Register(ctx context.Context) (id int, err error) {
	if id := s.id.Load(); id != 0 {
		return int(id), nil
	}
	s.regMu.Lock()
	defer s.regMu.Unlock()
	if id := s.id.Load(); id != 0 {
		return int(id), nil
	}
	id, err = s.reg.Register(ctx, s.subject, s.text)
	if err != nil {
		return 0, fmt.Errorf("register schema of %s: %w", s.subject, err)
	}
	if id < 1 || uint64(id) > math.MaxUint32 {
		return 0, fmt.Errorf("register schema of %s: id %d does not fit the wire format", s.subject, id)
	}
	s.plans.Store(id, s.self)
	s.id.Store(int64(id))
	return id, nil
}

// Encode returns v framed in the Confluent wire format. v must be a value
// of one of the Go types given to NewSerde, or a pointer to one.
func (s *Serde) Encode(ctx context.Context, v any) ([]byte, error) {
	return s.AppendEncode(ctx, nil, v)
}

// AppendEncode appends the encoding of v to dst, as Encode. On error it
// returns dst unchanged.
func (s *Serde) AppendEncode(ctx context.Context, dst []byte, v any) ([]byte, error) {
	rv := reflect.ValueOf(v)
	if rv.Kind() == reflect.Pointer {
		if rv.IsNil() {
			return dst, fmt.Errorf("encode %T for %s: nil pointer", v, s.subject)
		}
		rv = rv.Elem()
	}
	if !rv.IsValid() {
		return dst, fmt.Errorf("encode for %s: nil value", s.subject)
	}
	br, ok := s.byType[rv.Type()]
	if !ok {
		return dst, fmt.Errorf("encode %T for %s: not one of the subject's Go types", v, s.subject)
	}
	id, err := s.Register(ctx)
	if err != nil {
		return dst, err
	}
	native, err := br.enc(rv)
	if err != nil {
		return dst, fmt.Errorf("encode %s: %w", br.key, err)
	}
	if s.root.kind == kindUnion {
		native = map[string]any{br.key: native}
	}
	n := len(dst)
	out, err := s.codec.BinaryFromNative(AppendHeader(dst, id), native)
	if err != nil {
		return dst[:n], fmt.Errorf("encode %s: %w", br.key, err)
	}
	return out, nil
}

// errPanicked marks a decoder panic turned into an error: a poison record
// must reach the DLQ, not crash the consumer into a restart loop.
var errPanicked = errors.New("decoder panicked")

// Decode decodes a Confluent-framed value into a value (not a pointer) of
// the Go type registered for the record the writer wrote. Errors wrap
// ErrMalformed, ErrUnknownSchema or ErrIncompatible; any other error (the
// registry unreachable, ctx done) is worth retrying.
func (s *Serde) Decode(ctx context.Context, b []byte) (any, error) {
	id, payload, err := ParseHeader(b)
	if err != nil {
		return nil, err
	}
	p, err := s.plan(ctx, id)
	if err != nil {
		return nil, err
	}
	return p.decode(id, payload)
}

// DecodeNative decodes a Confluent-framed value as its writer wrote it:
// goavro's native form (a record is a map from its Avro field names), the
// topic's union unwrapped, with the record's full name. Tools show records
// with it as their schemas name them (onceflow events tail).
func (s *Serde) DecodeNative(ctx context.Context, b []byte) (name string, native any, err error) {
	id, payload, err := ParseHeader(b)
	if err != nil {
		return "", nil, err
	}
	p, err := s.plan(ctx, id)
	if err != nil {
		return "", nil, err
	}
	return p.native(id, payload)
}

// native decodes payload, written with writer schema id, into goavro's
// native form, and names the record it holds.
func (p *writerPlan) native(id int, payload []byte) (key string, native any, err error) {
	if p.err != nil {
		return "", nil, p.err
	}
	defer func() {
		if r := recover(); r != nil {
			native, err = nil, fmt.Errorf("%w: writer schema %d: %w: %v", ErrMalformed, id, errPanicked, r)
		}
	}()
	native, rest, err := p.codec.NativeFromBinary(payload)
	if err != nil {
		return "", nil, fmt.Errorf("%w: writer schema %d: %v", ErrMalformed, id, err)
	}
	if len(rest) != 0 {
		return "", nil, fmt.Errorf("%w: writer schema %d: %d trailing bytes after the datum", ErrMalformed, id, len(rest))
	}
	key = p.root
	if p.union {
		m, ok := native.(map[string]any)
		if !ok || len(m) != 1 {
			return "", nil, fmt.Errorf("%w: writer schema %d: decoded %T, want a union branch", ErrMalformed, id, native)
		}
		for k, x := range m {
			key, native = k, x
		}
	}
	return key, native, nil
}

func (p *writerPlan) decode(id int, payload []byte) (v any, err error) {
	key, native, err := p.native(id, payload)
	if err != nil {
		return nil, err
	}
	defer func() {
		if r := recover(); r != nil {
			v, err = nil, fmt.Errorf("%w: writer schema %d: %w: %v", ErrMalformed, id, errPanicked, r)
		}
	}()
	bd, ok := p.branches[key]
	if !ok {
		return nil, fmt.Errorf("%w: writer schema %d: no decoder for %s", ErrMalformed, id, key)
	}
	if bd.err != nil {
		return nil, fmt.Errorf("writer schema %d: %w", id, bd.err)
	}
	rv := reflect.New(bd.t).Elem()
	if err := bd.dec(native, rv); err != nil {
		return nil, fmt.Errorf("writer schema %d: %w", id, err)
	}
	return rv.Interface(), nil
}

// plan returns the decoding plan of writer schema id, fetching the schema
// once per id; concurrent first uses of an id wait for one fetch.
func (s *Serde) plan(ctx context.Context, id int) (*writerPlan, error) {
	if p, ok := s.plans.Load(id); ok {
		return p.(*writerPlan), nil
	}
	retried := false
	for {
		s.mu.Lock()
		if p, ok := s.plans.Load(id); ok {
			s.mu.Unlock()
			return p.(*writerPlan), nil
		}
		c, waiting := s.pending[id]
		if !waiting {
			c = &planCall{done: make(chan struct{})}
			s.pending[id] = c
		}
		s.mu.Unlock()

		if !waiting {
			c.plan, c.err = s.fetchPlan(ctx, id)
			s.mu.Lock()
			delete(s.pending, id)
			if c.err == nil {
				s.plans.Store(id, c.plan)
			}
			s.mu.Unlock()
			close(c.done)
			return c.plan, c.err
		}
		select {
		case <-c.done:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		// The fetch failed for its caller (its ctx, a registry error): try
		// once with ours.
		if c.err != nil && !retried && ctx.Err() == nil {
			retried = true
			continue
		}
		return c.plan, c.err
	}
}

// fetchPlan fetches writer schema id and builds its plan. Registry errors
// are returned (not cached); an unusable schema is a plan whose err is set
// (cached: ids are immutable).
func (s *Serde) fetchPlan(ctx context.Context, id int) (*writerPlan, error) {
	text, err := s.reg.SchemaByID(ctx, id)
	if err != nil {
		return nil, fmt.Errorf("writer schema %d of %s: %w", id, s.subject, err)
	}
	ps, err := parseSchema(text)
	if err != nil {
		return &writerPlan{err: fmt.Errorf("%w: writer schema %d: %v", ErrIncompatible, id, err)}, nil
	}
	codec, err := goavro.NewCodec(ps.codec)
	if err != nil {
		return &writerPlan{err: fmt.Errorf("%w: writer schema %d: %v", ErrIncompatible, id, err)}, nil
	}
	return s.newPlan(ps, codec), nil
}

// newPlan resolves each record the writer schema can hold to the reader's
// record of the same full name.
func (s *Serde) newPlan(w *parsedSchema, codec *goavro.Codec) *writerPlan {
	p := &writerPlan{codec: codec, branches: map[string]branchDecoder{}}
	wbs := []*schema{w.root}
	switch w.root.kind {
	case kindUnion:
		p.union = true
		wbs = w.root.branches
	case kindRecord:
		p.root = w.root.name
	default:
		p.err = fmt.Errorf("%w: writer schema is %s, not a record or a union of records", ErrIncompatible, w.root.describe())
		return p
	}
	for _, wb := range wbs {
		key := wb.branchName()
		rb := s.readerRecord(wb)
		if rb == nil {
			p.branches[key] = branchDecoder{err: fmt.Errorf("%w: unknown type %s: the reader schema of %s has no such record", ErrIncompatible, key, s.subject)}
			continue
		}
		t := s.b.types[rb.name]
		dec, err := s.b.decoder(wb, rb, t, rb.name)
		p.branches[key] = branchDecoder{t: t, dec: dec, err: err}
	}
	return p
}

func (s *Serde) readerRecord(wb *schema) *schema {
	if wb.kind != kindRecord {
		return nil
	}
	rbs := []*schema{s.root}
	if s.root.kind == kindUnion {
		rbs = s.root.branches
	}
	for _, rb := range rbs {
		if rb.name == wb.name {
			return rb
		}
	}
	return nil
}
