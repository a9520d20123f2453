package slidingratelimit

import (
	"fmt"
	"net/http"
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
}

// provision loads the zone's matchers and precomputes what requests need.
// The key, algorithm, count_status, cost and settle of defaults (the
// handler's) stand for those the zone leaves empty.
func (z *Zone) provision(ctx caddy.Context, logger *zap.Logger, defaults Zone) error {
	if z.Key == "" {
		z.Key = defaults.Key
	}
	if z.Algorithm == "" {
		z.Algorithm = defaults.Algorithm
	}
	if z.CountStatus == nil {
		z.CountStatus = defaults.CountStatus
	}
	if z.Cost == "" {
		z.Cost = defaults.Cost
	}
	if z.Settle == nil {
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
	if z.Algorithm == algorithmCounter {
		z.limit.Algorithm = limiter.SlidingCounter
		if z.MaxRequests < counterMinMax {
			logger.Warn("algorithm counter with a small max_requests can block a client for up to two windows; use algorithm log for small limits",
				zap.String("zone", z.Name), zap.Int64("max_requests", z.MaxRequests))
		}
	}
	z.units = newZoneUnits(z.Name, z.Cost, z.MaxRequestsFrom, z.MaxRequests, z.Settle, logger)
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
	for _, err := range []error{
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
	} {
		if err != nil {
			if z.Name == "" {
				return err
			}
			return fmt.Errorf("zone %s: %w", z.Name, err)
		}
	}
	return nil
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
