package otlp

import "testing"

// The signal's own URL wins and is taken as it is; the base URL gets
// /v1/traces after its path, as the OpenTelemetry specification reads
// OTEL_EXPORTER_OTLP_TRACES_ENDPOINT and OTEL_EXPORTER_OTLP_ENDPOINT.
func TestTracesURL(t *testing.T) {
	for _, tc := range []struct{ base, traces, want string }{
		{"", "", ""},
		{"http://127.0.0.1:4318", "", "http://127.0.0.1:4318/v1/traces"},
		{"http://127.0.0.1:4318/", "", "http://127.0.0.1:4318/v1/traces"},
		{"https://collector.example/otlp", "", "https://collector.example/otlp/v1/traces"},
		{"", "http://127.0.0.1:4318/custom", "http://127.0.0.1:4318/custom"},
		{"", "http://127.0.0.1:4318", "http://127.0.0.1:4318/"},
		{"http://127.0.0.1:4318", "https://tempo.example/v1/traces", "https://tempo.example/v1/traces"},
	} {
		if got := TracesURL(tc.base, tc.traces); got != tc.want {
			t.Errorf("TracesURL(%q, %q) = %q, want %q", tc.base, tc.traces, got, tc.want)
		}
	}
}
