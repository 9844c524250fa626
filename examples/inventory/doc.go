// Package inventory is onceflow's second example domain: stock items and
// the orders that reserve them, with a saga across the two aggregate
// types. It is built with onceflow's public API only, as a team's own
// domain is (docs/your-first-domain.md), and imports nothing of onceflow
// but the vocabulary (package pipeline); inventoryapp makes it an
// onceflow.Domain with its read models and HTTP routes.
//
// Two aggregate types, each with its own commands topic and processor:
//
//   - an item (Item) holds stock: AddStock adds to what is available,
//     ReserveStock moves a quantity from available to reserved, or is
//     rejected (insufficient_stock, unknown_item) when it cannot;
//   - an order (Order) asks for a quantity of one item: PlaceOrder, then
//     ConfirmOrder or RejectOrder, each exactly once.
//
// The saga is carried by the decisions themselves (pipeline.Effect): the
// decision that places an order sends ReserveStock to the item in the
// Kafka transaction that records OrderPlaced; the item's decision sends
// ConfirmOrder, or RejectOrder with the reason, back to the order in the
// transaction that records StockReserved or the rejection. Every follow-up
// command's id is derived from the command that caused it (ReserveCommandID,
// ConfirmCommandID, RejectCommandID), so deciding again after an aborted
// transaction sends the same commands and the targets' dedup absorbs a
// repeat. Hence at every committed point: an item's available plus its
// reserved is the stock added to it, neither is ever negative, and every
// placed order ends confirmed or rejected once.
//
// ReserveStock, ConfirmOrder and RejectOrder are the saga's internal
// commands: they have no HTTP route, and a producer writing straight to
// the commands topics is trusted with them as it is with the ledger's
// CreditTransfer.
package inventory
