package onceflow_test

import (
	"fmt"

	"github.com/onceflow/onceflow"
	"github.com/onceflow/onceflow/pipeline"
)

// A room of ten seats: its state, a command and an event, with their Avro
// schemas (docs/your-first-domain.md builds the whole domain).
type room struct{ Booked int }

type book struct {
	Seats int `json:"seats"`
}

func (book) MessageType() string { return "Book" }

type booked struct {
	Seats int `json:"seats"`
}

func (booked) MessageType() string { return "Booked" }

const (
	commandsSchema = `[{"type":"record","name":"Book","namespace":"rooms","fields":[{"name":"seats","type":"int"}]}]`
	eventsSchema   = `[{"type":"record","name":"Booked","namespace":"rooms","fields":[{"name":"seats","type":"int"}]}]`
	stateSchema    = `{"type":"record","name":"Room","namespace":"rooms","fields":[{"name":"Booked","type":"int"}]}`
)

// A domain is its aggregate types (each a decider with the schemas of its
// commands and state), the schema of its events, and what a deployment
// adds: read models, routes, queries. Config.Deployment resolves the
// names every component and operator command agrees on.
func ExampleDomain() {
	decider := pipeline.NewAggregate(func(s room, ev pipeline.Event) room {
		if b, ok := ev.Payload.(booked); ok {
			s.Booked += b.Seats
		}
		return s
	})
	pipeline.Handle(decider, func(s room, _ pipeline.Command, c book) (pipeline.Decision, error) {
		if s.Booked+c.Seats > 10 {
			return pipeline.Decision{}, pipeline.Reject("room_full", "%d seats left", 10-s.Booked)
		}
		return pipeline.Emit(booked{Seats: c.Seats}), nil
	})
	rooms := &onceflow.Domain{
		Name:   "rooms",
		Events: onceflow.Schema{Avro: eventsSchema, Types: []pipeline.Message{booked{}}},
		Aggregates: []onceflow.AggregateType{onceflow.Aggregate[room]{
			Name:     "room",
			Decider:  decider,
			Commands: onceflow.Schema{Avro: commandsSchema, Types: []pipeline.Message{book{}}},
			State:    stateSchema,
		}},
	}

	dep, err := onceflow.Config{Domains: []*onceflow.Domain{rooms}}.Deployment()
	if err != nil {
		fmt.Println(err)
		return
	}
	d := dep.Domains[0]
	fmt.Println("events:", d.EventsTopic(), "projector:", d.ProjectorConsumer())
	for _, a := range dep.Aggregates() {
		fmt.Println("commands:", a.Topics.Commands(), "state:", a.Topics.State(), "handled:", dep.CommandTypes())
	}
	// Output:
	// events: rooms.events projector: onceflow-projector-rooms
	// commands: rooms.commands state: rooms.state handled: Book
}
