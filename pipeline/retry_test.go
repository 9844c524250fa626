package pipeline_test

import (
	"net/http"
	"testing"
	"time"

	"github.com/onceflow/onceflow/pipeline"
)

func TestParseRetryAfter(t *testing.T) {
	now := time.Date(2026, 12, 2, 1, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		in   string
		want time.Duration
		ok   bool
	}{
		{"", 0, false},
		{"0", 0, true},
		{"120", 2 * time.Minute, true},
		{"-1", 0, false},
		{"soon", 0, false},
		{now.Add(90 * time.Second).Format(http.TimeFormat), 90 * time.Second, true},
		{now.Add(-time.Hour).Format(http.TimeFormat), 0, true},
	} {
		got, ok := pipeline.ParseRetryAfter(tc.in, now)
		if got != tc.want || ok != tc.ok {
			t.Errorf("ParseRetryAfter(%q): got %s %v, want %s %v", tc.in, got, ok, tc.want, tc.ok)
		}
	}
}

func TestBackoffIsFullJitterUnderTheCeiling(t *testing.T) {
	for retry, ceiling := range map[int]time.Duration{1: 100 * time.Millisecond, 3: 400 * time.Millisecond, 40: time.Second} {
		var top time.Duration
		for range 2000 {
			d := pipeline.Backoff(100*time.Millisecond, time.Second, retry)
			if d < 0 || d > ceiling {
				t.Fatalf("retry %d: got %s, want 0..%s", retry, d, ceiling)
			}
			top = max(top, d)
		}
		if top < ceiling*8/10 {
			t.Errorf("retry %d: largest of 2000 waits %s, want near %s (full jitter spans 0..ceiling)", retry, top, ceiling)
		}
	}
}
