package slidingratelimit

import (
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/slidingratelimit/caddy-sliding-ratelimit/limiter"
)

// prepareHeaders precomputes the zone's parts of the headers and
// placeholders, which are the same for every request.
func (z *Zone) prepareHeaders() {
	z.maxText = strconv.FormatInt(z.MaxRequests, 10)
	z.quotedName = strconv.Quote(z.Name)
	z.policy = z.quotedName + ";q=" + z.maxText + ";w=" + strconv.FormatInt(ceilSeconds(z.limit.Window), 10)
}

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
// handle_errors and logs. The values are formatted only if a placeholder is
// used; a later decision on the same request (a second handler) replaces
// the earlier one.
func setPlaceholders(repl *caddy.Replacer, z *Zone, d limiter.Decision) {
	if p, ok := repl.Get(placeholdersKey); ok {
		*p.(*decisionPlaceholders) = decisionPlaceholders{z, d}
		return
	}
	p := &decisionPlaceholders{z, d}
	repl.Set(placeholdersKey, p)
	repl.Map(p.replace)
}

// placeholdersKey holds a request's decisionPlaceholders in its replacer.
const placeholdersKey = "http.sliding_ratelimit._decision"

type decisionPlaceholders struct {
	zone     *Zone
	decision limiter.Decision
}

func (p *decisionPlaceholders) replace(key string) (any, bool) {
	name, ok := strings.CutPrefix(key, "http.sliding_ratelimit.")
	if !ok {
		return nil, false
	}
	switch name {
	case "zone":
		return p.zone.Name, true
	case "limit":
		return p.zone.maxText, true
	case "remaining":
		return p.decision.Remaining, true
	case "retry_after":
		return ceilSeconds(p.decision.RetryAfter), true
	case "reset":
		return ceilSeconds(p.decision.Reset), true
	}
	return nil, false
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
