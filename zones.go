package slidingratelimit

import (
	"cmp"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/slidingratelimit/caddy-sliding-ratelimit/internal/clientkey"
	"github.com/slidingratelimit/caddy-sliding-ratelimit/internal/llmprice"
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
	// are admitted, counted back from each request. Required unless Period
	// is given; greater than zero. A reload that changes it keeps the
	// counts of a log zone, and starts a counter zone's clients over (see
	// zoneIdentity).
	Window caddy.Duration `json:"window,omitempty"`

	// Period makes the zone count by the calendar instead of a sliding
	// Window: "day", "week" (ISO 8601: from Monday) or "month". A client
	// may spend MaxRequests per period, and the whole budget comes back at
	// the period's start, midnight in TimeZone, on every instance at once
	// (as their clocks tell it). Exclusive with Window; counted with
	// algorithm log, without a wait. Default "": the sliding Window.
	Period string `json:"period,omitempty"`

	// TimeZone is the IANA name of the time zone whose midnight starts each
	// Period, such as "Europe/Berlin" or "America/New_York"; a day is 23 or
	// 25 hours long where daylight saving starts or ends. Only with Period.
	// Default: the handler's time_zone, else "UTC".
	TimeZone string `json:"time_zone,omitempty"`

	// MaxRequests is how many requests one client may make in any Window,
	// or with a Cost or Settle how many units (tokens, bytes). Denied
	// requests do not count. Required; from 1 to 2^48-1. With
	// MaxRequestsFrom, the fallback. A reload that changes it keeps every
	// client's count: lowered, a client above it waits until enough ages
	// out.
	MaxRequests int64 `json:"max_requests,omitempty"`

	// MaxRequestsFrom is a placeholder alone whose value is each request's
	// max_requests: a tenant's own quota, such as
	// "{http.request.header.X-Quota}" that forward_auth copies from the auth
	// service's answer (deleting the client's own first), a map output or
	// "{http.vars.quota}". A header, query parameter or cookie counts by its
	// first value. When the value is missing or not a whole number from 1 to
	// 2^48-1, MaxRequests applies (never "unlimited"), and the request is
	// counted (max_requests_fallbacks_total) and logged at most once a
	// minute. The zone's identity holds no max_requests, so a tenant whose
	// quota changes keeps its count. Default: none.
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

	// CostLLM reads what a request reserves from its body as the LLM API
	// its path names reads it, instead of Cost (see CostLLM). Default: the
	// handler's cost_llm, when the zone sets no cost.
	CostLLM *CostLLM `json:"cost_llm,omitempty"`

	// Prices make the zone count money: each call's tokens at its model's
	// price, in millionths of a dollar (µ$), so that MaxRequests 10000000
	// is $10 (see Price). The first line whose model pattern matches the
	// model the request names prices it; a model no line matches pays the
	// dearest price of each kind listed (and is warned of once), so put a
	// last line of model "*" for the rest. A call reserves its bounds (see
	// CostLLM) at the model's dearest input price and its output price,
	// and settles to its usage with each kind of token at its own price,
	// rounded up to the µ$. Needs cost llm and settle llm. Default: none,
	// the zone counts tokens.
	Prices []*Price `json:"prices,omitempty"`

	// PriceTable is the path of a price table file in the format of
	// LiteLLM's model_prices_and_context_window.json, which makes the zone
	// count money as Prices do: a model the table names, matched whole
	// (case aside), is priced at the dearest price of each kind the table
	// gives for it (context tiers, priority service, audio, 1-hour cache
	// writes: the usage does not always say which applied), and a call that
	// names no output bound, or a larger one than the model's, reserves the
	// model's output limit. Prices lines override it: a line naming a model
	// whole comes first, then the table, then the lines with '*'; a model
	// neither names pays the dearest price of each kind of both. The file
	// is read when the config loads: a reload reads it again. Needs cost
	// llm and settle llm. Default: none.
	PriceTable string `json:"price_table,omitempty"`

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

	// WarnPercent is the zone's soft limit, a share of the call's
	// max_requests in percent: the admitted request that takes a client's
	// use of the window from below that share to at or above it is logged,
	// counted (soft_limit_reached_total) and emitted as an event, once
	// across every instance; every admitted response while the client's
	// use is at or above it carries srl-warn in the zone's RateLimit item.
	// Use is in the zone's units, reservations included. In a sliding
	// window use falls as admissions age out, so a client that falls below
	// the share and climbs back reaches it again (see softlimit.go). From
	// 1 to 99; not in a concurrency zone. Default 0: no soft limit.
	WarnPercent int `json:"warn_percent,omitempty"`

	// Mode is "enforce" (the default) or "report": a zone in report mode
	// never refuses a request and never holds one; it counts each request
	// that the handler's other zones admit (or that no other zone applies
	// to) and that fits in it, and a request that would not fit is
	// counted (decisions_total result "report_denied") and logged as a
	// denial is, and left out of its count. It takes no part in the other
	// zones' decision, sends no RateLimit headers and takes no wait, to
	// try a new limit beside the ones in force. Not in a concurrency zone.
	// The handler's mode report passes every request of every zone.
	Mode string `json:"mode,omitempty"`

	// MatchersRaw limits the zone to requests that match; default: all
	// requests the handler sees.
	MatchersRaw caddyhttp.RawMatcherSets `json:"match,omitempty" caddy:"namespace=http.matchers"`

	matchers caddyhttp.MatcherSets
	limit    limiter.Limit
	key      clientkey.Template
	// site names the site of an unnamed zone, the three-line form's, in
	// its identity ("" for a named zone; see implicitSite).
	site string
	// identity names the zone's state in stores and deny caches: the name
	// and what makes it a different state, not its numbers (see
	// zoneIdentity).
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
	// softReached counts the requests that reached the soft limit.
	softReached prometheus.Counter
	// units is what a request costs and settles to when that is not one
	// request of MaxRequests; nil otherwise (see newZoneUnits).
	units *zoneUnits

	// wait is how long this zone lets a request wait for its slot: its
	// Wait, or the handler's; zero but in a zone of algorithm log.
	wait time.Duration

	// period is the zone's calendar period, nil for a sliding window.
	period *period
}

