// Package postgres is onceflow's adapter to PostgreSQL: connection pools,
// migrations (goose, under a session advisory lock), daily-partition
// maintenance, error classification, and Local, the private cluster that
// `onceflow dev`, `make test`, `make demo` and CI start from the installed
// PostgreSQL binaries when DATABASE_URL does not name a reachable server.
//
// Role packages run their own SQL (kept as named constants next to the code
// that runs it) on the *pgxpool.Pool this package opens; this package holds
// only what every role shares.
package postgres
