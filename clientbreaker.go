package slidingratelimit

import (
	"github.com/caddyserver/caddy/v2"
	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"

	"github.com/slidingratelimit/caddy-sliding-ratelimit/limiter"
)

// newClientBreaker returns the circuit breaker of one pooled Redis client,
// shared by every handler on it: they all fail together when that Redis does,
// so they open, probe and close together, each state change is logged once,
// and the circuit_state series of that Redis follows it. It logs with Caddy's
// default logger of the moment, since the client outlives the configs whose
// handlers use it (and their loggers).
func newClientBreaker(redisLabel string) *limiter.Breaker {
	gauge := limiterMetrics.circuitState.WithLabelValues(redisLabel)
	gauge.Set(float64(limiter.BreakerClosed))
	return limiter.NewBreaker(limiter.BreakerOptions{
		OnStateChange: func(from, to limiter.BreakerState) {
			gauge.Set(float64(to))
			logger := caddy.Log().Named("http.handlers.sliding_ratelimit")
			switch {
			case from == limiter.BreakerClosed:
				logger.Warn("redis failing: circuit breaker open, applying each handler's fail mode without calling redis",
					zap.String("redis", redisLabel))
			case to == limiter.BreakerClosed:
				logger.Info("redis answers again: circuit breaker closed", zap.String("redis", redisLabel))
			default:
				// Probes, several a second while Redis is away: the two
				// lines above tell the story.
				logger.Debug("circuit breaker state changed",
					zap.String("redis", redisLabel), zap.String("from", from.String()), zap.String("to", to.String()))
			}
		},
	})
}

// redisLabel names the Redis a client of the topology and URL talks to, for
// the circuit_state metric and the breaker's log lines: host:port only, never
// credentials, and for a cluster or sentinel the first address of the URL.
// The URL was checked at provision; a parse error yields "unknown".
func redisLabel(topology, rawURL string) string {
	var addr string
	switch topology {
	case "", topologyStandalone:
		if opts, err := redis.ParseURL(rawURL); err == nil {
			addr = opts.Addr
		}
	case topologyCluster:
		if opts, err := redis.ParseClusterURL(rawURL); err == nil && len(opts.Addrs) > 0 {
			addr = opts.Addrs[0]
		}
	case topologySentinel:
		if opts, err := redis.ParseFailoverURL(rawURL); err == nil && len(opts.SentinelAddrs) > 0 {
			addr = opts.SentinelAddrs[0]
		}
	}
	if addr == "" {
		return "unknown"
	}
	return addr
}
