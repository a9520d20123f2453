package slidingratelimit

import (
	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyevents"
	"go.uber.org/zap"

	"github.com/slidingratelimit/caddy-sliding-ratelimit/limiter"
)

// Soft limits: a zone with warn tells, before it refuses, that a client
// has used a share of its budget (LiteLLM's soft_budget, envoy ratelimit's
// near-limit ratio).
//
// A client's use of a zone after an admitted request is what the decision
// leaves of the call's max: max - remaining, in the zone's units,
// reservations included; before the request, that less its cost. The
// request reaches the soft limit when use before is below the share and
// use after is at or above it. Redis decides each admission against every
// earlier one in one atomic step, so two requests never see the same use:
// one request of the whole fleet reaches the share, whichever instance
// serves it, and it alone is logged, counted and emitted. In a sliding
// window use falls as admissions age out: a client that stays at or above
// the share reaches it once; one that falls below and climbs back reaches
// it again. A calendar period's use only falls when the period starts
// over, so there it is once a period.

// softLimitEvent is emitted when a request reaches a zone's soft limit.
const softLimitEvent = "sliding_ratelimit.soft_limit"

// warnParam is the vendor-prefixed parameter of a RateLimit item whose
// client has reached the zone's soft limit: the draft lets a service add
// parameters of its own, prefixed, as the policy's srl-qu is.
const warnParam = ";srl-warn"

// softThreshold is the use, in units, at which percent of max is reached:
// the least whole number of units at or above the share.
func softThreshold(max int64, percent int) int64 {
	return (max*int64(percent) + 99) / 100
}

// softUse returns a client's use of zone z after the admission d decided
// for check c, and the zone's threshold for the call; ok is false when the
// zone has no soft limit or d admitted nothing.
func (z *Zone) softUse(c limiter.Check, d limiter.Decision) (use, threshold int64, ok bool) {
	if z.WarnPercent == 0 || !d.Allowed || d.Remaining < 0 {
		return 0, 0, false
	}
	return c.Limit.Max - d.Remaining, softThreshold(c.Limit.Max, z.WarnPercent), true
}

// warns reports whether the RateLimit item of zone z in a response
// admitted by d carries warnParam: its client's use is at or above the
// soft limit.
func (z *Zone) warns(c limiter.Check, d limiter.Decision) bool {
	use, threshold, ok := z.softUse(c, d)
	return ok && use >= threshold
}

// softLimits tells of the requests that reach a soft limit: a log line at
// INFO (the client's state, not the server's trouble, but what the
// operator asked to hear of), the zone's soft_limit_reached_total, and
// softLimitEvent for the events app's subscribers.
type softLimits struct {
	logger *zap.Logger
	// events is nil without an events app.
	events *caddyevents.App
	ctx    caddy.Context
	// logKeys puts the client key in the line, as in a denial's.
	logKeys bool
}

// note tells of each zone of an admitted request whose soft limit the
// request reached.
func (s softLimits) note(req *request) {
	for i, z := range req.zones {
		use, threshold, ok := z.softUse(req.checks[i], req.decisions[i])
		if !ok || use < threshold || use-max(req.checks[i].Cost, 1) >= threshold {
			continue
		}
		z.softReached.Inc()
		max := req.checks[i].Limit.Max
		share := float64(use) / float64(max)
		fields := []zap.Field{zap.String("zone", z.Name), zap.Int64("use", use), zap.Int64("limit", max),
			zap.Float64("share", share), zap.Int("warn_percent", z.WarnPercent), zap.String("unit", z.unit())}
		if s.logKeys {
			fields = append(fields, zap.String("key", req.checks[i].Key))
		}
		s.logger.Info("soft limit reached", fields...)
		if s.events != nil {
			s.events.Emit(s.ctx, softLimitEvent, map[string]any{
				"zone":  z.Name,
				"use":   use,
				"limit": max,
				"share": share,
			})
		}
	}
}
