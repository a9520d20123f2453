package limiter_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/slidingratelimit/caddy-sliding-ratelimit/internal/redistest"
	"github.com/slidingratelimit/caddy-sliding-ratelimit/limiter"
)

// TestBadInput: checks no store can decide are refused, by every method of
// every store, with an error that names the check and what is wrong, and
// never reach the engine; edge cases that are not errors get their answer.
func TestBadInput(t *testing.T) {
	mem, red := bothStores(t)
	stores := map[string]limiter.Store{"memory": mem, "redis": red, "deny cache": limiter.NewDenyCache(red, 0)}

	good := limiter.Check{Zone: "good", Key: "k", Limit: limiter.Limit{Window: time.Minute, Max: 10}}
	for _, c := range []struct {
		name string
		bad  func(c *limiter.Check)
		want string
	}{
		{"negative cost", func(c *limiter.Check) { c.Cost = -1 }, "cost -1 is negative"},
		{"cost beyond 2^53", func(c *limiter.Check) { c.Cost = 1<<53 + 1 }, "cost 9007199254740993 is above 2^53"},
		{"negative max", func(c *limiter.Check) { c.Limit.Max = -1 }, "max -1 is negative"},
		{"max beyond 2^48", func(c *limiter.Check) { c.Limit.Max = 1 << 48 }, "max 281474976710656 is above 2^48-1"},
		{"no window", func(c *limiter.Check) { c.Limit.Window = 0 }, "window 0s is shorter than a microsecond"},
		{"window of nanoseconds", func(c *limiter.Check) { c.Limit.Window = 999 }, "window 999ns is shorter than a microsecond"},
		{"window beyond two years", func(c *limiter.Check) { c.Limit.Window = 3 * 365 * 24 * time.Hour }, "window 26280h0m0s is longer than 17520h0m0s"},
		{"negative wait", func(c *limiter.Check) { c.Wait = -time.Second }, "wait -1s is negative"},
		{"wait beyond its windows", func(c *limiter.Check) { c.Wait = 16*time.Minute + time.Microsecond }, "wait 16m0.000001s is longer than 16 windows of 1m0s, or two years"},
		{"wait on a counter", func(c *limiter.Check) {
			c.Limit.Algorithm, c.Wait = limiter.SlidingCounter, time.Second
		}, "a counter zone takes no wait (wait 1s)"},
		{"wait on leases", func(c *limiter.Check) {
			c.Limit.Algorithm, c.Wait = limiter.Concurrency, time.Second
		}, "a concurrency zone takes no wait (wait 1s)"},
		{"cost of a lease", func(c *limiter.Check) {
			c.Limit.Algorithm, c.Cost = limiter.Concurrency, 2
		}, "a concurrency zone counts requests: cost 2, want 0 or 1"},
		{"unknown algorithm", func(c *limiter.Check) { c.Limit.Algorithm = 9 }, "unknown algorithm 9"},
	} {
		t.Run(c.name, func(t *testing.T) {
			bad := good
			bad.Zone = "bad"
			c.bad(&bad)
			for name, s := range stores {
				for method, call := range map[string]func(context.Context, []limiter.Check, []limiter.Decision) error{
					"Allow": s.Allow, "Peek": s.Peek, "Settle": s.Settle, "Extend": s.Extend,
				} {
					ds := make([]limiter.Decision, 2)
					err := call(context.Background(), []limiter.Check{good, bad}, ds)
					if err == nil || !strings.Contains(err.Error(), `check 1 (zone "bad"): `+c.want) {
						t.Errorf("%s %s: %v, want an error naming check 1 and %q", name, method, err, c.want)
					}
				}
			}
		})
	}
	t.Run("decisions of another length", func(t *testing.T) {
		for name, s := range stores {
			if err := s.Allow(context.Background(), []limiter.Check{good}, make([]limiter.Decision, 2)); err == nil || !strings.Contains(err.Error(), "2 decisions for 1 checks") {
				t.Errorf("%s: %v, want an error", name, err)
			}
		}
	})

	// Not errors: each has its answer.
	for _, c := range []struct {
		name  string
		check func(c *limiter.Check)
		ok    func(d limiter.Decision) bool
	}{
		{"cost 0 means 1", func(c *limiter.Check) {}, func(d limiter.Decision) bool { return d.Allowed && d.Remaining == 9 }},
		{"cost above max", func(c *limiter.Check) { c.Cost = 11 }, func(d limiter.Decision) bool { return d.Never && !d.Allowed && d.RetryAfter == 0 }},
		{"cost of 2^53", func(c *limiter.Check) { c.Cost = 1 << 53 }, func(d limiter.Decision) bool { return d.Never }},
		{"max 0", func(c *limiter.Check) { c.Limit.Max = 0 }, func(d limiter.Decision) bool { return d.Never && d.Remaining == 0 }},
		{"max 0 of leases", func(c *limiter.Check) { c.Limit.Max, c.Limit.Algorithm = 0, limiter.Concurrency }, func(d limiter.Decision) bool { return d.Never }},
		{"a wait of many windows", func(c *limiter.Check) { c.Wait = limiter.MaxWaitWindows * time.Minute }, func(d limiter.Decision) bool { return d.Allowed && d.Delay == 0 }},
	} {
		t.Run(c.name, func(t *testing.T) {
			for name, s := range stores {
				ch := good
				ch.Key = name + " " + c.name
				c.check(&ch)
				ds := make([]limiter.Decision, 1)
				if err := s.Allow(context.Background(), []limiter.Check{ch}, ds); err != nil || !c.ok(ds[0]) {
					t.Errorf("%s: %+v, %v", name, ds[0], err)
				}
			}
		})
	}
}

// bothStores returns an in-process store and a store on a Redis of the
// test's own, both closed when it ends.
func bothStores(t *testing.T) (*limiter.MemoryStore, *limiter.RedisStore) {
	srv := redistest.Start(t)
	client := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	t.Cleanup(func() { client.Close() })
	mem := limiter.NewMemoryStore()
	t.Cleanup(func() { mem.Close() })
	red := limiter.NewRedisStore(client, limiter.RedisOptions{Timeout: 5 * time.Second})
	t.Cleanup(func() { red.Close() })
	return mem, red
}
