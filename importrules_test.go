package onceflow_test

import (
	"bufio"
	"bytes"
	"os/exec"
	"strings"
	"testing"
)

const module = "github.com/onceflow/onceflow"

// The shape of the tree (DEVELOPERS.md#layout), from `go list`: the layers
// go one way, cmd/* -> cli (the command line) -> onceflow (this package,
// the domain API) -> pipeline/... (the library), so only the binaries
// import the command line; the library never imports the application
// (this package, cli, cmd/) or a domain (examples/...); the vocabulary
// (pipeline) imports only the standard library and onceflow's wire schemas
// (schemas, which imports nothing of onceflow); the adapters never import
// each other; the application imports no domain; a domain's own package
// (its types and deciders) imports the vocabulary and nothing else of
// onceflow. Test files are not
// checked: the library's tests use the reference domain as a fixture.
// `make lint` runs this test.
func TestImportRules(t *testing.T) {
	out, err := exec.Command("go", "list", "-f", `{{.ImportPath}} {{join .Imports " "}}`, module+"/...").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	adapters := []string{"pipeline/avro", "pipeline/kafka", "pipeline/postgres"}
	checked := 0
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		pkg := strings.TrimPrefix(strings.TrimPrefix(fields[0], module), "/")
		var own []string // the module's packages it imports, module-relative ("" is the root)
		for _, imp := range fields[1:] {
			if imp == module || strings.HasPrefix(imp, module+"/") {
				own = append(own, strings.TrimPrefix(strings.TrimPrefix(imp, module), "/"))
			} else if (pkg == "pipeline" || pkg == "schemas") && strings.Contains(strings.SplitN(imp, "/", 2)[0], ".") {
				t.Errorf("%s imports %s: the vocabulary and the wire schemas import only the standard library", pkg, imp)
			}
		}
		checked++
		for _, imp := range own {
			switch {
			case under(imp, "cli") && !under(pkg, "cmd"):
				t.Errorf("%s imports %s: only the binaries (cmd/) import the command line", name(pkg), imp)
			case under(pkg, "pipeline") && (imp == "" || under(imp, "cmd") || under(imp, "examples")):
				t.Errorf("%s imports %s: the library imports neither the application nor a domain", pkg, name(imp))
			case pkg == "schemas":
				t.Errorf("schemas imports %s: onceflow's wire schemas import nothing of onceflow", name(imp))
			case pkg == "pipeline" && imp != "schemas":
				t.Errorf("pipeline imports %s: the vocabulary imports only the standard library (and onceflow's wire schemas)", name(imp))
			case contains(adapters, pkg) && (contains(adapters, imp) || isRole(imp)):
				t.Errorf("%s imports %s: an adapter imports no other adapter and no role package", pkg, imp)
			case pkg == "" && under(imp, "examples"):
				t.Errorf("the application imports %s: it imports no domain", imp)
			case isDomain(pkg) && imp != "pipeline":
				t.Errorf("%s imports %s: a domain's types and deciders import only the vocabulary (package pipeline)", pkg, name(imp))
			}
		}
	}
	if checked < 20 {
		t.Fatalf("go list named %d packages; the check read nothing useful:\n%s", checked, out)
	}
}

// isDomain reports whether pkg is a domain's own package, examples/NAME.
func isDomain(pkg string) bool {
	return strings.HasPrefix(pkg, "examples/") && strings.Count(pkg, "/") == 1
}

func isRole(pkg string) bool {
	return contains([]string{"pipeline/ingest", "pipeline/relay", "pipeline/processor", "pipeline/projector"}, pkg)
}

func under(pkg, dir string) bool { return pkg == dir || strings.HasPrefix(pkg, dir+"/") }

func name(pkg string) string {
	if pkg == "" {
		return module
	}
	return pkg
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}
