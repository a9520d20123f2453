package slidingratelimit

import (
	"cmp"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/slidingratelimit/caddy-sliding-ratelimit/limiter"
)

// defaultZone is the name of the zone that the handler's own window and
// max_requests define (the three-line form).
const defaultZone = "default"

// counterMinMax is the smallest max_requests for which the counter algorithm
// is not warned about: below it, its estimate can block for up to two windows.
const counterMinMax = 10

// Zone is one named limit. A request is admitted only if every zone that
// applies to it admits it.
type Zone struct {
	// Name identifies the zone in headers, placeholders, metrics, the admin
	// API and Redis keys: letters, digits, '_', '-' and '.'. Required, unique
	// within the handler.
	Name string `json:"name,omitempty"`

	// Window is the span in which at most MaxRequests requests of one client
	// are admitted, counted back from each request. Required; greater than
	// zero.
	Window caddy.Duration `json:"window,omitempty"`

	// MaxRequests is how many requests one client may make in any Window,
	// or with a Cost or Settle how many units (tokens, bytes). Denied
	// requests do not count. Required; from 1 to 2^48-1. With
	// MaxRequestsFrom, the fallback.
	MaxRequests int64 `json:"max_requests,omitempty"`

	// MaxRequestsFrom is a placeholder alone whose value is each request's
	// max_requests: a tenant's own quota, such as
	// "{http.request.header.X-Quota}" that forward_auth copies from the auth
	// service's answer (deleting the client's own first), a map output or
	// "{http.vars.quota}". A header, query parameter or cookie counts by its
	// first value. When the value is missing or not a whole number from 1 to
	// 2^48-1, MaxRequests applies (never "unlimited"), and the request is
	// counted (max_requests_fallbacks_total) and logged at most once a
	// minute. The zone's identity says "per-tenant" instead of a number, so a
	// tenant whose quota changes keeps its window. Default: none.
	MaxRequestsFrom string `json:"max_requests_from,omitempty"`

	// Cost is what one request spends of MaxRequests, which is then a
	// budget in units: a whole number of at least 1, or a placeholder alone
	// read per request, such as "{http.request.header.X-Cost}" (its first
	// value) or "{http.vars.cost}" set by an earlier handler. A request value
	// never makes a request free or negative: a value that is missing or
	// not a whole number of at least 1 ("0", "-5", "1e9", "NaN") reserves 1,
	// counted (cost_fallbacks_total) and logged at most once a minute; a
	// value above the call's max_requests, however large, is denied with 429
	// and no Retry-After, since no wait admits it. Default: the handler's
	// cost, else 1.
	Cost string `json:"cost,omitempty"`

	// Settle replaces, after the response, what a request reserved (Cost)
	// with what it really cost: a response header or trailer, or the
	// response body's bytes (see Settle). Default: the handler's settle,
	// else none: the reservation stands.
	Settle *Settle `json:"settle,omitempty"`

	// CostJSON reads what a request reserves from its JSON body, instead
	// of Cost (see CostJSON). Default: the handler's cost_json, when the
	// zone sets no cost.
	CostJSON *CostJSON `json:"cost_json,omitempty"`

	// Key identifies the client in this zone, with placeholders expanded per
	// request (see the handler's key). Default: the handler's key.
	Key string `json:"key,omitempty"`

	// Algorithm is "log" (exact sliding-window log; memory grows with
	// max_requests) or "counter" (sliding-window counter; O(1) memory per
	// key, approximate). Default: the handler's algorithm.
	Algorithm string `json:"algorithm,omitempty"`

	// CountStatus lists the response statuses that count against this
	// zone's limit (see the handler's count_status). Default: the handler's.
	CountStatus []int `json:"count_status,omitempty"`

	// Wait is how long a request that this zone cannot admit now may be
	// held for its slot instead of denied (see the handler's wait); only a
	// zone of algorithm log waits. Default: the handler's wait.
	Wait caddy.Duration `json:"wait,omitempty"`

	// Concurrent makes this a concurrency zone: at most Concurrent requests
	// of one client in flight at once, on every instance that shares the
	// store. Each admitted request takes a slot (a lease) that it gives
	// back when its response ends. A concurrency zone has no window,
	// max_requests, algorithm, count_status or wait; a denied request gets
	// 429 with Retry-After: 1. Default 0: a zone of window and max_requests.
	Concurrent int64 `json:"concurrent,omitempty"`

	// Lease is how long a concurrency zone's slot outlives news of its
	// request: the instance that runs the request extends it every third of
	// Lease while the response runs (a long download, a WebSocket), so the
	// slots of an instance that died come back Lease after its last
	// extension. Default 1m; greater than zero when set; only with
	// Concurrent.
	Lease caddy.Duration `json:"lease,omitempty"`

	// MatchersRaw limits the zone to requests that match; default: all
	// requests the handler sees.
	MatchersRaw caddyhttp.RawMatcherSets `json:"match,omitempty" caddy:"namespace=http.matchers"`

	matchers caddyhttp.MatcherSets
	limit    limiter.Limit
	key      keyTemplate
	// identity names the zone's state in stores and deny caches: the name
	// and what makes it a different limit (see zoneIdentity).
	identity string
	// fallbacks logs keys that fell back to the client address.
	fallbacks *fallbackLog
	// policy is the RateLimit-Policy item, and quotedName and maxText are
	// precomputed for headers and placeholders (see prepareHeaders).
	policy     string
	quotedName string
	maxText    string
	// decisions counts this zone's decisions by result; cacheHits its deny
	// cache hits (see bindMetrics).
	decisions map[string]prometheus.Counter
	cacheHits prometheus.Counter
	// units is what a request costs and settles to when that is not one
	// request of MaxRequests; nil otherwise (see newZoneUnits).
	units *zoneUnits

	// wait is how long this zone lets a request wait for its slot: its
	// Wait, or the handler's; zero but in a zone of algorithm log.
	wait time.Duration
}

