package onceflow_test

import (
	"encoding/json"
	"os/exec"
	"slices"
	"strings"
	"testing"
)

// What each binary and package links (DEVELOPERS.md#layout), from
// `go list -deps`:
//
//   - a binary of one component (cmd/ingest, relay, processor, projector,
//     worker, natsink: cli/component) links what that component runs, and
//     not the embedded default: no kfake, no pipeline/devbroker, no
//     package dev (cli.Main's binaries, cmd/onceflow and cmd/inventory,
//     run `dev` and link them);
//   - the library, the domain API and the domains link no gRPC: only the
//     OTLP exporter (pipeline/tracing/otlp, whose protobuf types bring
//     gRPC's packages) and what exports spans with it (the command line,
//     the binaries) do, and the test harnesses, whose receiver decodes
//     OTLP.
//
// `make lint` runs this test.
func TestLeanBinaries(t *testing.T) {
	out, err := exec.Command("go", "list", "-json=ImportPath,Deps", module+"/...").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	deps := map[string][]string{}
	for dec := json.NewDecoder(strings.NewReader(string(out))); dec.More(); {
		var p listed
		if err := dec.Decode(&p); err != nil {
			t.Fatal(err)
		}
		deps[rel(p.ImportPath)] = p.Deps
	}
	for _, c := range []string{"ingest", "relay", "processor", "projector", "worker", "natsink"} {
		d, ok := deps["cmd/"+c]
		if !ok {
			t.Fatalf("go list names no cmd/%s", c)
		}
		for _, dep := range d {
			if dep == kfake || dep == module+"/pipeline/devbroker" || dep == module+"/dev" {
				t.Errorf("cmd/%s links %s: a binary of one component links no embedded broker (only dev runs one)", c, dep)
			}
		}
		t.Logf("cmd/%s links %d packages", c, len(d))
	}
	for pkg, d := range deps {
		if exports(pkg, deps) || under(pkg, "test") {
			continue
		}
		if i := slices.IndexFunc(d, func(dep string) bool { return strings.HasPrefix(dep, "google.golang.org/grpc") }); i >= 0 {
			t.Errorf("%s links %s: only the OTLP exporter (pipeline/tracing/otlp) and what exports spans with it link gRPC", name(pkg), d[i])
		}
	}
}

// exports reports whether pkg is the OTLP exporter or links it.
func exports(pkg string, deps map[string][]string) bool {
	return pkg == "pipeline/tracing/otlp" || slices.Contains(deps[pkg], module+"/pipeline/tracing/otlp")
}
