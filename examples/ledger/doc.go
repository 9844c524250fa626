// Package ledger is onceflow's reference domain
// (docs/architecture.md#the-reference-domain-the-ledger): accounts with
// deposits, withdrawals, closing, and transfers between accounts of one tenant.
// Every test, demo and benchmark runs it.
//
// It is written the way a user of onceflow writes a domain: command and
// event types bound to the Avro schemas beside them (commands.avsc,
// events.avsc, account.avsc) and a pure Decider over the Account state.
// It imports only the vocabulary (package pipeline); ledgerapp makes it an
// onceflow.Domain with its read model and HTTP routes.
//
// Transfers cross aggregates. RequestTransfer on the source debits it and,
// in the same Kafka transaction, sends CreditTransfer to the target with a
// command id derived from the transfer id and the request's command id. A
// target that cannot accept rejects the credit and sends RefundTransfer
// back, which the source always accepts. Money is conserved at every
// committed point: the sum of balances plus the amounts of credits and
// refunds in flight is the sum of deposits minus withdrawals.
package ledger
