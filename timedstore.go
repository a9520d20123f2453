package slidingratelimit

import (
	"context"
	"time"

	"github.com/slidingratelimit/caddy-sliding-ratelimit/limiter"
)

// timedStore observes how long each Redis decision takes, errors included.
type timedStore struct{ *limiter.RedisStore }

func (s timedStore) Allow(ctx context.Context, checks []limiter.Check, decisions []limiter.Decision) error {
	start := time.Now()
	err := s.RedisStore.Allow(ctx, checks, decisions)
	limiterMetrics.redisDuration.Observe(time.Since(start).Seconds())
	return err
}
