package pipeline_test

import (
	"fmt"

	"github.com/onceflow/onceflow/pipeline"
)

// A room of ten seats: its state, the command that books seats and the
// event that says they were booked.
type room struct{ Booked int }

type book struct {
	Seats int `json:"seats"`
}

func (book) MessageType() string { return "Book" }

type booked struct {
	Seats int `json:"seats"`
}

func (booked) MessageType() string { return "Booked" }

// A decider is an evolve function (an event onto the state) and a decide
// function per command type, registered with Handle: given the state and
// a command, it emits events or rejects the command.
func ExampleHandle() {
	rooms := pipeline.NewAggregate(func(s room, ev pipeline.Event) room {
		if b, ok := ev.Payload.(booked); ok {
			s.Booked += b.Seats
		}
		return s
	})
	pipeline.Handle(rooms, func(s room, _ pipeline.Command, c book) (pipeline.Decision, error) {
		if s.Booked+c.Seats > 10 {
			return pipeline.Decision{}, pipeline.Reject("room_full", "%d seats left", 10-s.Booked)
		}
		return pipeline.Emit(booked{Seats: c.Seats}), nil
	})

	var s room
	for _, seats := range []int{6, 5} {
		d, err := rooms.Decide(s, pipeline.Command{Tenant: "acme", AggregateID: "room-1", Payload: book{Seats: seats}})
		if err != nil {
			fmt.Println("book", seats, "->", err)
			continue
		}
		for _, ev := range d.Events {
			fmt.Printf("book %d -> %s %+v\n", seats, ev.MessageType(), ev)
			s = rooms.Evolve(s, pipeline.Event{Payload: ev})
		}
	}
	fmt.Println("booked:", s.Booked, "handles:", rooms.CommandTypes())
	// Output:
	// book 6 -> Booked {Seats:6}
	// book 5 -> rejected: room_full: 4 seats left
	// booked: 6 handles: [Book]
}
