package pipeline

import (
	"errors"
	"fmt"
	"sort"
)

// ErrUnhandledCommand is returned by Aggregate.Decide for a command type no
// decide function is registered for. The processor checks Handles before
// deciding and sends such a command to the DLQ (reason
// unknown-command-type) instead.
var ErrUnhandledCommand = errors.New("no decide function registered for command type")

// Aggregate is one aggregate type assembled as
// docs/architecture.md#identity-at-each-boundary describes it: a pure decide
// function per command type it accepts, and one pure evolve function that folds
// any of its events into the state. It implements Decider, so the processor
// runs it like any other; the processor also asks Handles, so a command of a
// type nobody registered is poison (it goes to the DLQ) rather than a domain
// rejection.
//
// Register the decide functions with Handle before the processor starts;
// an Aggregate is read-only afterwards and safe for concurrent use.
type Aggregate[S any] struct {
	evolve func(S, Event) S
	decide map[string]func(S, Command) (Decision, error)
}

// NewAggregate returns an aggregate type with evolve and no command types
// yet.
func NewAggregate[S any](evolve func(state S, ev Event) S) *Aggregate[S] {
	if evolve == nil {
		panic("pipeline: NewAggregate with a nil evolve")
	}
	return &Aggregate[S]{evolve: evolve, decide: map[string]func(S, Command) (Decision, error){}}
}

// Handle registers decide for the commands whose payload is a C; the
// command type is C's MessageType. decide gets the payload already typed.
// Registering a type twice is a programming error and panics, so it is
// found when the binary starts.
func Handle[S any, C Message](a *Aggregate[S], decide func(state S, cmd Command, payload C) (Decision, error)) {
	var zero C
	name := zero.MessageType()
	if decide == nil {
		panic(fmt.Sprintf("pipeline: Handle(%s) with a nil decide", name))
	}
	if _, dup := a.decide[name]; dup {
		panic(fmt.Sprintf("pipeline: command type %s registered twice", name))
	}
	a.decide[name] = func(s S, cmd Command) (Decision, error) {
		c, ok := cmd.Payload.(C)
		if !ok { // a payload whose MessageType lies about its Go type
			return Decision{}, fmt.Errorf("command type %s carries a %T, want %T", name, cmd.Payload, zero)
		}
		return decide(s, cmd, c)
	}
}

// Decide implements Decider: it runs the decide function registered for
// the command's type, or returns an error wrapping ErrUnhandledCommand.
func (a *Aggregate[S]) Decide(state S, cmd Command) (Decision, error) {
	if cmd.Payload == nil {
		return Decision{}, fmt.Errorf("%w: command has no payload", ErrUnhandledCommand)
	}
	d, ok := a.decide[cmd.Type()]
	if !ok {
		return Decision{}, fmt.Errorf("%w %s", ErrUnhandledCommand, cmd.Type())
	}
	return d(state, cmd)
}

// Evolve implements Decider.
func (a *Aggregate[S]) Evolve(state S, ev Event) S { return a.evolve(state, ev) }

// Handles reports whether a decide function is registered for commandType.
func (a *Aggregate[S]) Handles(commandType string) bool {
	_, ok := a.decide[commandType]
	return ok
}

// CommandTypes returns the registered command types, sorted.
func (a *Aggregate[S]) CommandTypes() []string {
	out := make([]string, 0, len(a.decide))
	for t := range a.decide {
		out = append(out, t)
	}
	sort.Strings(out)
	return out
}
