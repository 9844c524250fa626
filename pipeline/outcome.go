package pipeline

// The outcome of a command with every command it led to
// (docs/ingest.md#outcome): a decision may send commands to other
// aggregates (Decision.Commands), whose decisions may send more, and a
// client that started a transfer or placed an order wants to know how the
// whole ended, not only that its own command was accepted. A command's
// status (pending, accepted, rejected, failed) stays its own decision's.
const (
	// OutcomePending: the command, or a command it led to, has no outcome
	// yet.
	OutcomePending = "pending"
	// OutcomeCompleted: the command and every command it led to were
	// accepted.
	OutcomeCompleted = "completed"
	// OutcomeRejected: the command itself was rejected (its reason).
	OutcomeRejected = "rejected"
	// OutcomeFailed: the command itself failed (the DLQ, outbox_dead), or
	// a command it led to was refused (rejected or failed) and nothing it
	// sent back was applied: the reason is the first refusal's.
	OutcomeFailed = "failed"
	// OutcomeCompensated: a command it led to was rejected, and every
	// command that rejection sent (the refund of a credit its target
	// refused, an order's rejection) was accepted: the reason is the
	// first refusal's.
	OutcomeCompensated = "compensated"
)

// CommandState is a command's own status, as command_status holds it,
// with the command that sent it (none for the command a client sent).
type CommandState struct {
	CommandID, AggregateID    string
	CauseID, CauseAggregateID string
	CommandType, Status       string
	Reason, Detail            string
}

// Outcome is the outcome of a command with the commands it led to.
type Outcome struct {
	Status         string
	Reason, Detail string
	// CommandID and AggregateID name the command whose refusal decided a
	// rejected, failed or compensated outcome: the root itself, or the
	// first command it led to that was refused.
	CommandID, AggregateID, CommandType string
}

// OutcomeOf is the outcome of root with derived, every command it led to,
// in the order they were sent (a cause before what it sent; the first
// refusal in that order names the outcome's reason).
func OutcomeOf(root CommandState, derived []CommandState) Outcome {
	if root.Status == "pending" {
		return Outcome{Status: OutcomePending}
	}
	for _, d := range derived {
		if d.Status == "pending" {
			return Outcome{Status: OutcomePending}
		}
	}
	refusal := func(status string, c CommandState) Outcome {
		return Outcome{Status: status, Reason: c.Reason, Detail: c.Detail, CommandID: c.CommandID, AggregateID: c.AggregateID, CommandType: c.CommandType}
	}
	switch root.Status {
	case "rejected":
		return refusal(OutcomeRejected, root)
	case "failed":
		return refusal(OutcomeFailed, root)
	}
	var first *CommandState
	compensated := true
	for i, d := range derived {
		if d.Status == "accepted" {
			continue
		}
		if first == nil {
			first = &derived[i]
		}
		// A refusal is compensated when it is a rejection that sent
		// commands back and all of them were accepted.
		sent, accepted := 0, 0
		for _, c := range derived {
			if c.CauseID == d.CommandID && c.CauseAggregateID == d.AggregateID {
				sent++
				if c.Status == "accepted" {
					accepted++
				}
			}
		}
		if d.Status != "rejected" || sent == 0 || accepted != sent {
			compensated = false
		}
	}
	switch {
	case first == nil:
		return Outcome{Status: OutcomeCompleted}
	case compensated:
		return refusal(OutcomeCompensated, *first)
	}
	return refusal(OutcomeFailed, *first)
}
