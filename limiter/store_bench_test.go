package limiter_test

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/slidingratelimit/caddy-sliding-ratelimit/internal/redistest"
	"github.com/slidingratelimit/caddy-sliding-ratelimit/limiter"
)

// BenchmarkStoreCallers decides through one RedisStore from 32 concurrent
// callers, as under load, over 10,000 clients: it reports the batches the
// store makes (decisions per script call), the callers' own CPU per decision
// (this process: packing, decoding, waking the caller; Redis runs apart) and
// Redis's CPU per decision.
//
//	go test -run '^$' -bench StoreCallers -benchtime 1x ./limiter/
func BenchmarkStoreCallers(b *testing.B) {
	for _, max := range []int64{60, 1000} {
		b.Run(fmt.Sprint("max", max), func(b *testing.B) {
			for b.Loop() {
				storeCallers(b, max)
			}
		})
	}
}

func storeCallers(b *testing.B, max int64) {
	const (
		callers   = 32
		clients   = 10_000
		decisions = 60_000
	)
	srv := redistest.Start(b)
	client := redis.NewClient(&redis.Options{Addr: srv.Addr(), PoolSize: callers, ContextTimeoutEnabled: true})
	defer client.Close()
	s := limiter.NewRedisStore(client, limiter.RedisOptions{Timeout: 10 * time.Second})
	defer s.Close()
	ctx := context.Background()
	lim := limiter.Limit{Window: time.Minute, Max: max}
	keys := make([]string, clients)
	for i := range keys {
		keys[i] = "198.51." + strconv.Itoa(i>>8) + "." + strconv.Itoa(i&0xff)
	}
	if err := s.Allow(ctx, []limiter.Check{{Zone: "z", Key: "warmup", Limit: lim}}, make([]limiter.Decision, 1)); err != nil {
		b.Fatal(err)
	}
	if err := client.ConfigResetStat(ctx).Err(); err != nil {
		b.Fatal(err)
	}
	redisCPU := func() float64 {
		info, err := client.Info(ctx, "cpu").Result()
		if err != nil {
			b.Fatal(err)
		}
		var total float64
		for line := range strings.Lines(info) {
			k, v, _ := strings.Cut(strings.TrimSpace(line), ":")
			if k == "used_cpu_user" || k == "used_cpu_sys" {
				f, _ := strconv.ParseFloat(v, 64)
				total += f
			}
		}
		return total
	}
	selfCPU := func() time.Duration {
		var ru syscall.Rusage
		if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
			b.Fatal(err)
		}
		return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	redis0, self0, start := redisCPU(), selfCPU(), time.Now()
	var next atomic.Int64
	var wg sync.WaitGroup
	for range callers {
		wg.Go(func() {
			checks := []limiter.Check{{Zone: "z", Limit: lim}}
			ds := make([]limiter.Decision, 1)
			for {
				n := next.Add(1) - 1
				if n >= decisions {
					return
				}
				checks[0].Key = keys[n%clients]
				if err := s.Allow(ctx, checks, ds); err != nil || !ds[0].Allowed {
					b.Errorf("decision %d: %+v, %v", n, ds[0], err)
					return
				}
			}
		})
	}
	wg.Wait()
	elapsed, self, redisUsed := time.Since(start), selfCPU()-self0, redisCPU()-redis0
	info, err := client.Info(ctx, "commandstats").Result()
	if err != nil {
		b.Fatal(err)
	}
	var calls float64
	for line := range strings.Lines(info) {
		for _, cmd := range []string{"cmdstat_fcall:calls=", "cmdstat_evalsha:calls="} {
			if rest, ok := strings.CutPrefix(strings.TrimSpace(line), cmd); ok {
				n, _ := strconv.ParseFloat(rest[:strings.IndexByte(rest, ',')], 64)
				calls += n
			}
		}
	}
	b.ReportMetric(float64(decisions)/calls, "decisions/call")
	b.ReportMetric(float64(self.Microseconds())/decisions, "caller-cpu-µs/decision")
	b.ReportMetric(redisUsed*1e6/decisions, "redis-cpu-µs/decision")
	b.Logf("max %d: %d decisions from %d callers in %v: %.1f decisions per script call; callers' CPU %.2f µs/decision, Redis's %.2f µs/decision",
		max, decisions, callers, elapsed.Round(time.Millisecond), float64(decisions)/calls, float64(self.Microseconds())/decisions, redisUsed*1e6/decisions)
}
