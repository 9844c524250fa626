package inventory

import _ "embed"

// The inventory's Avro schemas: the commands topic of each aggregate type
// (a union with a record per command type it handles), the domain's one
// events topic (every event type of both, CommandRejected and
// CommandFailed among them) and each aggregate type's state, which its
// snapshots wrap. Evolve them compatibly (docs/schemas.md#evolving-schemas).
var (
	//go:embed item_commands.avsc
	ItemCommandsSchema string
	//go:embed order_commands.avsc
	OrderCommandsSchema string
	//go:embed events.avsc
	EventsSchema string
	//go:embed item.avsc
	ItemSchema string
	//go:embed order.avsc
	OrderSchema string
)
