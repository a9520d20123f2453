package slidingratelimit

import (
	"errors"
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/slidingratelimit/caddy-sliding-ratelimit/internal/redisconn"
)

// Decision results, the values of the result label.
const (
	resultAllowed      = "allowed"
	resultDenied       = "denied"
	resultFailedOpen   = "failed_open"
	resultFailedClosed = "failed_closed"
	resultLocalAllowed = "local_allowed"
	resultLocalDenied  = "local_denied"
	// resultReportDenied: a zone in mode report would have denied the
	// request; it went on, and the zone did not count it.
	resultReportDenied = "report_denied"
)

// Store error reasons, the values of the reason label of store_errors_total.
const (
	// reasonOOM: Redis refused a call for lack of memory (maxmemory reached
	// with maxmemory-policy noeviction).
	reasonOOM = "oom"
	// reasonDataLost: a running request's lease was gone from the store
	// before its lease time: the store lost its data (a restart without
	// persistence, a FLUSHALL, an eviction).
	reasonDataLost = "data_lost"
)

// limiterMetrics are process-wide collectors, created once and registered on
// each config's registry, so counts survive config reloads. No label holds a
// client key: that would let clients grow the series without bound.
var limiterMetrics struct {
	once          sync.Once
	decisions     *prometheus.CounterVec
	denyCacheHits *prometheus.CounterVec
	keyFallbacks  *prometheus.CounterVec
	redisDuration prometheus.Histogram
	// Waits and leases: see wait.go and lease.go.
	waitSeconds    *prometheus.HistogramVec
	waitsAbandoned *prometheus.CounterVec
	waitRoomFull   prometheus.Counter
	waiting        prometheus.Gauge
	leasesInUse    *prometheus.GaugeVec
	leasesLost     *prometheus.CounterVec
	// Zones with a cost, a quota or a settle: see units.go.
	unitsAdmitted   *prometheus.CounterVec
	costFallbacks   *prometheus.CounterVec
	quotaFallbacks  *prometheus.CounterVec
	settleFallbacks *prometheus.CounterVec
	// Priced zones: see price.go.
	spentMicros    *prometheus.CounterVec
	unpricedModels *prometheus.CounterVec
	unpricedUsage  *prometheus.CounterVec
	// bodyRefusals counts requests refused before the upstream because
	// their body could not be priced (units.go).
	bodyRefusals *prometheus.CounterVec
	// circuitState is the connections' (see redisconn.CircuitState).
	circuitState *prometheus.GaugeVec
	// evictedKeys is the connections' (see redisconn.EvictedKeys).
	evictedKeys *prometheus.CounterVec
	// storeErrors counts store errors that have a reason of their own (see
	// backend.go and lease.go).
	storeErrors *prometheus.CounterVec
	// softLimitsReached: see softlimit.go.
	softLimitsReached *prometheus.CounterVec
	// configWarnings: see warnings.go.
	configWarnings prometheus.Gauge
}

