package main

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-redis/redis_rate/v10"
	"github.com/redis/go-redis/v9"
)

// The anchor peer is go-redis/redis_rate v10, the best known small Redis
// limiter in Go: GCRA, one EVALSHA per decision, approximate. The bench
// drives its Allow itself, against the same redis-server as the limited
// site, with that site's limit, the many clients key space and wrk's
// concurrency, so the Redis CPU per decision of the two compares like for
// like: what is left over is how each one talks to Redis.

// anchorLimit is the limited site's max_requests per minute.
var anchorLimit = redis_rate.PerMinute(limitedMax)

// anchorKeys is the number of clients, as in the many clients scenario.
const anchorKeys = 10000

// anchorResult is one run of the anchor.
type anchorResult struct {
	decisions, denied, errors int64
	duration                  time.Duration
	redis                     redisDelta
	cpu                       cpuUse
}

func (a anchorResult) rps() float64 {
	if a.duration <= 0 {
		return 0
	}
	return float64(a.decisions) / a.duration.Seconds()
}

// runAnchor calls Allow from `workers` goroutines for d, each on the next of
// anchorKeys keys, on a client with one connection per worker (as wrk keeps
// one connection per -c).
func runAnchor(ctx context.Context, redisAddr string, rc *redis.Client, meter *cpuMeter, workers int, d time.Duration) (anchorResult, error) {
	client := redis.NewClient(&redis.Options{Addr: redisAddr, PoolSize: workers, MinIdleConns: workers})
	defer client.Close()
	lim := redis_rate.NewLimiter(client)
	// Load the script before the measured time, as Caddy's warm-up does.
	if _, err := lim.Allow(ctx, "rr-warmup", anchorLimit); err != nil {
		return anchorResult{}, fmt.Errorf("redis_rate Allow: %w", err)
	}

	var res anchorResult
	before, err := readRedis(ctx, rc)
	if err != nil {
		return res, err
	}
	snap := meter.snap()
	var next, decisions, denied, failures atomic.Int64
	var firstErr error
	var once sync.Once
	runCtx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	start := time.Now()
	var wg sync.WaitGroup
	for w := 0; w < workers; w++ {
		wg.Go(func() {
			for runCtx.Err() == nil {
				key := "rr-" + strconv.FormatInt(next.Add(1)%anchorKeys, 10)
				r, err := lim.Allow(runCtx, key, anchorLimit)
				switch {
				case err != nil && runCtx.Err() != nil:
					return // the run ended mid-call
				case err != nil:
					failures.Add(1)
					once.Do(func() { firstErr = err })
				default:
					decisions.Add(1)
					if r.Allowed == 0 {
						denied.Add(1)
					}
				}
			}
		})
	}
	wg.Wait()
	res.duration = time.Since(start)
	res.cpu = meter.use(snap, meter.snap(), 0)
	after, err := readRedis(ctx, rc)
	if err != nil {
		return res, err
	}
	res.redis = after.sub(before)
	res.decisions, res.denied, res.errors = decisions.Load(), denied.Load(), failures.Load()
	if ctx.Err() != nil {
		return res, ctx.Err()
	}
	if res.decisions == 0 {
		return res, fmt.Errorf("redis_rate: no decision in %s (first error: %v)", d, firstErr)
	}
	return res, nil
}
