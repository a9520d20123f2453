package limiter_test

import (
	"context"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/slidingratelimit/caddy-sliding-ratelimit/internal/redistest"
	"github.com/slidingratelimit/caddy-sliding-ratelimit/limiter"
)

// TestHotKey: one key under concurrent load from two instances, with a large
// Max and a short window (`key global`, window 1s, max 1,000,000): no
// decision fails, the ring is copied only as it doubles (a call that copied
// or rebuilt it each time would stall Redis for every caller), and the
// key's memory follows the admissions in its window: the ring holds at most
// twice the most admitted in a second, and shrinks once the load is gone.
// How long each call takes is the benchmark's to say (the one bot
// scenario): SLOWLOG measures wall time, which a busy host stretches.
func TestHotKey(t *testing.T) {
	if testing.Short() {
		t.Skip("seconds of load; skipped in -short mode")
	}
	srv := redistest.Start(t)
	ctx := context.Background()
	admin := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	t.Cleanup(func() { admin.Close() })
	if err := admin.ConfigSet(ctx, "slowlog-log-slower-than", "10000").Err(); err != nil {
		t.Fatal(err)
	}
	var stores []*limiter.RedisStore
	for range 2 {
		client := redis.NewClient(&redis.Options{Addr: srv.Addr(), ContextTimeoutEnabled: true})
		t.Cleanup(func() { client.Close() })
		s := limiter.NewRedisStore(client, limiter.RedisOptions{Timeout: time.Second})
		t.Cleanup(func() { s.Close() })
		stores = append(stores, s)
	}
	check := limiter.Check{Zone: "global", Key: "global", Limit: limiter.Limit{Window: time.Second, Max: 1_000_000}}
	key := stores[0].Key(check.Zone, check.Key)
	copies := commandCalls(t, admin, "bitop")
	for _, e := range hotKeyLoad(t, admin, stores, check, key) {
		t.Logf("a call of %v, over 10ms (the host's or the engine's; the benchmark measures): %.60q", e.Duration, e.Args)
	}
	// From the small ring to about a thousand slots: some doublings, each
	// one copy; a copy per call would be tens of thousands.
	copies = commandCalls(t, admin, "bitop") - copies
	t.Logf("the ring was copied %d times", copies)
	if copies == 0 || copies > 12 {
		t.Errorf("the ring was copied %d times under load, want once per doubling: a few times, and not none", copies)
	}

	// The load is gone: after a window, the ring halves at each admission
	// while it is more than three quarters free.
	time.Sleep(1100 * time.Millisecond)
	for range 20 {
		if err := stores[0].Allow(ctx, []limiter.Check{check}, make([]limiter.Decision, 1)); err != nil {
			t.Fatal(err)
		}
	}
	if size, err := admin.StrLen(ctx, key).Result(); err != nil || size > 24+6*128 {
		t.Errorf("after the load, with 20 admissions in the window: the ring is %d bytes (%v), want at most %d", size, err, 24+6*128)
	}
}

// hotKeyLoad loads key for four seconds from 8 callers on each store, checks
// that no decision failed and that the ring holds at most twice the most
// admissions in a second, and returns what SLOWLOG holds.
func hotKeyLoad(t *testing.T, admin *redis.Client, stores []*limiter.RedisStore, check limiter.Check, key string) []redis.SlowLog {
	t.Helper()
	ctx := context.Background()
	if err := admin.SlowLogReset(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	// Admissions per tenth of a second, from the callers' clocks.
	start := time.Now()
	var tenths [40]atomic.Int64
	var failed atomic.Int64
	var wg sync.WaitGroup
	for _, s := range stores {
		for range 8 {
			wg.Go(func() {
				ds := make([]limiter.Decision, 1)
				for {
					i := int(time.Since(start) / (100 * time.Millisecond))
					if i >= len(tenths) {
						return
					}
					if err := s.Allow(ctx, []limiter.Check{check}, ds); err != nil {
						failed.Add(1)
						continue
					}
					if ds[0].Allowed {
						tenths[i].Add(1)
					}
				}
			})
		}
	}
	wg.Wait()
	var total, peak int64
	for i := range tenths {
		total += tenths[i].Load()
		var second int64
		for j := max(0, i-9); j <= i; j++ {
			second += tenths[j].Load()
		}
		peak = max(peak, second)
	}
	size, err := admin.StrLen(ctx, key).Result()
	if err != nil {
		t.Fatal(err)
	}
	slow, err := admin.SlowLogGet(ctx, 10).Result()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%d admissions in %v, at most %d in a second; the ring is %d bytes (%d slots); %d failed decisions; %d slow calls",
		total, time.Since(start).Round(time.Millisecond), peak, size, (size-24)/6, failed.Load(), len(slow))
	if failed.Load() != 0 {
		t.Errorf("%d decisions failed under load", failed.Load())
	}
	// Twice for the doubling, and a fifth for the callers' clocks.
	if bound := 24 + 6*2*(peak+peak/5); size > bound {
		t.Errorf("the ring is %d bytes, want at most %d: twice the most admissions in a second", size, bound)
	}
	return slow
}

// commandCalls returns how many times Redis ran the command, from scripts
// too (INFO commandstats).
func commandCalls(t *testing.T, admin *redis.Client, command string) int64 {
	t.Helper()
	info, err := admin.Info(context.Background(), "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.SplitSeq(info, "\n") {
		if rest, ok := strings.CutPrefix(strings.TrimSpace(line), "cmdstat_"+command+":calls="); ok {
			n, _ := strconv.ParseInt(rest[:strings.IndexByte(rest+",", ',')], 10, 64)
			return n
		}
	}
	return 0
}
