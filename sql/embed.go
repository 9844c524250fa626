// Package sql holds onceflow's Postgres migrations, embedded so every binary
// carries the schema it was built for. pipeline/postgres applies them with
// goose under a session advisory lock; files are zero-padded, run in order,
// and each has an Up and a Down section (tested up -> down -> up).
//
// The first migrations were numbered by part, so that work on different
// parts did not collide: 00001-00009 foundation, 00010-00019 ingest,
// 00020-00029 relay and jobs, 00030-00036 projector, 00037-00039 jobs (River's schema, the fence, webhooks). A new migration takes
// the next number above the highest, whatever its part: goose refuses to
// apply one numbered below what a database already has (a database at 30
// would not start with a new 00023). Two ranges were handed out at once to
// work done side by side: 00037-00039 (jobs and outbound webhooks) and
// 00040-00044 (inbound webhooks, reconciliation). A database that applied
// 00040 before 00037 existed must be migrated by a build that has both
// from a database below 00037, or from scratch; fresh databases (every
// test) take both ranges in order.
package sql

import "embed"

// Migrations are the goose migration files.
//
//go:embed *.sql
var Migrations embed.FS
