package onceflow_test

import (
	"encoding/json"
	"os/exec"
	"slices"
	"strings"
	"testing"
)

const module = "github.com/onceflow/onceflow"

// listed is what `go list -json` says of one package.
type listed struct {
	ImportPath   string
	Imports      []string
	Deps         []string
	TestImports  []string
	XTestImports []string
}

// The shape of the tree (DEVELOPERS.md#layout), from `go list`:
//
//   - the layers go one way, cmd/* -> cli, cli/component (the command line)
//     -> dev (the embedded default, cli's only) -> onceflow
//     (this package, the domain API) -> pipeline/... (the library), so only
//     the binaries import the command line;
//   - the library never imports the application (this package, cli, cmd/)
//     or a domain (examples/...); the vocabulary (pipeline) imports only the
//     standard library and onceflow's wire schemas (schemas, which imports
//     nothing of onceflow); the adapters never import each other;
//   - the application imports no domain; a domain's own package (its types
//     and deciders) imports the vocabulary and nothing else of onceflow; the
//     examples use the public API only (this package, the vocabulary, the
//     API client);
//   - production code never imports a test helper (a package named *test,
//     such as statustest, which brings a browser driver), nor links the
//     browser driver;
//   - only the embedded default (package dev, which cli.Main runs) and tests
//     import the embedded broker (pipeline/devbroker, kfake), and only
//     the command line the OTLP exporter (TestLeanBinaries says what the
//     binaries link);
//   - the library's tests and test helpers do not need the application to
//     compile: its tests may use a domain's types and read model as
//     fixtures (examples/ledger, examples/ledger/accounts), nothing that
//     imports this package; its test helpers (pipelinetest, ingesttest)
//     import no domain, as the rest of the library.
//
// `make lint` runs this test.
func TestImportRules(t *testing.T) {
	out, err := exec.Command("go", "list", "-json=ImportPath,Imports,Deps,TestImports,XTestImports", module+"/...").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	var pkgs []listed
	for dec := json.NewDecoder(strings.NewReader(string(out))); dec.More(); {
		var p listed
		if err := dec.Decode(&p); err != nil {
			t.Fatal(err)
		}
		pkgs = append(pkgs, p)
	}
	if len(pkgs) < 20 {
		t.Fatalf("go list named %d packages; the check read nothing useful:\n%s", len(pkgs), out)
	}
	needsApp := map[string]bool{} // module-relative packages that import this one, directly or not
	for _, p := range pkgs {
		if slices.Contains(p.Deps, module) {
			needsApp[rel(p.ImportPath)] = true
		}
	}
	for _, p := range pkgs {
		pkg := rel(p.ImportPath)
		own, other := split(p.Imports)
		for _, imp := range other {
			if (pkg == "pipeline" || pkg == "schemas") && strings.Contains(strings.SplitN(imp, "/", 2)[0], ".") {
				t.Errorf("%s imports %s: the vocabulary and the wire schemas import only the standard library", pkg, imp)
			}
			if imp == kfake && !mayRunBroker(pkg) {
				t.Errorf("%s imports %s: only the embedded default (package dev) and tests import the embedded broker", name(pkg), imp)
			}
		}
		if !isHelper(pkg) && !under(pkg, "test") {
			for _, dep := range p.Deps {
				if strings.HasPrefix(dep, "github.com/chromedp/") {
					t.Errorf("%s links %s: production code never links the browser driver of the tests", name(pkg), dep)
					break
				}
			}
		}
		for _, imp := range own {
			if msg := rule(pkg, imp); msg != "" {
				t.Errorf("%s imports %s: %s", name(pkg), name(imp), msg)
			}
		}
		// The library's tests and helpers.
		if !under(pkg, "pipeline") {
			continue
		}
		tests, _ := split(append(append([]string(nil), p.TestImports...), p.XTestImports...))
		if isHelper(pkg) {
			tests = append(tests, own...)
		}
		for _, imp := range tests {
			if imp == "" || needsApp[imp] {
				t.Errorf("%s's tests import %s: the library's tests do not need the application to compile", name(pkg), name(imp))
			}
		}
	}
}

