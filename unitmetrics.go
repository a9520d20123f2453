package slidingratelimit

import (
	"errors"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
)

// unitMetrics are the collectors of zones with a cost, a quota or a settle,
// process-wide as limiterMetrics are. No label holds a client key.
var unitMetrics struct {
	once            sync.Once
	admitted        *prometheus.CounterVec
	costFallbacks   *prometheus.CounterVec
	quotaFallbacks  *prometheus.CounterVec
	settleFallbacks *prometheus.CounterVec
}

func initUnitMetrics(registry *prometheus.Registry) error {
	const ns, sub = "caddy", "sliding_ratelimit"
	m := &unitMetrics
	m.once.Do(func() {
		m.admitted = prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ns, Subsystem: sub, Name: "units_total",
			Help: "Units admitted by zones with a cost, a per-tenant max_requests or a settle: each admitted request's final cost (its reservation, or what it settled to). In other zones a request is one unit: see decisions_total.",
		}, []string{"zone"})
		m.costFallbacks = prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ns, Subsystem: sub, Name: "cost_fallbacks_total",
			Help: "Requests whose cost placeholder gave no whole number of at least 1, so that they reserved 1.",
		}, []string{"zone"})
		m.quotaFallbacks = prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ns, Subsystem: sub, Name: "max_requests_fallbacks_total",
			Help: "Requests whose max_requests placeholder gave no whole number from 1 to 2^48-1, so that the zone's fallback max_requests applied.",
		}, []string{"zone"})
		m.settleFallbacks = prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ns, Subsystem: sub, Name: "settle_fallbacks_total",
			Help: "Responses whose settle header or trailer held no whole number, so that the request's reservation stood.",
		}, []string{"zone"})
	})
	if registry == nil {
		return nil
	}
	for _, c := range []prometheus.Collector{m.admitted, m.costFallbacks, m.quotaFallbacks, m.settleFallbacks} {
		if err := registry.Register(c); err != nil {
			var already prometheus.AlreadyRegisteredError
			if !errors.As(err, &already) {
				return err
			}
		}
	}
	return nil
}
