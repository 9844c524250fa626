package cli_test

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"strings"
	"testing"
)

// Each command's -h is its own: titled with its name, exiting 0 (as
// flag.ErrHelp); a word that only begins commands ("webhooks") lists
// them, with -h, --help or alone, and exits 0; with a word that is not one
// of them it lists them too, and fails.
func TestEachCommandHasItsOwnHelp(t *testing.T) {
	none := func(string) string { return "" }
	groups := map[string]bool{}
	for _, name := range commandNames(t) {
		var out bytes.Buffer
		err := run(context.Background(), append(strings.Fields(name), "-h"), none, &out)
		if !errors.Is(err, flag.ErrHelp) {
			t.Errorf("%s -h: %v, want flag.ErrHelp", name, err)
		}
		if first, _, _ := strings.Cut(out.String(), "\n"); !strings.HasPrefix(first, "usage: onceflow "+name+" ") && first != "usage: onceflow "+name {
			t.Errorf("%s -h is titled %q", name, first)
		}
		words := strings.Fields(name)
		for n := 1; n < len(words); n++ {
			groups[strings.Join(words[:n], " ")] = true
		}
	}
	for _, name := range commandNames(t) {
		delete(groups, name) // a command of its own ("migrate"): its -h lists its commands
	}
	for group := range groups {
		for _, args := range [][]string{{}, {"-h"}, {"--help"}, {"help"}} {
			var out bytes.Buffer
			err := run(context.Background(), append(strings.Fields(group), args...), none, &out)
			if err != nil {
				t.Errorf("%s %v: %v, want the list of its commands and no error", group, args, err)
			}
			if !strings.HasPrefix(out.String(), "usage: onceflow "+group+" COMMAND") {
				t.Errorf("%s %v lists:\n%s", group, args, out.String())
			}
		}
		var out bytes.Buffer
		if err := run(context.Background(), append(strings.Fields(group), "bogus"), none, &out); err == nil || !strings.HasPrefix(out.String(), "usage: onceflow "+group+" COMMAND") {
			t.Errorf("%s bogus: %v\n%s", group, err, out.String())
		}
	}
	if len(groups) < 5 {
		t.Errorf("only %d groups of commands: %v", len(groups), groups)
	}
}
