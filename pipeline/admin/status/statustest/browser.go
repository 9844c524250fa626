// Package statustest drives the status page in a headless Chromium, for
// the tests that check what its JavaScript drew (DEVELOPERS.md#tests).
package statustest

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
)

// Chromium returns the browser to drive: $ONCEFLOW_CHROMIUM, else the
// first of chromium, chromium-browser, google-chrome on the PATH; "" if
// none.
func Chromium() string {
	if p := os.Getenv("ONCEFLOW_CHROMIUM"); p != "" {
		return p
	}
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	return ""
}

// Browser starts a headless Chromium for the test and returns a tab in it,
// both closed when the test ends; without a Chromium it skips the test.
func Browser(t testing.TB) context.Context {
	t.Helper()
	path := Chromium()
	if path == "" {
		t.Skip("no Chromium to drive the status page (Debian: apt-get install chromium; .ci/run installs it; or set ONCEFLOW_CHROMIUM)")
	}
	opts := []chromedp.ExecAllocatorOption{chromedp.ExecPath(path), chromedp.WindowSize(1280, 2000), chromedp.UserDataDir(t.TempDir())}
	if os.Geteuid() == 0 {
		opts = append(opts, chromedp.NoSandbox) // Chromium refuses to run its sandbox as root
	}
	ctx, cancel := chromedp.NewContext(context.Background(), chromedp.WithAllocatorOptions(opts...))
	t.Cleanup(cancel)
	if err := chromedp.Do(ctx, chromedp.Navigate("about:blank")); err != nil {
		t.Fatalf("start %s: %v", path, err)
	}
	return ctx
}

// Open loads url and waits until the page has drawn /status.json once.
func Open(t testing.TB, tab context.Context, url string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(tab, 30*time.Second)
	defer cancel()
	if err := chromedp.Do(ctx, chromedp.Navigate(url), chromedp.WaitReady(chromedp.CSS("body[data-polls]"))); err != nil {
		t.Fatalf("open %s: %v", url, err)
	}
}

// Texts returns the text of the first element each CSS selector finds,
// read in one evaluation so they belong to one drawing of the page; a
// selector that finds nothing has no entry.
func Texts(tab context.Context, selectors map[string]string) (map[string]string, error) {
	var js strings.Builder
	js.WriteString("(() => { const q = (s) => { const e = document.querySelector(s); return e ? e.textContent : undefined; }; return {")
	for name, sel := range selectors {
		fmt.Fprintf(&js, "%s: q(%s),", strconv.Quote(name), strconv.Quote(sel))
	}
	js.WriteString("}; })()")
	ctx, cancel := context.WithTimeout(tab, 10*time.Second)
	defer cancel()
	return chromedp.Run(ctx, chromedp.Evaluate[map[string]string](js.String()))
}

// Number reads a figure as the page prints it ("1,234", "12.5/s", "3 ms"
// become 1234, 12.5 and 3).
func Number(text string) (float64, error) {
	f := strings.Fields(strings.ReplaceAll(strings.TrimSuffix(strings.TrimSpace(text), "/s"), ",", ""))
	if len(f) == 0 {
		return 0, fmt.Errorf("no number in %q", text)
	}
	v, err := strconv.ParseFloat(f[0], 64)
	if err != nil {
		return 0, fmt.Errorf("no number in %q", text)
	}
	return v, nil
}

// Do runs actions in the tab within a timeout.
func Do(tab context.Context, actions ...chromedp.Action[chromedp.Void]) error {
	ctx, cancel := context.WithTimeout(tab, 20*time.Second)
	defer cancel()
	return chromedp.Do(ctx, actions...)
}
