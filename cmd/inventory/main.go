// Command inventory runs the inventory example domain
// (examples/inventory): every component, `inventory dev` with the
// embedded broker, registry and Postgres, `inventory demo`, and the
// operator commands for its types.
package main

import (
	"github.com/onceflow/onceflow/cli"
	"github.com/onceflow/onceflow/examples/inventory/inventoryapp"
)

func main() { cli.Main(inventoryapp.Domain()) }