// provision loads the zone's matchers and precomputes what requests need.
// The key, algorithm, count_status, cost and settle of defaults (the
// handler's) stand for those the zone leaves empty.
func (z *Zone) provision(ctx caddy.Context, logger *zap.Logger, defaults Zone) error {
	if z.Key == "" {
		z.Key = defaults.Key
	}
	// A concurrency zone has none of these: the handler's do not apply.
	if z.Algorithm == "" && !z.concurrency() {
		z.Algorithm = defaults.Algorithm
	}
	if z.CountStatus == nil && !z.concurrency() {
		z.CountStatus = defaults.CountStatus
	}
	if z.Cost == "" && z.CostJSON == nil && !z.concurrency() {
		z.Cost, z.CostJSON = defaults.Cost, defaults.CostJSON
	}
	if z.Settle == nil && !z.concurrency() {
		z.Settle = defaults.Settle
	}
	if z.MatchersRaw != nil {
		mods, err := ctx.LoadModule(z, "MatchersRaw")
		if err != nil {
			return fmt.Errorf("zone %s: loading matchers: %w", z.Name, err)
		}
		if err := z.matchers.FromInterface(mods); err != nil {
			return fmt.Errorf("zone %s: %w", z.Name, err)
		}
	}
	z.limit = limiter.Limit{Window: time.Duration(z.Window), Max: z.MaxRequests}
	switch {
	case z.concurrency():
		z.limit = limiter.Limit{Window: cmp.Or(time.Duration(z.Lease), defaultLease), Max: z.Concurrent, Algorithm: limiter.Concurrency}
	case z.Algorithm == algorithmLog:
		z.wait = time.Duration(cmp.Or(z.Wait, defaults.Wait))
		// The handler's wait is checked here against each zone's window.
		if err := checkWait(z.wait, time.Duration(z.Window), z.Algorithm); err != nil {
			return fmt.Errorf("zone %s: %w", z.Name, err)
		}
	}
	if z.Algorithm == algorithmCounter {
		z.limit.Algorithm = limiter.SlidingCounter
		if z.MaxRequests < counterMinMax {
			logger.Warn("algorithm counter with a small max_requests can block a client for up to two windows; use algorithm log for small limits",
				zap.String("zone", z.Name), zap.Int64("max_requests", z.MaxRequests))
		}
	}
	z.units = newZoneUnits(z.Name, z.Cost, z.CostJSON, z.MaxRequestsFrom, z.MaxRequests, z.Settle, logger)
	warnClientChosenUnits(logger, z.Name, z.MaxRequestsFrom, z.Cost, z.Settle != nil)
	z.identity = zoneIdentity(z.Name, z.limit, z.MaxRequestsFrom != "", z.CountStatus, z.Settle)
	z.key = parseKeyTemplate(z.Key)
	for _, name := range z.key.placeholderNames() {
		if !knownPlaceholder(name) {
			logger.Warn("key placeholder is not one Caddy provides to a request handler: it will expand to \"\" and the key fall back to the client address (a typo?)",
				zap.String("zone", z.Name), zap.String("placeholder", "{"+name+"}"), zap.String("key", z.Key))
		}
	}
	z.fallbacks = newFallbackLog(logger, z.Name, time.Minute)
	return nil
}

