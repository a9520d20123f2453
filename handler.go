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
		checks = append(checks, limiter.Check{Zone: z.Name, Key: h.keyFor(r, repl, z.Key, zones, checks), Limit: z.limit})
		zones = append(zones, z)
	}
	if len(checks) == 0 {
		return next.ServeHTTP(w, r)
	}
	decisions := decisionsBuf[:0]
	if len(checks) > maxInlineZones {
		decisions = make([]limiter.Decision, len(checks))
	} else {
		decisions = decisionsBuf[:len(checks)]
	}

	ctx, cancel := context.WithTimeout(r.Context(), time.Duration(h.Timeout))
	err := h.store.Allow(ctx, checks, decisions)
	cancel()
	if err != nil {
		return h.failed(w, r, next, err)
	}

	shown := mostRestrictive(decisions)
	writeHeaders(w.Header(), h.Headers, zones, decisions, shown)
	setPlaceholders(repl, zones[shown], decisions[shown])
	if limiter.Admitted(decisions) {
		return next.ServeHTTP(w, r)
	}

	d := decisions[shown]
	if ce := h.logger.Check(zap.DebugLevel, "rate limited"); ce != nil {
		fields := []zap.Field{zap.String("zone", zones[shown].Name), zap.Duration("retry_after", d.RetryAfter), zap.String("mode", h.Mode)}
		if h.LogKeys {
			fields = append(fields, zap.String("key", checks[shown].Key))
		}
		ce.Write(fields...)
	}
	if h.Mode == modeReport {
		return next.ServeHTTP(w, r)
	}
	w.Header().Set("Retry-After", formatSeconds(d.RetryAfter))
	return caddyhttp.Error(http.StatusTooManyRequests, errRateLimited)
}

// keyFor returns the client key for a zone's key template, reusing the key
// already built for an earlier zone with the same template.
func (h *Handler) keyFor(r *http.Request, repl *caddy.Replacer, template string, zones []*Zone, checks []limiter.Check) string {
	for i, z := range zones {
		if z.Key == template {
			return checks[i].Key
		}
	}
	return clientKey(r, repl, template, h.IPv4Prefix, h.IPv6Prefix)
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

// failed applies the fail mode to a request the store could not decide.
func (h *Handler) failed(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler, err error) error {
	h.failures.record(h.FailMode, err)
	if h.FailMode == failClosed {
		return caddyhttp.Error(http.StatusServiceUnavailable, err)
	}
	return next.ServeHTTP(w, r)
}
