package redisconn

import (
	"github.com/caddyserver/caddy/v2"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/slidingratelimit/caddy-sliding-ratelimit/limiter"
)

// circuitState is one series per connection (each has one breaker),
// labelled by the Redis it guards: host:port, never credentials.
var circuitState = prometheus.NewGaugeVec(prometheus.GaugeOpts{
	Namespace: "caddy", Subsystem: "sliding_ratelimit", Name: "circuit_state",
	Help: "State of the circuit breaker around each Redis: 0 closed, 1 open, 2 half-open.",
}, []string{"redis"})

// CircuitState is the circuit_state metric of every connection, for the
// caller to register on each config's metrics registry.
func CircuitState() *prometheus.GaugeVec { return circuitState }

// newBreaker returns the circuit breaker of one connection, shared by every
// handler on it: they all fail together when that Redis does, so they open,
// probe and close together, each state change is logged once, and the
// circuit_state series of that Redis follows it. It logs with Caddy's
// default logger of the moment, since the connection outlives the configs
// whose handlers use it (and their loggers).
func newBreaker(label string) *limiter.Breaker {
	gauge := circuitState.WithLabelValues(label)
	gauge.Set(float64(limiter.BreakerClosed))
	return limiter.NewBreaker(limiter.BreakerOptions{
		OnStateChange: func(from, to limiter.BreakerState) {
			gauge.Set(float64(to))
			logger := caddy.Log().Named("http.handlers.sliding_ratelimit")
			switch {
			case from == limiter.BreakerClosed:
				logger.Warn("redis failing: circuit breaker open, applying each handler's fail mode without calling redis",
					zap.String("redis", label))
			case to == limiter.BreakerClosed:
				logger.Info("redis answers again: circuit breaker closed", zap.String("redis", label))
			default:
				// Probes, several a second while Redis is away: the two
				// lines above tell the story.
				logger.Debug("circuit breaker state changed",
					zap.String("redis", label), zap.String("from", from.String()), zap.String("to", to.String()))
			}
		},
	})
}
