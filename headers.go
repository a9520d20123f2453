package slidingratelimit

import (
	"net/http"
	"strconv"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/slidingratelimit/caddy-sliding-ratelimit/limiter"
)

// writeHeaders sets the rate-limit headers of one decision:
//
//	RateLimit-Policy: "<zone>";q=<max>;w=<window seconds>
//	RateLimit: "<zone>";r=<remaining>;t=<seconds until a slot frees>
//
// (IETF draft-ietf-httpapi-ratelimit-headers-11), and with mode legacy also
// X-RateLimit-Limit, X-RateLimit-Remaining and X-RateLimit-Reset (seconds).
func writeHeaders(h http.Header, mode string, z *zone, d limiter.Decision) {
	if mode == headersOff {
		return
	}
	reset := formatSeconds(d.Reset)
	remaining := strconv.FormatInt(d.Remaining, 10)
	h["Ratelimit-Policy"] = []string{z.policy}
	h["Ratelimit"] = []string{strconv.Quote(z.name) + ";r=" + remaining + ";t=" + reset}
	if mode == headersLegacy {
		h["X-Ratelimit-Limit"] = []string{z.maxText}
		h["X-Ratelimit-Remaining"] = []string{remaining}
		h["X-Ratelimit-Reset"] = []string{reset}
	}
}

// setPlaceholders exposes a decision as {http.sliding_ratelimit.*}, for
// handle_errors and logs.
func setPlaceholders(repl *caddy.Replacer, z *zone, d limiter.Decision) {
	repl.Set("http.sliding_ratelimit.zone", z.name)
	repl.Set("http.sliding_ratelimit.limit", z.maxText)
	repl.Set("http.sliding_ratelimit.remaining", d.Remaining)
	repl.Set("http.sliding_ratelimit.retry_after", ceilSeconds(d.RetryAfter))
	repl.Set("http.sliding_ratelimit.reset", ceilSeconds(d.Reset))
}

// ceilSeconds rounds d up to whole seconds: a client that waits the rounded
// time is never early. A positive duration is at least one second.
func ceilSeconds(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	return int64((d + time.Second - 1) / time.Second)
}

func formatSeconds(d time.Duration) string {
	return strconv.FormatInt(ceilSeconds(d), 10)
}
