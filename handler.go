package slidingratelimit

import (
	"context"
	"errors"
	"net/http"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"

	"github.com/slidingratelimit/caddy-sliding-ratelimit/limiter"
)

// errRateLimited is the error a denied request carries to handle_errors.
var errRateLimited = errors.New("rate limit exceeded")

// exceededEvent is emitted once per client and block (see ServeHTTP).
const exceededEvent = "sliding_ratelimit.exceeded"

// maxInlineZones is how many applicable zones a request can have before the
// per-request buffers spill to the heap.
const maxInlineZones = 4

// ServeHTTP decides the request in every zone that applies, with one store
// call, and either passes it on or answers 429 (or, when the store fails,
// applies the fail mode).
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler) error {
	repl := r.Context().Value(caddy.ReplacerCtxKey).(*caddy.Replacer)

	var (
		zonesBuf     [maxInlineZones]*Zone
		checksBuf    [maxInlineZones]limiter.Check
		decisionsBuf [maxInlineZones]limiter.Decision
	)
	zones, checks := zonesBuf[:0], checksBuf[:0]
	for _, z := range h.zones {
		applies, err := z.applies(r)
		if err != nil {
			return caddyhttp.Error(http.StatusInternalServerError, err)
		}
		if !applies {
			continue
		}
		checks = append(checks, limiter.Check{Zone: z.identity, Key: h.keyFor(r, repl, z, zones, checks), Limit: z.limit})
		zones = append(zones, z)
	}
	if len(checks) == 0 {
		return next.ServeHTTP(w, r)
	}
	var decisions []limiter.Decision
	if len(checks) <= maxInlineZones {
		decisions = decisionsBuf[:len(checks)]
	} else {
		decisions = make([]limiter.Decision, len(checks))
	}

	cached, err := h.decide(r.Context(), checks, decisions)
	local := false
	if err != nil {
		if r.Context().Err() != nil {
			// The client went away: nothing failed, and no one waits.
			return nil
		}
		h.failures.record(h.FailMode, err)
		switch h.FailMode {
		case failClosed:
			count(zones, resultFailedClosed)
			return caddyhttp.Error(http.StatusServiceUnavailable, err)
		case failLocal:
			// The in-process store never fails.
			_ = h.local.Allow(r.Context(), checks, decisions)
			local = true
		default:
			count(zones, resultFailedOpen)
			return next.ServeHTTP(w, r)
		}
	}

	shown := mostRestrictive(decisions)
	writeHeaders(w.Header(), h.Headers, zones, decisions, shown)
	setPlaceholders(repl, zones[shown], decisions[shown])
	if limiter.Admitted(decisions) {
		if local {
			count(zones, resultLocal)
		} else {
			count(zones, resultAllowed)
		}
		return next.ServeHTTP(w, r)
	}

	z, d := zones[shown], decisions[shown]
	result := resultDenied
	if local {
		result = resultLocal
	}
	for i, d := range decisions {
		if !d.Allowed {
			zones[i].decisions[result].Inc()
		}
	}
	if cached {
		z.cacheHits.Inc()
	} else {
		// Later denials of this block come from the deny cache, so this runs
		// once per client and block (per instance).
		h.denied(z, checks[shown].Key, d)
	}
	if h.Mode == modeReport {
		return next.ServeHTTP(w, r)
	}
	w.Header().Set("Retry-After", formatSeconds(d.RetryAfter))
	if !hasErrorRoutes(r) {
		// Nothing would see the error: answer as Caddy's error path would,
		// without its cost (an error ID and a stack trace per call), which a
		// flood pays on every request.
		w.WriteHeader(http.StatusTooManyRequests)
		return nil
	}
	return caddyhttp.Error(http.StatusTooManyRequests, errRateLimited)
}

// decide asks the deny cache, and behind it the store, within the timeout.
// The in-process store answers at once and needs no deadline.
func (h *Handler) decide(ctx context.Context, checks []limiter.Check, decisions []limiter.Decision) (cached bool, err error) {
	if h.breaker == nil {
		return h.cache.AllowCached(ctx, checks, decisions)
	}
	if h.cache.Cached(checks, decisions) {
		return true, nil
	}
	ctx, cancel := context.WithTimeout(ctx, time.Duration(h.Timeout))
	defer cancel()
	return h.cache.AllowCached(ctx, checks, decisions)
}

// hasErrorRoutes reports whether the server has handle_errors routes, which
// must see a denial as an error to shape its response.
func hasErrorRoutes(r *http.Request) bool {
	srv, ok := r.Context().Value(caddyhttp.ServerCtxKey).(*caddyhttp.Server)
	return !ok || srv == nil || srv.Errors != nil && len(srv.Errors.Routes) > 0
}

// denied logs the start of a client's block and emits the exceeded event.
func (h *Handler) denied(z *Zone, key string, d limiter.Decision) {
	if ce := h.logger.Check(zap.DebugLevel, "rate limited"); ce != nil {
		fields := []zap.Field{zap.String("zone", z.Name), zap.Duration("retry_after", d.RetryAfter), zap.String("mode", h.Mode)}
		if h.LogKeys {
			fields = append(fields, zap.String("key", key))
		}
		ce.Write(fields...)
	}
	if h.events != nil {
		h.events.Emit(h.ctx, exceededEvent, map[string]any{
			"zone":        z.Name,
			"retry_after": d.RetryAfter.Seconds(),
		})
	}
}

// count adds one decision with result to every zone that took part.
func count(zones []*Zone, result string) {
	for _, z := range zones {
		z.decisions[result].Inc()
	}
}

// keyFor returns the client key of zone z, reusing the key already built for
// an earlier zone with the same template.
func (h *Handler) keyFor(r *http.Request, repl *caddy.Replacer, z *Zone, zones []*Zone, checks []limiter.Check) string {
	for i, other := range zones {
		if other.Key == z.Key {
			return checks[i].Key
		}
	}
	key, fellBack := z.key.key(r, repl, h.IPv4Prefix, h.IPv6Prefix)
	if fellBack {
		z.fallbacks.record(z.Key)
	}
	return key
}

// mostRestrictive picks the decision the headers report: among denying zones
// the one that admits last; else the one with the fewest requests left.
func mostRestrictive(decisions []limiter.Decision) int {
	shown := 0
	for i, d := range decisions[1:] {
		i++
		s := decisions[shown]
		switch {
		case d.Allowed != s.Allowed:
			if !d.Allowed {
				shown = i
			}
		case !d.Allowed:
			if d.RetryAfter > s.RetryAfter {
				shown = i
			}
		case d.Remaining < s.Remaining || d.Remaining == s.Remaining && d.Reset > s.Reset:
			shown = i
		}
	}
	return shown
}
