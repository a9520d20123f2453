package slidingratelimit

import (
	"errors"
	"fmt"
	"net/http"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"
	"go.uber.org/zap"

	"github.com/slidingratelimit/caddy-sliding-ratelimit/limiter"
)

// errRateLimited is the error a denied request carries to handle_errors.
var errRateLimited = errors.New("rate limit exceeded")

// exceededEvent is emitted once per client and block (see ServeHTTP).
const exceededEvent = "sliding_ratelimit.exceeded"

// ServeHTTP decides the request in every zone that applies, with one store
// call, and either passes it on or answers 429 (or, when the store fails,
// applies the fail mode).
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler) error {
	repl := r.Context().Value(caddy.ReplacerCtxKey).(*caddy.Replacer)
	if h.readsModel {
		repl.Map(modelProvider(r))
	}
	var req request
	if err := req.collect(h.zones, r, repl, h.IPv4Prefix, h.IPv6Prefix); err != nil {
		var refused *bodyRefusal
		if errors.As(err, &refused) {
			return refuseBody(w, r, refused)
		}
		return caddyhttp.Error(http.StatusInternalServerError, err)
	}
	report := req.takeReport()
	if len(req.checks) == 0 {
		if report != nil {
			// Only zones in report mode apply: the request goes on.
			return h.serveAdmitted(w, r, next, &req, report, fromStore)
		}
		return next.ServeHTTP(w, r)
	}
	source, waiting, err := fromNoStore, false, error(nil)
	if !neverFits(req.checks, req.decisions) {
		waiting = h.waits.enter(&req, r)
		source, err = h.backend.decide(r.Context(), req.checks, req.decisions)
	}
	if waiting {
		if held, failed := h.waits.hold(r, &req, source, err); !held {
			// The client went away while held, or its body failed; its
			// slots were given back.
			return failed
		}
	}
	if err != nil {
		if r.Context().Err() != nil {
			// The client went away: nothing failed, and no one waits.
			return nil
		}
		traceFailed(r, &req, h.FailMode, err)
		return h.failed(w, r, next, &req, err)
	}
	if h.leases != nil {
		leaseAnswers(req.zones, req.decisions)
	}
	shown := mostRestrictive(req.decisions)
	traceDecision(r, &req, shown, source, h.Mode)
	writeHeaders(w.Header(), h.Headers, req.zones, req.checks, req.decisions, shown)
	writeSDKHeaders(w.Header(), h.Headers, r, req.zones, req.checks, req.decisions)
	setPlaceholders(r, repl, req.zones[shown], req.checks[shown], req.decisions[shown])
	if limiter.Admitted(req.decisions) {
		return h.serveAdmitted(w, r, next, &req, report, source)
	}
	return h.deny(w, r, next, &req, shown, source)
}

// serveAdmitted passes on a request that src admitted: counted, decided in
// the zones in report mode (report, nil when none applies), its soft limits
// noted, its leases held while it runs and what it cost settled after.
func (h *Handler) serveAdmitted(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler, req, report *request, src source) error {
	count(req.zones, src.allowed())
	if report != nil {
		h.decideReport(r.Context(), req, report, src)
	}
	softLimits{h.logger, h.events, h.ctx, h.LogKeys}.note(req)
	next = h.leases.around(next, req, src)
	if h.afterResponse {
		return serveSettled(w, r, next, h.backend, req, src)
	}
	return next.ServeHTTP(w, r)
}

// failed applies fail_mode open or closed to a request the store could not
// decide.
func (h *Handler) failed(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler, req *request, err error) error {
	if h.FailMode == failClosed {
		count(req.zones, resultFailedClosed)
		w.Header().Set("Retry-After", failedClosedRetryAfter)
		return refuse(w, r, http.StatusServiceUnavailable, err)
	}
	count(req.zones, resultFailedOpen)
	return next.ServeHTTP(w, r)
}

// deny counts a denial and answers it: 429 with Retry-After, or, in report
// mode, the next handler.
func (h *Handler) deny(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler, req *request, shown int, src source) error {
	for i, d := range req.decisions {
		if !d.Allowed {
			req.zones[i].decisions[src.denied()].Inc()
		}
	}
	z, d := req.zones[shown], req.decisions[shown]
	switch src {
	case fromCache:
		z.cacheHits.Inc()
	case fromNoStore:
		// No block that ends: a line and an event a second at most.
		if h.backend.neverDenied(z.Name, req.checks[shown].Limit.Max) {
			h.denied(z, req.checks[shown].Key, d)
		}
	default:
		// Later denials of this block come from the deny cache, so this runs
		// once per client and block (per instance).
		h.denied(z, req.checks[shown].Key, d)
	}
	if h.Mode == modeReport {
		return next.ServeHTTP(w, r)
	}
	if !d.Never {
		// A request that costs more than the zone's max is never admitted:
		// a Retry-After would send it back for nothing.
		w.Header().Set("Retry-After", formatSeconds(d.RetryAfter))
	}
	if refusal, ok := llmRefusalOf(r, req.zones, z, req.checks[shown], d); ok {
		refusal.setRetryHeaders(w.Header())
		if !hasErrorRoutes(r) {
			refusal.write(w)
			return nil
		}
	}
	return refuse(w, r, http.StatusTooManyRequests, errRateLimited)
}

// failedClosedRetryAfter is the Retry-After of a fail-closed 503: the
// shortest wait the header can say. The breaker tries Redis again every 25
// to 100ms, so an outage may be over by then; a client that honours it
// waits instead of retrying at once.
const failedClosedRetryAfter = "1"

// refuse answers a denial (429) or a fail-closed request (503). When no
// handle_errors route would see the error, it writes the status itself, as
// Caddy's error path would, without that path's cost on every request of a
// flood or an outage: an error ID, and for a 5xx an error-level log line
// each. Otherwise it returns the error, for handle_errors to shape.
func refuse(w http.ResponseWriter, r *http.Request, status int, err error) error {
	if !hasErrorRoutes(r) {
		w.WriteHeader(status)
		return nil
	}
	return caddyhttp.Error(status, err)
}

// refuseBody answers a request refused for its body, as refuse answers a
// denial; a body that did not arrive closes the connection, whose rest of
// the request would otherwise be read as the next one.
func refuseBody(w http.ResponseWriter, r *http.Request, b *bodyRefusal) error {
	if b.reason == refusedSlow {
		w.Header().Set("Connection", "close")
	}
	if !hasErrorRoutes(r) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.WriteHeader(b.status())
		_, _ = fmt.Fprintln(w, b.Error())
		return nil
	}
	return caddyhttp.Error(b.status(), b)
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

// mostRestrictive picks the decision the headers report: among denying zones
// one that never admits the request (its cost is above the zone's max), else
// the one that admits last; else the one with the fewest units left.
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
			if d.Never && !s.Never || d.Never == s.Never && d.RetryAfter > s.RetryAfter {
				shown = i
			}
		case d.Remaining < s.Remaining || d.Remaining == s.Remaining && d.Reset > s.Reset:
			shown = i
		}
	}
	return shown
}

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
