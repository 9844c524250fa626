package onceflow_test

import (
	"github.com/onceflow/onceflow"
	"github.com/onceflow/onceflow/examples/ledger/accounts"
	"github.com/onceflow/onceflow/examples/ledger/ledgerapp"
	"github.com/onceflow/onceflow/pipeline/postgres"
)

// ledgerDomains is the ledger's deployment, cmd/onceflow's.
func ledgerDomains() []*onceflow.Domain { return []*onceflow.Domain{ledgerapp.Domain()} }

// ledgerWithGroup is the ledger domain with its processor in group.
func ledgerWithGroup(group string) *onceflow.Domain {
	d := ledgerapp.Domain()
	a := ledgerapp.AccountType()
	a.Group = group
	d.Aggregates = []onceflow.AggregateType{a}
	return d
}

// ledgerMigrations are the ledger's read model's: the accounts table.
var ledgerMigrations = postgres.Migrations{Name: ledgerapp.Name, FS: accounts.Migrations}
