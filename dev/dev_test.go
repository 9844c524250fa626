package dev

import (
	"testing"

	"github.com/onceflow/onceflow"
)

// The dev stack's admin server and schema registry listen on loopback
// unless told otherwise.
func TestDevListensOnLoopback(t *testing.T) {
	t.Parallel()
	var dc onceflow.DevConfig
	setDefaults(&dc)
	if dc.AdminAddr != "127.0.0.1:9090" || dc.RegistryAddr != "127.0.0.1:8081" || dc.BrokerAddr != "127.0.0.1:9092" {
		t.Errorf("dev defaults: admin %q registry %q broker %q, want each on 127.0.0.1", dc.AdminAddr, dc.RegistryAddr, dc.BrokerAddr)
	}
	dc = onceflow.DevConfig{RunConfig: onceflow.RunConfig{AdminAddr: ":9999"}}
	setDefaults(&dc)
	if dc.AdminAddr != ":9999" {
		t.Errorf("ADMIN_ADDR=:9999 became %q", dc.AdminAddr)
	}
}
