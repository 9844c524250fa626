// Command inventory runs the inventory example domain
// (examples/inventory): every component, `inventory dev` with the
// embedded broker, registry and Postgres, `inventory demo`, and the
// operator commands for its types. With INVENTORY_CARRIER_URL its worker
// books each confirmed order's shipment with that carrier
// (inventoryapp.CarrierJob).
package main

import (
	"os"

	"github.com/onceflow/onceflow/cli"
	"github.com/onceflow/onceflow/examples/inventory/inventoryapp"
)

func main() {
	cli.Main(inventoryapp.DomainWith(inventoryapp.Carrier{URL: os.Getenv("INVENTORY_CARRIER_URL")}))
}
