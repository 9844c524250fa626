package pipeline

// Decider is one aggregate type's business logic, as two pure functions.
// Decide turns a command and the aggregate's current state into a Decision,
// or a *Rejection; Evolve folds one event into the state.
//
// When Decide returns a *Rejection (see Reject), the runtime emits a
// CommandRejected event instead of the decision's events; the decision's
// Commands are still sent (a transfer that its target cannot accept sends a
// refund back to its source).
//
// Both must be deterministic: no clock (use cmd.Time), no randomness, no
// I/O. The processor decides again after aborted or indeterminate
// transactions, and relies on getting the same events (hence the same event
// ids) and the same follow-up commands every time.
//
// S is the aggregate state; its zero value is the state of an aggregate
// that has seen no event. Evolve must return a new state rather than mutate
// the one it is given: the runtime keeps the pre-batch state to roll back to
// when a transaction aborts.
type Decider[S any] interface {
	Decide(state S, cmd Command) (Decision, error)
	Evolve(state S, event Event) S
}

// Decision is what handling one command produces: events for the command's
// own aggregate, in order, and commands for other aggregates (a transfer's
// credit to its target). All of it is produced in the Kafka transaction that
// commits the command's offset, or none of it is.
type Decision struct {
	Events   []Message
	Commands []Effect
}

// Emit is a Decision of events only.
func Emit(events ...Message) Decision { return Decision{Events: events} }

// Effect is a command a decision sends to another aggregate. Its id must be
// derived (NameID) from the deciding command, so deciding again sends the
// same command and the target's dedup absorbs a repeat.
type Effect struct {
	AggregateID string
	CommandID   ID
	Payload     Message
}

// Sent names the commands the decision sends, as every event of the
// decision carries them (Event.Derived, the derived-command headers): a
// reader of any one of its events knows what the command led to
// (command_status follows a transfer to its credit and refund).
func (d Decision) Sent() []CommandRef {
	var refs []CommandRef
	for _, ef := range d.Commands {
		if ef.Payload != nil {
			refs = append(refs, CommandRef{ID: ef.CommandID, AggregateID: ef.AggregateID, Type: ef.Payload.MessageType()})
		}
	}
	return refs
}
