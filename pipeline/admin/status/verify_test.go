package status_test

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/onceflow/onceflow/pipeline/admin"
	"github.com/onceflow/onceflow/pipeline/admin/status"
	"github.com/onceflow/onceflow/pipeline/pipelinetest"
	"github.com/onceflow/onceflow/pipeline/verify"
)

// The last recorded `onceflow verify` is on every admin server: its
// gauges on /metrics (read from verify_runs by the collector a process
// with a database registers), and its line on the page, drawn by the
// server and in /status.json; before any run, the page says none was
// recorded.
func TestLastVerification(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, _ := pipelinetest.Pool(t)
	reg := admin.NewRegistry()
	reg.MustRegister(verify.NewCollector(pool, time.Nanosecond))
	adm := admin.New("", reg, slog.New(slog.DiscardHandler))
	page, err := status.New(status.Config{Gatherer: reg, Pool: pool, Components: []string{"relay"}, Interval: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	page.Register(adm)
	srv := httptest.NewServer(adm.Handler())
	t.Cleanup(srv.Close)
	get := func(path string) string {
		t.Helper()
		resp, err := http.Get(srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return string(b)
	}
	statusJSON := func() status.Status {
		t.Helper()
		var st status.Status
		if err := json.Unmarshal([]byte(get("/status.json")), &st); err != nil {
			t.Fatal(err)
		}
		return st
	}
	if st := statusJSON(); st.Verify != nil {
		t.Errorf("before any run: %+v, want none", st.Verify)
	}
	if html := get("/status"); !strings.Contains(html, "no verification recorded") {
		t.Errorf("before any run the page does not say none was recorded:\n%s", html)
	}

	finished := time.Now()
	rep := &verify.Report{From: finished.Add(-time.Hour), To: finished, StartedAt: finished, Findings: []verify.Finding{
		{Stage: verify.StageProjector, Kind: verify.Lost, EventID: "event-id-not-shown"},
		{Stage: verify.StageEvents, Kind: verify.DuplicateRecord, EventID: "e2"},
		{Stage: verify.StageEvents, Kind: verify.DuplicateRecord, EventID: "e3"},
	}}
	if err := verify.Record(ctx, pool, rep); err != nil {
		t.Fatal(err)
	}
	st := statusJSON()
	if v := st.Verify; v == nil || v.OK || len(v.Findings) != 2 || v.LastRunTimestampSeconds < float64(finished.Unix()-60) {
		t.Fatalf("after a run that lost an event: %+v", st.Verify)
	}
	found := map[string]float64{}
	for _, f := range st.Verify.Findings {
		found[f.Stage+" "+f.Kind] = f.Count
	}
	if found["projector lost"] != 1 || found["events duplicate-record"] != 2 {
		t.Errorf("findings %+v", st.Verify.Findings)
	}
	metrics := get("/metrics")
	for _, want := range []string{`onceflow_verify_findings{kind="lost",stage="projector"} 1`, "onceflow_verify_last_run_ok 0", "onceflow_verify_last_run_timestamp_seconds "} {
		if !strings.Contains(metrics, want) {
			t.Errorf("/metrics has no %q", want)
		}
	}
	if html := get("/status"); !strings.Contains(html, "lost or doubled found") || !strings.Contains(html, "projector lost 1") || strings.Contains(html, "event-id-not-shown") {
		t.Errorf("the page's line after the run (with no id):\n%s", html)
	}
}
