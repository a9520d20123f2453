package slidingratelimit

import (
	"net/http"
	"strings"

	"github.com/caddyserver/caddy/v2"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/slidingratelimit/caddy-sliding-ratelimit/limiter"
)

// The units a zone counts in, as headers, placeholders and the admin API
// name them.
const (
	// unitRequests: one per request, the default.
	unitRequests = "requests"
	// unitContentBytes: the bytes of response bodies (settle bytes).
	unitContentBytes = "content-bytes"
	// unitUnits: what requests say they cost (cost) or what their
	// responses report (settle header): tokens, a query's complexity.
	unitUnits = "units"
	// unitConcurrentRequests: requests in flight (a concurrency zone).
	unitConcurrentRequests = "concurrent-requests"
)

// zoneUnits is what a zone needs per request when a request is not simply
// one of max_requests: a cost, a quota per tenant, a settle. A zone with
// none of them has none (Zone.units is nil), and its requests pay for none
// of this.
type zoneUnits struct {
	cost zoneCost
	// quota is nil when the zone's max_requests holds for every client.
	quota *zoneQuota
	// settle is nil when a request's reservation stands (but for
	// count_status).
	settle *Settle
	// settleSource names what settle reads, in logs.
	settleSource string
	unit         string
	// admitted counts the units the zone admitted: each request's final
	// cost.
	admitted        prometheus.Counter
	settleFallbacks *valueFallbacks
}

// newZoneUnits returns what zone needs per request for its config values
// cost or costJSON, maxRequestsFrom (with the fallback maxRequests) and settle, nil when
// they are all empty; it binds their metrics.
func newZoneUnits(zone, cost string, costJSON *CostJSON, maxRequestsFrom string, maxRequests int64, settle *Settle, logger *zap.Logger) *zoneUnits {
	if cost == "" && costJSON == nil && maxRequestsFrom == "" && settle == nil {
		return nil
	}
	m := &limiterMetrics
	msg := "cost is not a whole number of at least 1: the request reserves 1"
	if costJSON != nil {
		msg = "cost json found no usable body: the request reserves the default"
	}
	u := &zoneUnits{
		cost:     newZoneCost(cost, costJSON, newValueFallbacks(logger, zone, msg, m.costFallbacks.WithLabelValues(zone))),
		settle:   settle,
		unit:     unitRequests,
		admitted: m.unitsAdmitted.WithLabelValues(zone),
	}
	// Validate rejects a value that is no placeholder; until then it is
	// left out.
	if isPlaceholder(maxRequestsFrom) {
		u.quota = &zoneQuota{
			from:      parseNumberPlaceholder(maxRequestsFrom),
			fallback:  maxRequests,
			fallbacks: newValueFallbacks(logger, zone, "max_requests placeholder gave no whole number from 1 to 2^48-1: the fallback applies", m.quotaFallbacks.WithLabelValues(zone)),
		}
	}
	if u.cost.from != nil || u.cost.json != nil || u.cost.fixed > 1 {
		u.unit = unitUnits
	}
	if settle != nil {
		settle.provision()
		u.unit, u.settleSource = unitUnits, "header "+settle.Header
		if settle.Bytes {
			u.unit, u.settleSource = unitContentBytes, "response bytes"
		}
		if len(settle.JSON) > 0 {
			u.settleSource = "json " + strings.Join(settle.JSON, " ")
		}
		u.settleFallbacks = newValueFallbacks(logger, zone, "settle found no whole number: the reservation stands", m.settleFallbacks.WithLabelValues(zone))
	}
	for _, p := range u.placeholders() {
		// A name without a dot is a map's output or another handler's
		// placeholder, which a price or a quota often is: only names in
		// Caddy's namespaces can be checked.
		if strings.Contains(p.name(), ".") && !knownPlaceholder(p.name()) {
			logger.Warn("placeholder is not one Caddy provides to a request handler: it will expand to \"\" and the fallback apply (a typo?)",
				zap.String("zone", zone), zap.String("placeholder", p.raw))
		}
	}
	return u
}

// placeholders are those of the cost and the quota.
func (u *zoneUnits) placeholders() []*numberPlaceholder {
	var ps []*numberPlaceholder
	if u.cost.from != nil {
		ps = append(ps, u.cost.from)
	}
	if u.quota != nil {
		ps = append(ps, u.quota.from)
	}
	return ps
}

// price sets what r costs in the zone, and the max of its call.
func (u *zoneUnits) price(r *http.Request, repl *caddy.Replacer, c *limiter.Check) {
	if u.quota != nil {
		c.Limit.Max = u.quota.of(r, repl)
	}
	c.Cost = u.cost.of(r, repl)
}

// name is what the zone counts in; a zone without units counts requests.
func (u *zoneUnits) name() string {
	if u == nil {
		return unitRequests
	}
	return u.unit
}
