package slidingratelimit

import (
	"net/http"

	"github.com/caddyserver/caddy/v2"

	"github.com/slidingratelimit/caddy-sliding-ratelimit/limiter"
)

// A request's client keys: the zones that apply to it, each with the key its
// template (internal/clientkey) builds from the request, and the checks the
// store decides on.

// maxInlineZones is how many applicable zones a request can have before its
// buffers spill to the heap.
const maxInlineZones = 4

// request is one request's zones, checks and decisions, index by index; its
// buffers keep the common case off the heap.
type request struct {
	zones     []*Zone
	checks    []limiter.Check
	decisions []limiter.Decision
	// fellBack says, index by index, whether the zone's key fell back to
	// the client address, so that a zone that reuses an earlier zone's key
	// counts its fallback too (key_fallbacks_total is per zone).
	fellBack []bool

	zonesBuf     [maxInlineZones]*Zone
	checksBuf    [maxInlineZones]limiter.Check
	decisionsBuf [maxInlineZones]limiter.Decision
	fellBackBuf  [maxInlineZones]bool
}

// collect fills req with the zones that apply to r and their checks, each
// with the client key that the zone's template builds (addresses grouped by
// the prefix lengths).
func (req *request) collect(zones []*Zone, r *http.Request, repl *caddy.Replacer, ipv4Bits, ipv6Bits int) error {
	req.zones, req.checks, req.fellBack = req.zonesBuf[:0], req.checksBuf[:0], req.fellBackBuf[:0]
	for _, z := range zones {
		applies, err := z.applies(r)
		if err != nil {
			return err
		}
		if !applies {
			continue
		}
		key, fellBack := req.key(r, repl, z, ipv4Bits, ipv6Bits)
		if fellBack {
			z.fallbacks.record(z.Key)
		}
		c := limiter.Check{Zone: z.identity, Key: key, Limit: z.limit}
		if z.period != nil {
			c.Zone = z.state(periodNow())
		}
		if z.units != nil {
			if err := z.units.price(r, repl, &c); err != nil {
				return err
			}
		}
		req.checks = append(req.checks, c)
		req.zones = append(req.zones, z)
		req.fellBack = append(req.fellBack, fellBack)
	}
	if len(req.checks) <= maxInlineZones {
		req.decisions = req.decisionsBuf[:len(req.checks)]
	} else {
		req.decisions = make([]limiter.Decision, len(req.checks))
	}
	return nil
}

// key returns the client key of zone z, and whether it fell back to the
// client address, reusing the key already built for an earlier zone with
// the same template.
func (req *request) key(r *http.Request, repl *caddy.Replacer, z *Zone, ipv4Bits, ipv6Bits int) (string, bool) {
	for i, other := range req.zones {
		if other.Key == z.Key {
			return req.checks[i].Key, req.fellBack[i]
		}
	}
	return z.key.Key(r, repl, ipv4Bits, ipv6Bits)
}
