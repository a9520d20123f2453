package slidingratelimit

import (
	"context"

	"go.uber.org/zap"

	"github.com/slidingratelimit/caddy-sliding-ratelimit/limiter"
)

// Zones in report mode (Zone.Mode): a limit on trial beside those in force
// (envoy ratelimit's shadow mode). The store decides a request's zones all
// or nothing and records nothing when one denies, so a report zone is not
// decided with the others: it would then refuse in all but name, its
// would-be denial taking the request out of the enforcing zones' counts.
// It is decided after them, only for a request they admit (or that none
// of them applies to), so that it counts what it would count in force
// beside them: the requests served that fit in it. Its would-be denials
// are counted and logged, never recorded; the enforcing zones count and
// refuse exactly as without it. That costs a second store call for the
// admitted requests of a handler with report zones, and one more per
// report zone that would deny (the rest decided again without it).

// takeReport moves the zones in report mode out of req, with their checks,
// into a request of their own, which it returns (nil when none applies).
func (req *request) takeReport() *request {
	var report *request
	kept := 0
	for i, z := range req.zones {
		if z.Mode != modeReport {
			req.zones[kept], req.checks[kept], req.fellBack[kept] = z, req.checks[i], req.fellBack[i]
			kept++
			continue
		}
		if report == nil {
			report = new(request)
			report.zones, report.checks = report.zonesBuf[:0], report.checksBuf[:0]
		}
		report.zones = append(report.zones, z)
		report.checks = append(report.checks, req.checks[i])
	}
	if report == nil {
		return nil
	}
	req.zones, req.checks, req.fellBack, req.decisions = req.zones[:kept], req.checks[:kept], req.fellBack[:kept], req.decisions[:kept]
	report.decisions = report.decisionsBuf[:0]
	if len(report.checks) > maxInlineZones {
		report.decisions = make([]limiter.Decision, 0, len(report.checks))
	}
	report.decisions = report.decisions[:len(report.checks)]
	return report
}

// decideReport decides the report zones of a request that goes on, and
// joins those that count it to req, with their decisions, to be settled
// with its other zones. Those that admit it are recorded together; each
// that would deny it is counted (report_denied) and logged, and the rest
// decided again without it. src is who decided req's other zones: report
// zones decided by another (Redis failed in between) keep their
// admissions but are not joined, since their settle would go to the wrong
// store. A store failure counts as failed_open: the request goes on.
func (h *Handler) decideReport(ctx context.Context, req, report *request, src source) {
	zones, checks := report.zones, report.checks
	for len(checks) > 0 {
		decisions := report.decisions[:len(checks)]
		from, err := h.backend.decide(ctx, checks, decisions)
		if err != nil && ctx.Err() != nil {
			// The client went away: nothing failed.
			return
		}
		if err != nil {
			for _, z := range zones {
				z.decisions[resultFailedOpen].Inc()
			}
			return
		}
		if limiter.Admitted(decisions) {
			for _, z := range zones {
				z.decisions[from.allowed()].Inc()
			}
			if from == src {
				req.zones = append(req.zones, zones...)
				req.checks = append(req.checks, checks...)
				req.decisions = append(req.decisions, decisions...)
			}
			return
		}
		kept := 0
		for i, d := range decisions {
			if d.Allowed {
				zones[kept], checks[kept] = zones[i], checks[i]
				kept++
				continue
			}
			h.wouldDeny(zones[i], checks[i].Key, d, from)
		}
		zones, checks = zones[:kept], checks[:kept]
	}
}

// wouldDeny counts and logs what a report zone would have denied. Like a
// denial, it is logged when the store decided it, the start of the
// client's would-be block, and answered by the deny cache after that.
func (h *Handler) wouldDeny(z *Zone, key string, d limiter.Decision, from source) {
	z.decisions[resultReportDenied].Inc()
	if from == fromCache {
		z.cacheHits.Inc()
		return
	}
	if ce := h.logger.Check(zap.DebugLevel, "rate limited"); ce != nil {
		fields := []zap.Field{zap.String("zone", z.Name), zap.Duration("retry_after", d.RetryAfter), zap.String("mode", modeReport)}
		if h.LogKeys {
			fields = append(fields, zap.String("key", key))
		}
		ce.Write(fields...)
	}
}
