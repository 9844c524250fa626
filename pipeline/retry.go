package pipeline

import (
	"math/rand/v2"
	"net/http"
	"strconv"
	"time"
)

// Backoff is the wait before retry number retry (1 for the first): a
// random duration up to base × 2^(retry-1), at most max ("full jitter",
// so that clients that failed together do not retry together). Every
// retrying client of onceflow waits by it: apiclient.Send and the job
// workers.
func Backoff(base, max time.Duration, retry int) time.Duration {
	ceiling := base << min(max0(retry-1), 30)
	if ceiling <= 0 || ceiling > max {
		ceiling = max
	}
	return time.Duration(rand.Int64N(int64(ceiling) + 1)) // #nosec G404 -- full-jitter backoff: nothing to guess
}

func max0(n int) int {
	if n < 0 {
		return 0
	}
	return n
}

// ParseRetryAfter reads a Retry-After header value: whole seconds or an
// HTTP date (RFC 9110 §10.2.3), as a wait from now (0 for a date in the
// past). ok is false for an empty or malformed value.
func ParseRetryAfter(v string, now time.Time) (d time.Duration, ok bool) {
	if v == "" {
		return 0, false
	}
	if s, err := strconv.Atoi(v); err == nil && s >= 0 {
		return time.Duration(s) * time.Second, true
	}
	if t, err := http.ParseTime(v); err == nil {
		return max(t.Sub(now), 0), true
	}
	return 0, false
}
