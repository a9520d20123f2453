package slidingratelimit

import (
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/slidingratelimit/caddy-sliding-ratelimit/limiter"
)

// prepareHeaders precomputes the zone's parts of the headers and
// placeholders, which are the same for every request.
func (z *Zone) prepareHeaders() {
	z.maxText = strconv.FormatInt(z.MaxRequests, 10)
	z.quotedName = strconv.Quote(z.Name)
	z.policy = z.quotedName + ";q=" + z.maxText + ";w=" + strconv.FormatInt(ceilSeconds(z.limit.Window), 10)
	if z.limit.Algorithm == limiter.Concurrency {
		// Requests in flight have a quota unit of their own and no window.
		z.maxText = strconv.FormatInt(z.Concurrent, 10)
		z.policy = z.quotedName + ";q=" + z.maxText + `;qu="concurrent-requests"`
	}
}

// writeHeaders sets the rate-limit headers of a decision
// (draft-ietf-httpapi-ratelimit-headers-11):
//
//	RateLimit-Policy: "<zone>";q=<max>;w=<window seconds>, ... (every zone applied)
//	RateLimit: "<zone>";r=<remaining>;t=<seconds until a slot frees> (the most restrictive)
//
// and with mode legacy also X-RateLimit-Limit, X-RateLimit-Remaining and
// X-RateLimit-Reset (seconds) of the most restrictive zone. It runs on every
// request: the values share one backing array, and the RateLimit item is
// built in one allocation.
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
	var buf [96]byte
	item := append(buf[:0], z.quotedName...)
	item = append(item, ";r="...)
	item = strconv.AppendInt(item, d.Remaining, 10)
	if z.limit.Algorithm != limiter.Concurrency {
		// A slot in flight frees when a request ends: no time to say.
		item = append(item, ";t="...)
		item = strconv.AppendInt(item, ceilSeconds(d.Reset), 10)
	}
	if mode != headersLegacy {
		values := make([]string, 2)
		values[0], values[1] = policy, string(item)
		// Full slice expressions: an append to one header never writes
		// into the other's value.
		h["Ratelimit-Policy"], h["Ratelimit"] = values[0:1:1], values[1:2:2]
		return
	}
	values := make([]string, 5)
	values[0], values[1] = policy, string(item)
	values[2] = z.maxText
	values[3] = strconv.FormatInt(d.Remaining, 10)
	values[4] = formatSeconds(d.Reset)
	h["Ratelimit-Policy"], h["Ratelimit"] = values[0:1:1], values[1:2:2]
	h["X-Ratelimit-Limit"], h["X-Ratelimit-Remaining"], h["X-Ratelimit-Reset"] = values[2:3:3], values[3:4:4], values[4:5:5]
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