func initMetrics(registry *prometheus.Registry) error {
	const ns, sub = "caddy", "sliding_ratelimit"
	m := &limiterMetrics
	// perZone is a counter with the zone label alone.
	perZone := func(name, help string) *prometheus.CounterVec {
		return prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: name, Help: help}, []string{"zone"})
	}
	m.once.Do(func() {
		m.decisions = prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ns, Subsystem: sub, Name: "decisions_total",
			Help: "Rate-limit decisions by zone and result (allowed, denied, failed_open, failed_closed, and local_allowed and local_denied by the in-process store while Redis fails with fail_mode local; report_denied: a zone in mode report would have denied the request, which went on).",
		}, []string{"zone", "result"})
		m.denyCacheHits = perZone("deny_cache_hits_total",
			"Denials answered by the local deny cache without a Redis call.")
		m.keyFallbacks = perZone("key_fallbacks_total",
			"Requests whose key template expanded to nothing, so that they were keyed by client address.")
		m.redisDuration = prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: ns, Subsystem: sub, Name: "redis_duration_seconds",
			Help:    "Time of one rate-limit decision by Redis, errors included.",
			Buckets: []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25},
		})
		m.circuitState = redisconn.CircuitState()
		m.evictedKeys = redisconn.EvictedKeys()
		m.waitSeconds = prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: ns, Subsystem: sub, Name: "wait_seconds",
			Help:    "How long admitted requests were held for their slot (wait), by the zone with the least room left; its count is the requests that waited.",
			Buckets: []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60},
		}, []string{"zone"})
		m.waitsAbandoned = perZone("waits_abandoned_total",
			"Held requests whose client went away before their slot: their admissions were given back.")
		m.waitRoomFull = prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: ns, Subsystem: sub, Name: "wait_room_full_total",
			Help: "Requests decided without a wait because their handler held max_waiting requests already.",
		})
		m.waiting = prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: ns, Subsystem: sub, Name: "waiting",
			Help: "Requests held for their slot now, or being decided with a wait, on this instance.",
		})
		m.leasesInUse = prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: ns, Subsystem: sub, Name: "leases_in_use",
			Help: "Leases of concurrency zones that requests running on this instance hold.",
		}, []string{"zone"})
		m.leasesLost = perZone("leases_lost_total",
			"Leases of running requests that expired before they could be extended.")
		m.unitsAdmitted = perZone("units_total",
			"Units admitted by zones with a cost, a per-tenant max_requests or a settle: each admitted request's final cost (its reservation, or what it settled to). In other zones a request is one unit: see decisions_total.")
		m.costFallbacks = perZone("cost_fallbacks_total",
			"Requests whose cost placeholder gave no whole number of at least 1, so that they reserved 1; of cost json, that found no usable body and reserved the default; of cost llm, calls it could not bound, which reserved the zone's ceiling.")
		m.quotaFallbacks = perZone("max_requests_fallbacks_total",
			"Requests whose max_requests placeholder gave no whole number from 1 to 2^48-1, so that the zone's fallback max_requests applied.")
		m.settleFallbacks = perZone("settle_fallbacks_total",
			"Responses whose settle header or trailer held no whole number, so that the request's reservation stood.")
		m.spentMicros = perZone("spent_usd_micros_total",
			"Millionths of a US dollar spent in zones with prices: each admitted call's final cost (what its usage settled to, or its reservation when it reported none). Also in units_total.")
		m.unpricedModels = perZone("unpriced_model_calls_total",
			"Calls of zones with prices whose model no price line matched, so that they were priced at the dearest price of each kind listed.")
		m.unpricedUsage = prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ns, Subsystem: sub, Name: "unpriced_usage_total",
			Help: "Calls of zones with prices that reported usage their model's prices do not price, by kind (a dimension: audio_input, audio_output, cache_write, cache_write_1h, ...; service_tier, a tier not priced; web_search, a search fee not listed): charged at the model's dearest rate (a search at the dearest fee listed).",
		}, []string{"zone", "kind"})
		m.bodyRefusals = prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ns, Subsystem: sub, Name: "body_refusals_total",
			Help: "Requests of zones with cost json or cost llm refused before they reached the next handler, by reason: slow (408, the body did not arrive whole in time), not_json (400, cost llm could not read the body as one JSON value), unbounded (400, cost llm could not bound what the call may spend: input by reference, a hosted tool, a field, part type or path it does not know; a zone with a ceiling reserves it instead).",
		}, []string{"zone", "reason"})
		m.storeErrors = prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ns, Subsystem: sub, Name: "store_errors_total",
			Help: "Store errors by reason: oom (Redis refused a call for lack of memory, maxmemory reached with noeviction: the fail mode applied), data_lost (a running request's lease was gone from Redis before its lease time: Redis lost its data, by a restart, a FLUSHALL or an eviction).",
		}, []string{"reason"})
		m.softLimitsReached = perZone("soft_limit_reached_total",
			"Admitted requests that took their client's use of a zone with warn from below its share of max_requests to at or above it: one per client each time it reaches the share.")
		m.configWarnings = prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: ns, Subsystem: sub, Name: "config_warnings",
			Help: "Warnings the handlers of the running config logged while they were provisioned (during a reload, of both configs).",
		})
	})
	if registry == nil {
		return nil
	}
	for _, c := range []prometheus.Collector{m.decisions, m.denyCacheHits, m.keyFallbacks, m.redisDuration, m.circuitState,
		m.waitSeconds, m.waitsAbandoned, m.waitRoomFull, m.waiting, m.leasesInUse, m.leasesLost,
		m.unitsAdmitted, m.costFallbacks, m.quotaFallbacks, m.settleFallbacks, m.bodyRefusals, m.storeErrors, m.configWarnings,
		m.evictedKeys, m.spentMicros, m.unpricedModels, m.unpricedUsage, m.softLimitsReached} {
		if err := registry.Register(c); err != nil {
			var already prometheus.AlreadyRegisteredError
			if !errors.As(err, &already) {
				return err
			}
		}
	}
	return nil
}