// rule says what is wrong with pkg importing imp, the module's packages
// (module-relative, "" the root), or "".
func rule(pkg, imp string) string {
	adapters := []string{"pipeline/avro", "pipeline/kafka", "pipeline/postgres"}
	switch {
	case under(imp, "cli") && !under(pkg, "cmd") && !under(pkg, "cli"):
		return "only the binaries (cmd/) import the command line"
	case imp == "pipeline/tracing/otlp" && !under(pkg, "cli") && !under(pkg, "test"):
		return "only the command line builds the OTLP exporter (it brings gRPC's packages: TestLeanBinaries)"
	case imp == "dev" && pkg != "cli" && !isHelper(pkg) && !under(pkg, "test"):
		return "only cli.Main and tests run the embedded default (a component's binary links no broker: TestLeanBinaries)"
	case isHelper(imp) && !isHelper(pkg) && !under(pkg, "test"):
		return "production code never imports a test helper"
	case imp == "pipeline/devbroker" && !mayRunBroker(pkg):
		return "only the embedded default (package dev) and tests import the embedded broker"
	case under(pkg, "pipeline") && (imp == "" || under(imp, "cmd") || under(imp, "cli")):
		return "the library never imports the application"
	case under(pkg, "pipeline") && under(imp, "examples"):
		return "the library imports no domain (its test helpers neither: a fixture of a domain stays with the tests that use it)"
	case pkg == "schemas":
		return "onceflow's wire schemas import nothing of onceflow"
	case pkg == "pipeline" && imp != "schemas":
		return "the vocabulary imports only the standard library (and onceflow's wire schemas)"
	case slices.Contains(adapters, pkg) && (slices.Contains(adapters, imp) || isRole(imp)):
		return "an adapter imports no other adapter and no role package"
	case pkg == "" && under(imp, "examples"):
		return "the application imports no domain"
	case isDomain(pkg) && imp != "pipeline":
		return "a domain's types and deciders import only the vocabulary (package pipeline)"
	case under(pkg, "examples") && !under(imp, "examples") && imp != "" && imp != "pipeline" && imp != "pipeline/apiclient":
		return "the examples use the public API only (package onceflow, the vocabulary, the API client)"
	}
	return ""
}

const kfake = "github.com/twmb/franz-go/pkg/kfake"

// mayRunBroker reports whether pkg may import the embedded broker: the
// embedded default (package dev, onceflow dev), the broker's own package,
// test helpers and the test harnesses.
func mayRunBroker(pkg string) bool {
	return pkg == "dev" || pkg == "pipeline/devbroker" || isHelper(pkg) || under(pkg, "test")
}

// split separates imports into the module's packages (module-relative)
// and the others.
func split(imports []string) (own, other []string) {
	for _, imp := range imports {
		if imp == module || strings.HasPrefix(imp, module+"/") {
			own = append(own, rel(imp))
		} else {
			other = append(other, imp)
		}
	}
	return own, other
}

func rel(path string) string { return strings.TrimPrefix(strings.TrimPrefix(path, module), "/") }

// isHelper reports whether pkg is a test helper (pipelinetest, statustest).
func isHelper(pkg string) bool {
	return strings.HasSuffix(pkg[strings.LastIndex(pkg, "/")+1:], "test") && !under(pkg, "test")
}

// isDomain reports whether pkg is a domain's own package, examples/NAME.
func isDomain(pkg string) bool {
	return strings.HasPrefix(pkg, "examples/") && strings.Count(pkg, "/") == 1
}

func isRole(pkg string) bool {
	return slices.Contains([]string{"pipeline/ingest", "pipeline/relay", "pipeline/processor", "pipeline/projector", "pipeline/natsink"}, pkg)
}

func under(pkg, dir string) bool { return pkg == dir || strings.HasPrefix(pkg, dir+"/") }

func name(pkg string) string {
	if pkg == "" {
		return module
	}
	return pkg
}
