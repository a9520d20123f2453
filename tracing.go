package slidingratelimit

import (
	"net/http"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/slidingratelimit/caddy-sliding-ratelimit/limiter"
)

// The decision on the request's span, when Caddy's tracing handler records
// one: zone, outcome, remaining, retry-after, wait, units and the fail mode
// that applied, as attributes under traceAttrPrefix, and an event for a
// denial. OpenTelemetry has no convention for rate limiting yet, so the
// names are the module's own, like its placeholders. Without tracing (or for
// a span not sampled) the span does not record and nothing is built: one
// context lookup per request.

// traceAttrPrefix starts every attribute and event name.
const traceAttrPrefix = "sliding_ratelimit."

// Attribute keys.
const (
	traceZone       = attribute.Key(traceAttrPrefix + "zone")
	traceZones      = attribute.Key(traceAttrPrefix + "zones")
	traceOutcome    = attribute.Key(traceAttrPrefix + "outcome")
	traceRemaining  = attribute.Key(traceAttrPrefix + "remaining")
	traceRetryAfter = attribute.Key(traceAttrPrefix + "retry_after")
	traceWait       = attribute.Key(traceAttrPrefix + "wait")
	traceUnits      = attribute.Key(traceAttrPrefix + "units")
	traceUnit       = attribute.Key(traceAttrPrefix + "unit")
	traceFailMode   = attribute.Key(traceAttrPrefix + "fail_mode")
	traceDenyCache  = attribute.Key(traceAttrPrefix + "deny_cache")
	traceMode       = attribute.Key(traceAttrPrefix + "mode")
)

// deniedEvent is the span event of a denial.
const deniedEvent = traceAttrPrefix + "denied"

// traceDecision puts a decided request on its span: the zone whose decision
// the headers show, and every zone that took part. Durations are seconds.
func traceDecision(r *http.Request, req *request, shown int, src source, mode string) {
	span := trace.SpanFromContext(r.Context())
	if !span.IsRecording() {
		return
	}
	z, c, d := req.zones[shown], req.checks[shown], req.decisions[shown]
	admitted := limiter.Admitted(req.decisions)
	outcome := src.allowed()
	if !admitted {
		outcome = src.denied()
	}
	units := c.Cost
	if units == 0 {
		units = 1
	}
	attrs := []attribute.KeyValue{
		traceZone.String(z.Name),
		traceZones.StringSlice(zoneNames(req.zones)),
		traceOutcome.String(outcome),
		traceRemaining.Int64(d.Remaining),
		traceUnits.Int64(units),
		traceUnit.String(z.unit()),
		traceMode.String(mode),
	}
	if src == fromLocal {
		attrs = append(attrs, traceFailMode.String(failLocal))
	}
	if src == fromCache {
		attrs = append(attrs, traceDenyCache.Bool(true))
	}
	if admitted && d.Delay > 0 {
		attrs = append(attrs, traceWait.Float64(req.decisions[0].Delay.Seconds()))
	}
	if !admitted && !d.Never {
		attrs = append(attrs, traceRetryAfter.Float64(d.RetryAfter.Seconds()))
	}
	span.SetAttributes(attrs...)
	if !admitted {
		event := []attribute.KeyValue{traceZone.String(z.Name)}
		if !d.Never {
			event = append(event, traceRetryAfter.Float64(d.RetryAfter.Seconds()))
		}
		span.AddEvent(deniedEvent, trace.WithAttributes(event...))
	}
}

// traceFailed puts a request the store could not decide on its span, with
// the fail mode open or closed that answers it.
func traceFailed(r *http.Request, req *request, failMode string, err error) {
	span := trace.SpanFromContext(r.Context())
	if !span.IsRecording() {
		return
	}
	outcome := resultFailedOpen
	if failMode == failClosed {
		outcome = resultFailedClosed
	}
	span.SetAttributes(
		traceZone.String(req.zones[0].Name),
		traceZones.StringSlice(zoneNames(req.zones)),
		traceOutcome.String(outcome),
		traceFailMode.String(failMode),
	)
	span.RecordError(err)
}

// zoneNames are the names of zones.
func zoneNames(zones []*Zone) []string {
	names := make([]string, len(zones))
	for i, z := range zones {
		names[i] = z.Name
	}
	return names
}
