package pipeline_test

import (
	"errors"
	"testing"

	"github.com/onceflow/onceflow/pipeline"
)

type counter struct{ N int }

type inc struct{ By int }

func (inc) MessageType() string { return "Inc" }

type reset struct{}

func (reset) MessageType() string { return "Reset" }

type incremented struct{ By int }

func (incremented) MessageType() string { return "Incremented" }

func counterAggregate() *pipeline.Aggregate[counter] {
	a := pipeline.NewAggregate(func(s counter, ev pipeline.Event) counter {
		if e, ok := ev.Payload.(incremented); ok {
			s.N += e.By
		}
		return s
	})
	pipeline.Handle(a, func(s counter, _ pipeline.Command, c inc) (pipeline.Decision, error) {
		return pipeline.Emit(incremented{By: c.By}), nil
	})
	return a
}

// Commands reach the decide function registered for their type, typed;
// other types are not handled, and registering a type twice panics.
func TestAggregateRoutesByCommandType(t *testing.T) {
	t.Parallel()
	a := counterAggregate()
	d, err := a.Decide(counter{}, pipeline.Command{Payload: inc{By: 2}})
	if err != nil || len(d.Events) != 1 || d.Events[0] != (incremented{By: 2}) {
		t.Fatalf("Decide(inc) = %+v, %v", d, err)
	}
	if s := a.Evolve(counter{N: 1}, pipeline.Event{Payload: incremented{By: 2}}); s.N != 3 {
		t.Fatalf("Evolve: got %d, want 3", s.N)
	}
	if !a.Handles("Inc") || a.Handles("Reset") {
		t.Fatalf("Handles: Inc %v, Reset %v; want true, false", a.Handles("Inc"), a.Handles("Reset"))
	}
	if _, err := a.Decide(counter{}, pipeline.Command{Payload: reset{}}); !errors.Is(err, pipeline.ErrUnhandledCommand) {
		t.Fatalf("Decide(reset): got %v, want ErrUnhandledCommand", err)
	}
	if got := a.CommandTypes(); len(got) != 1 || got[0] != "Inc" {
		t.Fatalf("CommandTypes: got %v", got)
	}
	defer func() {
		if recover() == nil {
			t.Fatal("registering Inc twice did not panic")
		}
	}()
	pipeline.Handle(a, func(counter, pipeline.Command, inc) (pipeline.Decision, error) { return pipeline.Decision{}, nil })
}
