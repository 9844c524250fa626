package command

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// declared is what the package's source declares at its top level: each
// setting (by its flag and variable) and each section (by its title), as
// written, whether or not any command uses it.
func declared(t *testing.T) (settings [][2]string, sections []string) {
	t.Helper()
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range f.Decls {
			gd, ok := d.(*ast.GenDecl)
			if !ok || gd.Tok != token.VAR {
				continue
			}
			for _, spec := range gd.Specs {
				for _, v := range spec.(*ast.ValueSpec).Values {
					u, ok := v.(*ast.UnaryExpr)
					if !ok || u.Op != token.AND {
						continue
					}
					lit, ok := u.X.(*ast.CompositeLit)
					if !ok {
						continue
					}
					typ, _ := lit.Type.(*ast.Ident)
					if typ == nil || (typ.Name != "setting" && typ.Name != "section") {
						continue
					}
					fields := map[string]string{}
					for _, e := range lit.Elts {
						kv, ok := e.(*ast.KeyValueExpr)
						if !ok {
							t.Fatalf("%s: a %s literal without field names", fset.Position(lit.Pos()), typ.Name)
						}
						key := kv.Key.(*ast.Ident).Name
						if key != "flag" && key != "env" && key != "title" {
							continue
						}
						b, ok := kv.Value.(*ast.BasicLit)
						if !ok || b.Kind != token.STRING {
							t.Fatalf("%s: the %s of a %s is not a string literal this test can read", fset.Position(kv.Pos()), key, typ.Name)
						}
						fields[key], _ = strconv.Unquote(b.Value)
					}
					if typ.Name == "setting" {
						settings = append(settings, [2]string{fields["flag"], fields["env"]})
					} else {
						sections = append(sections, fields["title"])
					}
				}
			}
		}
	}
	return settings, sections
}

// Every setting and section the source declares is reachable: some
// command reads the setting and lists it in its -h, and every section is
// in sectionOrder and has a setting some command reads. The tracing
// section once was declared, and listed for every component, but was not
// in sectionOrder, so use() left OTEL_EXPORTER_OTLP_ENDPOINT out of every
// command and no process exported a span.
func TestEveryDeclaredSettingIsReachable(t *testing.T) {
	settings, sections := declared(t)
	if len(settings) < 50 || len(sections) < 10 {
		t.Fatalf("found %d settings and %d sections in the source; the parse missed them", len(settings), len(sections))
	}
	read := map[[2]string]bool{}
	usedSections := map[string]bool{}
	for _, c := range commands {
		for _, s := range c.settings {
			read[[2]string{s.flag, s.env}] = true
			usedSections[s.section.title] = true
		}
	}
	for _, s := range settings {
		if !read[s] {
			t.Errorf("setting -%s (%s) is declared, and no command reads it", s[0], s[1])
		}
	}
	ordered := map[string]bool{}
	for _, sec := range sectionOrder {
		ordered[sec.title] = true
	}
	for _, title := range sections {
		if !ordered[title] {
			t.Errorf("section %q is declared, and sectionOrder lacks it: use() would panic on its settings", title)
		}
		if !usedSections[title] {
			t.Errorf("section %q is declared, and no command reads a setting of it", title)
		}
	}
}

// Every command that runs components (each component, as a command of
// Main and as ComponentMain's binary, and dev) lists the tracing settings
// in its -h under their own heading.
func TestComponentsListTracing(t *testing.T) {
	none := func(string) string { return "" }
	check := func(what string, run func(args []string, out *bytes.Buffer) error) {
		t.Helper()
		var out bytes.Buffer
		if err := run([]string{"-h"}, &out); !errors.Is(err, flag.ErrHelp) {
			t.Fatalf("%s -h: %v", what, err)
		}
		if !strings.Contains(out.String(), "\nTracing (OpenTelemetry):\n  -otlp-endpoint url\n") {
			t.Errorf("%s -h has no Tracing (OpenTelemetry) section with -otlp-endpoint:\n%s", what, out.String())
		}
		// The flag is taken, not refused as undefined.
		out.Reset()
		if err := run([]string{"-otlp-endpoint", "http://127.0.0.1:4318", "-h"}, &out); !errors.Is(err, flag.ErrHelp) {
			t.Errorf("%s -otlp-endpoint URL -h: %v", what, err)
		}
	}
	names := []string{"dev"}
	for name := range components {
		names = append(names, name)
	}
	for _, name := range names {
		check("onceflow "+name, func(args []string, out *bytes.Buffer) error {
			return Run(context.Background(), nil, append([]string{name}, args...), none, out)
		})
	}
	for name, c := range components {
		check("the "+name+" binary", func(args []string, out *bytes.Buffer) error {
			return componentCommand(name, c).run(context.Background(), nil, args, none, out)
		})
	}
}