// defaultLease is a concurrency zone's lease time when it sets none. It is
// how long the slots of an instance that dies stay taken, and a running
// request's instance extends its lease every third of it: a minute frees a
// dead instance's slots soon enough to be an outage, not a lockout, and
// costs one extension per long request every 20 s (batched with the
// others), while an extension may fail for 40 s (Redis away, a stalled
// process) before a running request loses its slot.
const defaultLease = time.Minute

// concurrency reports whether the zone limits requests in flight.
func (z *Zone) concurrency() bool { return z.Concurrent != 0 || z.Lease != 0 }

// applies reports whether the zone limits r.
func (z *Zone) applies(r *http.Request) (bool, error) {
	if len(z.matchers) == 0 {
		return true, nil
	}
	return z.matchers.AnyMatchWithError(r)
}

// counts reports whether a response with status keeps the zone's admission
// counted under its count_status: an entry is a status code, or a single
// digit n for the class nxx, as Caddy's response matchers read status codes.
// An empty list counts every response.
func (z *Zone) counts(status int) bool {
	if z.limit.Algorithm == limiter.Concurrency {
		// Its lease is given back when the response ends, whatever it is.
		return false
	}
	if len(z.CountStatus) == 0 {
		return true
	}
	for _, s := range z.CountStatus {
		if s == status || s < 10 && status/100 == s {
			return true
		}
	}
	return false
}

// validate checks the zone's own fields.
func (z *Zone) validate() error {
	rules := []error{
		checkZoneName(z.Name),
		checkPositive("window", time.Duration(z.Window)),
		checkMaxRequests(z.MaxRequests),
		checkKeyTemplate(z.Key),
		algorithmEnum.check(z.Algorithm),
		checkCountStatus(z.CountStatus),
		checkCost(z.Cost),
		checkSettle(z.Settle),
		checkMaxRequestsFrom(z.MaxRequestsFrom),
		checkCostFits(z.Cost, z.MaxRequests, z.MaxRequestsFrom),
		checkCostJSON(z.CostJSON, z.Cost),
		checkCostJSONFits(z.CostJSON, z.MaxRequests, z.MaxRequestsFrom),
		checkWait(time.Duration(z.Wait), time.Duration(z.Window), z.Algorithm),
	}
	if z.concurrency() {
		rules = []error{
			checkZoneName(z.Name),
			checkConcurrencyZone(z.Concurrent, time.Duration(z.Lease), z.countingFields(), z.Algorithm, time.Duration(z.Wait)),
			checkKeyTemplate(z.Key),
		}
	}
	for _, err := range rules {
		if err != nil {
			if z.Name == "" {
				return err
			}
			return fmt.Errorf("zone %s: %w", z.Name, err)
		}
	}
	return nil
}

// countingFields names the fields set that count admissions in a window,
// which a concurrency zone does not.
func (z *Zone) countingFields() string {
	var set []string
	if z.Window != 0 {
		set = append(set, "window")
	}
	if z.MaxRequests != 0 {
		set = append(set, "max_requests")
	}
	if z.CountStatus != nil {
		set = append(set, "count_status")
	}
	if z.MaxRequestsFrom != "" {
		set = append(set, "max_requests_from")
	}
	if z.Cost != "" {
		set = append(set, "cost")
	}
	if z.Settle != nil {
		set = append(set, "settle")
	}
	if z.CostJSON != nil {
		set = append(set, "cost_json")
	}
	return strings.Join(set, ", ")
}

// checkZoneNames rejects a name given twice, counting the zone that the
// top-level window and max_requests define.
func checkZoneNames(hasDefault bool, zones []*Zone) error {
	seen := map[string]bool{defaultZone: hasDefault}
	for _, z := range zones {
		if seen[z.Name] {
			if z.Name == defaultZone && hasDefault {
				return fmt.Errorf("zone %s clashes with the zone that window and max_requests define", defaultZone)
			}
			return fmt.Errorf("zone %s is defined twice", z.Name)
		}
		seen[z.Name] = true
	}
	return nil
}

// unit is what the zone counts in.
func (z *Zone) unit() string {
	if z.limit.Algorithm == limiter.Concurrency {
		return unitConcurrentRequests
	}
	return z.units.name()
}

// bindMetrics binds the zone's counters once, so requests do not look up
// label values.
func (z *Zone) bindMetrics() {
	z.decisions = make(map[string]prometheus.Counter)
	for _, result := range []string{resultAllowed, resultDenied, resultFailedOpen, resultFailedClosed, resultLocalAllowed, resultLocalDenied} {
		z.decisions[result] = limiterMetrics.decisions.WithLabelValues(z.Name, result)
	}
	z.cacheHits = limiterMetrics.denyCacheHits.WithLabelValues(z.Name)
	z.fallbacks.counter = limiterMetrics.keyFallbacks.WithLabelValues(z.Name)
}
