package docs

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestDocsLinks checks that every reference to a section of a page,
// PAGE.md#anchor in a page, a Go or SQL comment or a YAML file (the
// alerts' descriptions), names a heading that page has: a section renamed or moved leaves no reader at a dead link.
func TestDocsLinks(t *testing.T) {
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	ref := regexp.MustCompile(`([\w./-]*\w\.md)#([\w-]+)`)
	headings := map[string]map[string]bool{}
	checked := 0
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if name := d.Name(); path != root && (strings.HasPrefix(name, ".") || name == "bin" || name == "node_modules") {
				return filepath.SkipDir
			}
			return nil
		}
		switch filepath.Ext(path) {
		case ".go", ".md", ".sql", ".yml", ".yaml":
		default:
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		for i, line := range strings.Split(string(b), "\n") {
			for _, m := range ref.FindAllStringSubmatch(line, -1) {
				page := pageOf(root, filepath.Dir(path), m[1])
				if page == "" {
					continue // a page of another project (another repository's README.md)
				}
				if headings[page] == nil {
					headings[page] = anchors(t, page)
				}
				checked++
				if !headings[page][m[2]] {
					t.Errorf("%s:%d: %s#%s: no such heading in %s", rel, i+1, m[1], m[2], m[1])
				}
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if checked == 0 {
		t.Fatal("no PAGE.md#anchor reference found: the pattern no longer matches the tree")
	}
	t.Logf("checked %d references to %d pages", checked, len(headings))
}

// pageOf is the file a reference names, relative to the module's root
// (docs/jobs.md) or to the referring file's folder (../README.md), or ""
// when neither exists.
func pageOf(root, dir, name string) string {
	for _, p := range []string{filepath.Join(root, name), filepath.Join(dir, name)} {
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	return ""
}

// anchors are the anchors of a page's headings, as GitHub makes them:
// lower case, punctuation but hyphens and underscores dropped, spaces
// made hyphens.
func anchors(t *testing.T, page string) map[string]bool {
	t.Helper()
	b, err := os.ReadFile(page)
	if err != nil {
		t.Fatal(err)
	}
	punct := regexp.MustCompile(`[^\p{L}\p{N}_ -]`)
	out := map[string]bool{}
	inFence := false
	for _, line := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(line, "```") {
			inFence = !inFence
		}
		if inFence || !strings.HasPrefix(line, "#") {
			continue
		}
		title := strings.TrimSpace(strings.TrimLeft(line, "#"))
		out[strings.ReplaceAll(punct.ReplaceAllString(strings.ToLower(title), ""), " ", "-")] = true
	}
	return out
}
