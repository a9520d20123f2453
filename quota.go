package slidingratelimit

import (
	"net/http"

	"github.com/caddyserver/caddy/v2"
)

// zoneQuota is a zone's max_requests taken per request from a placeholder (a
// tenant's quota, from a header that forward_auth copies, a map output, or
// {http.vars.*}), with the zone's max_requests as the fallback when the value
// is missing or not a whole number from 1 to maxMaxRequests. The fallback
// is never "unlimited": a tenant without a quota gets the zone's static limit.
// The zone's identity says "per tenant", not the value, so a tenant whose
// quota changes keeps its window; the engine decides each call exactly for
// its own max.
type zoneQuota struct {
	from      *numberPlaceholder
	fallback  int64
	fallbacks *valueFallbacks
}

// of returns the max of r's call.
func (q *zoneQuota) of(r *http.Request, repl *caddy.Replacer) int64 {
	v := q.from.value(r, repl)
	n, ok := parseCount(v)
	switch {
	case ok && n >= 1 && n <= maxMaxRequests:
		return n
	case ok && n > maxMaxRequests:
		q.fallbacks.record(q.from.raw, valueTooLarge)
	default:
		q.fallbacks.record(q.from.raw, whyNot(v))
	}
	return q.fallback
}