// provision loads the zone's matchers and precomputes what requests need.
// The key, algorithm, count_status, cost and settle of defaults (the
// handler's) stand for those the zone leaves empty.
// readsModel reports whether a zone reads LLM calls (cost llm) or names
// the model placeholder in its key or matchers.
func readsModel(zones []*Zone) bool {
	for _, z := range zones {
		if z.CostLLM != nil || strings.Contains(z.Key, modelPlaceholder) {
			return true
		}
		for _, set := range z.MatchersRaw {
			for _, raw := range set {
				if strings.Contains(string(raw), modelPlaceholder) {
					return true
				}
			}
		}
	}
	return false
}

// priced reports whether the zone counts money: it has prices, or a price
// table.
func (z *Zone) priced() bool { return len(z.Prices) > 0 || z.PriceTable != "" }

func (z *Zone) provision(ctx caddy.Context, logger *zap.Logger, defaults Zone) error {
	if z.Key == "" {
		z.Key = defaults.Key
	}
	// A concurrency zone has none of these: the handler's do not apply.
	if z.Algorithm == "" && !z.concurrency() {
		z.Algorithm = defaults.Algorithm
		if z.Period != "" {
			// A period counts exactly: the handler's algorithm is its
			// sliding zones'.
			z.Algorithm = algorithmLog
		}
	}
	if z.TimeZone == "" && z.Period != "" {
		z.TimeZone = defaults.TimeZone
	}
	if z.CountStatus == nil && !z.concurrency() {
		z.CountStatus = defaults.CountStatus
	}
	if z.Cost == "" && z.CostJSON == nil && z.CostLLM == nil && !z.concurrency() {
		z.Cost, z.CostJSON, z.CostLLM = defaults.Cost, defaults.CostJSON, defaults.CostLLM
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
	var loc *time.Location
	switch {
	case z.concurrency():
		z.limit = limiter.Limit{Window: cmp.Or(time.Duration(z.Lease), defaultLease), Max: z.Concurrent, Algorithm: limiter.Concurrency}
	case z.Period != "":
		// No wait: its room comes back only at the period's start.
		var err error
		if loc, err = loadTimeZone(z.TimeZone); err != nil {
			return fmt.Errorf("zone %s: %w", z.Name, err)
		}
		z.limit.Window = periodWindow(z.Period)
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
	warnShortWindow(logger, z.Name, z.limit)
	z.units = newZoneUnits(z.Name, z.Cost, z.CostJSON, z.CostLLM, z.MaxRequestsFrom, z.MaxRequests, z.Settle, logger)
	warnClientChosenUnits(logger, z.Name, z.MaxRequestsFrom, z.Cost, z.Settle != nil)
	z.identity = zoneIdentity(z.Name, z.site, z.limit, z.CountStatus, z.Settle)
	var table *llmprice.Table
	if z.PriceTable != "" {
		var err error
		if table, err = llmprice.Load(z.PriceTable); err != nil {
			return fmt.Errorf("zone %s: price_table: %w", z.Name, err)
		}
	}
	if z.units.priceBy(z.Name, z.Prices, table, logger) {
		// µ$ are not tokens: a zone that starts or stops pricing on a
		// reload starts its clients over rather than read one as the other.
		z.identity += ":" + unitUSDMicros
	}
	if z.Period != "" {
		// Each period is a state of its own, named by its start.
		z.identity += ":" + z.Period
		z.period = newPeriod(z.Period, loc, z.identity)
	}
	z.key = clientkey.Parse(z.Key)
	for _, name := range z.key.PlaceholderNames() {
		if !clientkey.KnownPlaceholder(name) {
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
		checkWindowOrPeriod(time.Duration(z.Window), z.Period),
		checkPeriod(z.Period, z.TimeZone, time.Duration(z.Window), z.Algorithm, time.Duration(z.Wait)),
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
		checkCostLLM(z.CostLLM, z.Cost, z.CostJSON != nil),
		checkCostLLMFits(z.CostLLM, z.MaxRequests, z.MaxRequestsFrom),
		checkCeilingModel(z.CostLLM, z.PriceTable),
		checkWait(time.Duration(z.Wait), time.Duration(z.Window), z.Algorithm),
		checkPrices(z.Prices),
		checkPricesSettled(z.priced(), z.CostLLM != nil, z.Settle != nil && z.Settle.LLM),
		checkWarnPercent(z.WarnPercent),
		checkZoneMode(z.Mode, time.Duration(z.Wait)),
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
	if z.Period != "" {
		set = append(set, "period")
	}
	if z.TimeZone != "" {
		set = append(set, "time_zone")
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
	if z.CostLLM != nil {
		set = append(set, "cost_llm")
	}
	if z.Prices != nil {
		set = append(set, "prices")
	}
	if z.PriceTable != "" {
		set = append(set, "price_table")
	}
	if z.WarnPercent != 0 {
		set = append(set, "warn")
	}
	if z.Mode == modeReport {
		set = append(set, "mode report")
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
	for _, result := range []string{resultAllowed, resultDenied, resultFailedOpen, resultFailedClosed, resultLocalAllowed, resultLocalDenied, resultReportDenied} {
		z.decisions[result] = limiterMetrics.decisions.WithLabelValues(z.Name, result)
	}
	z.cacheHits = limiterMetrics.denyCacheHits.WithLabelValues(z.Name)
	z.softReached = limiterMetrics.softLimitsReached.WithLabelValues(z.Name)
	z.fallbacks.counter = limiterMetrics.keyFallbacks.WithLabelValues(z.Name)
}

// zoneIdentity names a zone's state in Redis keys and deny caches: what
// makes it a different state, never the numbers each call gives the engine
// (limiter.Check's Limit). That is its name, for an unnamed zone (the
// three-line form) "@" and its site (see implicitSite), for the counter
// ":counter:" and its window (its fixed windows are cut by it), then what
// its count_status counts and what it settles to, as in "api",
// "default@example.com", "api:counter:1h", "login:401,4xx" or
// "downloads:bytes"; a concurrency zone's is its name and ":concurrent", as
// in "reports:concurrent".
//
// So a reload that changes max_requests, or a log zone's window, keeps
// every client's count, and the engine decides each call with its own max:
// lowered during an attack, a client above the new max is denied until
// enough ages out, where a new state would hand everyone a fresh budget. A
// tenant's quota from a placeholder is the same case. Changing a zone's
// name, algorithm, count_status or settle, a counter zone's window, or an
// unnamed zone's site starts its clients over, as a new state should.
// Handlers share a zone's counts exactly when their zones have the same
// identity (and the same Redis and key prefix): the instances of one site,
// and sites that name one zone alike on purpose, each deciding with its own
// max_requests.
func zoneIdentity(name, site string, limit limiter.Limit, countStatus []int, settle *Settle) string {
	var b strings.Builder
	b.WriteString(name)
	if site != "" {
		b.WriteByte('@')
		b.WriteString(site)
	}
	if limit.Algorithm == limiter.Concurrency {
		// Leases are counted against each call's Max, and the lease time
		// is not part of the state either, so instances with different
		// lease times share its slots.
		b.WriteString(":concurrent")
		return b.String()
	}
	if limit.Algorithm == limiter.SlidingCounter {
		b.WriteString(":counter:")
		b.WriteString(formatWindow(limit.Window))
	}
	for i, status := range countStatus {
		if i == 0 {
			b.WriteByte(':')
		} else {
			b.WriteByte(',')
		}
		b.WriteString(strconv.Itoa(status))
		if status < 10 {
			b.WriteString("xx")
		}
	}
	switch {
	case settle == nil:
	case settle.Bytes:
		b.WriteString(":bytes")
	case len(settle.JSON) > 0:
		b.WriteString(":json-" + strings.Join(settle.JSON, ","))
	case settle.LLM:
		b.WriteString(":llm")
	default:
		b.WriteString(":header-" + strings.ToLower(settle.Header))
	}
	return b.String()
}
