package redisconn

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/slidingratelimit/caddy-sliding-ratelimit/internal/redistest"
	"github.com/slidingratelimit/caddy-sliding-ratelimit/limiter"
)

// TestMemoryWarning: every policy that evicts is a warning that says which
// clients it lets through first and what keeps limits (noeviction, and
// memory); noeviction, and a Redis without maxmemory, are none.
func TestMemoryWarning(t *testing.T) {
	for _, c := range []struct {
		policy    string
		maxmemory int64
		says      string
	}{
		{"noeviction", 50 << 20, ""},
		{"noeviction", 0, ""},
		{"allkeys-lru", 0, ""},
		{"volatile-ttl", 0, ""},
		{"volatile-ttl", 50 << 20, "nearest to expiry first, and a client at its limit has one of them"},
		{"allkeys-lru", 50 << 20, "least recently used keys first, and a client at its limit has one of them"},
		{"volatile-lru", 50 << 20, "least recently used keys first, and a client at its limit has one of them"},
		{"allkeys-lfu", 50 << 20, "least frequently used keys first"},
		{"volatile-lfu", 50 << 20, "least frequently used keys first"},
		{"allkeys-random", 50 << 20, "at random"},
		{"volatile-random", 50 << 20, "at random"},
	} {
		t.Run(c.policy+"/"+strconv.FormatInt(c.maxmemory, 10), func(t *testing.T) {
			got := MemoryWarning(c.maxmemory, c.policy)
			if c.says == "" {
				if got != "" {
					t.Errorf("warning %q, want none", got)
				}
				return
			}
			for _, want := range []string{"(maxmemory-policy " + c.policy + ")", c.says,
				"restarts a client's limit", "set maxmemory-policy noeviction", "memory of every client active in a window"} {
				if !strings.Contains(got, want) {
					t.Errorf("warning %q does not say %q", got, want)
				}
			}
		})
	}
}

// TestEvictingPoliciesLetBlockedClientsThroughFirst shows what
// MemoryWarning says, on a real Redis that is full: under volatile-ttl the
// first key evicted is that of the client at its limit, though it goes on
// asking Redis (a denial writes nothing, so its key is the nearest to
// expiry), and under volatile-lru (as allkeys-lru) while the deny cache
// answers it (its key is the least recently used); either way its limit restarts and it is
// admitted again, while clients that were admitted since keep their count.
func TestEvictingPoliciesLetBlockedClientsThroughFirst(t *testing.T) {
	for _, c := range []struct {
		policy string
		// asksRedis: the blocked client's denials come from Redis, not
		// from a deny cache.
		asksRedis bool
	}{
		{"volatile-ttl", true},
		{"volatile-lru", false},
	} {
		t.Run(c.policy, func(t *testing.T) {
			srv := redistest.Start(t)
			rc := srv.Client(t)
			ctx := context.Background()
			store := limiter.NewRedisStore(rc, limiter.RedisOptions{KeyPrefix: "evict:", Timeout: 5 * time.Second})
			t.Cleanup(func() { store.Close() })
			limit := limiter.Limit{Window: time.Minute, Max: 3}
			allow := func(key string) bool {
				t.Helper()
				d := make([]limiter.Decision, 1)
				if err := store.Allow(ctx, []limiter.Check{{Zone: "z", Key: key, Limit: limit}}, d); err != nil {
					t.Fatalf("allow %s: %v", key, err)
				}
				return d[0].Allowed
			}
			for i, want := range []bool{true, true, true, false} {
				if got := allow("blocked"); got != want {
					t.Fatalf("blocked client's request %d: allowed %v, want %v", i+1, got, want)
				}
			}
			// Redis's LRU clock ticks once a second.
			time.Sleep(2100 * time.Millisecond)
			const active = 20
			for i := range active {
				if !allow(fmt.Sprintf("active-%d", i)) {
					t.Fatalf("active client %d denied", i)
				}
			}
			if c.asksRedis && allow("blocked") {
				t.Fatal("blocked client admitted")
			}

			// Full: other data (no TTL, written last) takes what is left,
			// a small value at a time, until the first eviction. Only the
			// limiter's keys have a TTL: fewer than Redis samples, so its
			// choice among them is exact (an allkeys-* policy chooses the
			// same way among a sample of every key).
			used := infoInt(t, rc, "memory", "used_memory")
			for _, kv := range [][2]string{{"maxmemory-samples", "64"}, {"maxmemory-policy", c.policy},
				{"maxmemory", strconv.FormatInt(used+64<<10, 10)}} {
				if err := rc.ConfigSet(ctx, kv[0], kv[1]).Err(); err != nil {
					t.Fatal(err)
				}
			}
			for i := 0; infoInt(t, rc, "stats", "evicted_keys") == 0; i++ {
				if i > 10_000 {
					t.Fatal("redis evicted nothing")
				}
				if err := rc.Set(ctx, "other:"+strconv.Itoa(i), strings.Repeat("v", 100), 0).Err(); err != nil {
					t.Fatalf("filling redis: %v", err)
				}
			}
			// Room again, so that what follows evicts nothing more: Redis
			// goes on evicting in the background while it is over.
			if err := rc.ConfigSet(ctx, "maxmemory", "0").Err(); err != nil {
				t.Fatal(err)
			}
			evicted := infoInt(t, rc, "stats", "evicted_keys")
			if evicted > active/2 {
				t.Fatalf("%d keys evicted: too many to tell which went first", evicted)
			}
			kept := func(pattern string) int {
				keys, err := rc.Keys(ctx, "evict:*"+pattern+"*").Result()
				if err != nil {
					t.Fatal(err)
				}
				return len(keys)
			}
			t.Logf("first eviction: %d keys evicted, blocked client's key kept: %d, active clients' kept: %d of %d",
				evicted, kept("blocked"), kept("active-"), active)
			if kept("blocked") != 0 {
				t.Errorf("the blocked client's key was kept, and %d of the %d active clients' evicted", active-kept("active-"), active)
			} else if !allow("blocked") {
				t.Error("the blocked client, its key evicted, is still denied: want its limit restarted")
			}
		})
	}
}

// infoInt is the integer field of section of c's INFO.
func infoInt(t *testing.T, c redis.Cmdable, section, field string) int64 {
	t.Helper()
	info, err := c.Info(context.Background(), section).Result()
	if err != nil {
		t.Fatal(err)
	}
	v, _ := infoValue(info, field)
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil {
		t.Fatalf("INFO %s %s %q: %v", section, field, v, err)
	}
	return n
}
