package pipeline_test

import (
	"testing"

	"github.com/onceflow/onceflow/pipeline"
)

func TestPrintable(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"502 Bad Gateway":               "502 Bad Gateway",
		"a\x1b[2Jb":                     "a[2Jb",
		"title\x1b]0;pwned\x07 end":     "title]0;pwned end",
		"line\r\nX-Injected: 1":         "line  X-Injected: 1",
		"tab\there":                     "tab here",
		"\u202eevil\u200b":              "evil",
		"bad \xff utf-8":                "bad ? utf-8",
		"\x00nul\x7f del \u0085 nel":    "nul del  nel",
		"unicode stays: é, 東京, emoji 🙂": "unicode stays: é, 東京, emoji 🙂",
	} {
		if got := pipeline.Printable(in); got != want {
			t.Errorf("Printable(%q) = %q, want %q", in, got, want)
		}
	}
}
