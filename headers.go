package slidingratelimit

import (
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/slidingratelimit/caddy-sliding-ratelimit/limiter"
)

// writeHeaders sets the rate-limit headers of a decision
// (draft-ietf-httpapi-ratelimit-headers-11):
//
//	RateLimit-Policy: "<zone>";q=<max>;w=<window seconds>, ... (every zone applied)
//	RateLimit: "<zone>";r=<remaining>;t=<seconds until a slot frees> (the most restrictive)
//
// and with mode legacy also X-RateLimit-Limit, X-RateLimit-Remaining and
// X-RateLimit-Reset (seconds) of the most restrictive zone.
func writeHeaders(h http.Header, mode string, zones []*Zone, decisions []limiter.Decision, shown int) {
	if mode == headersOff {
		return
	}
	policy := zones[0].policy
	if len(zones) > 1 {
		items := make([]string, len(zones))
		for i, z := range zones {
			items[i] = z.policy
		}
		policy = strings.Join(items, ", ")
	}
	z, d := zones[shown], decisions[shown]
	reset := formatSeconds(d.Reset)
	remaining := strconv.FormatInt(d.Remaining, 10)
	h["Ratelimit-Policy"] = []string{policy}
	h["Ratelimit"] = []string{z.quotedName + ";r=" + remaining + ";t=" + reset}
	if mode == headersLegacy {
		h["X-Ratelimit-Limit"] = []string{z.maxText}
		h["X-Ratelimit-Remaining"] = []string{remaining}
		h["X-Ratelimit-Reset"] = []string{reset}
	}
}

// setPlaceholders exposes a decision as {http.sliding_ratelimit.*}, for
// handle_errors and logs.
func setPlaceholders(repl *caddy.Replacer, z *Zone, d limiter.Decision) {
	repl.Set("http.sliding_ratelimit.zone", z.Name)
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
