package limiter

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"
)

// TestMergedRingsStayBoundedAndExact: a client of a budget far above what it
// uses (10^9 units a window) makes 8,000 admissions of 1 to 3 units in 1.2
// windows, and one of a budget it uses up (8,000 a window) tries to; on Redis and in memory, every decision is held to an exact log
// that keeps every admission apart. A merged ring never admits what the exact
// one denies (never over the limit), denies what it admits only within the
// merge span (a merged entry leaves the window at most a span late), and
// stays within 16 KB in Redis, however many admissions the window holds.
func TestMergedRingsStayBoundedAndExact(t *testing.T) {
	const window = 3 * time.Second
	span := time.Duration(mergeSpan(window.Microseconds())) * time.Microsecond
	for _, budget := range []int64{1_000_000_000, 8_000} {
		for _, store := range []string{"redis", "memory"} {
			t.Run(fmt.Sprintf("max%d/%s", budget, store), func(t *testing.T) {
				now := int64(1_700_000_000_000_000)
				var s Store
				if store == "memory" {
					s = newMemoryStoreAt(func() int64 { return now })
				} else {
					r := newRedisStore(t, testClient, testPrefix(t))
					r.batch.now = func() int64 { return now }
					s = r
				}
				exact := newModel(false)
				exact.exact = true
				rng := rand.New(rand.NewPCG(uint64(budget), 3))
				c := Check{Zone: "bytes", Key: testKey(t), Limit: Limit{Window: window, Max: budget}}
				var admitted, early, biggest int
				for i := range 8_000 {
					now += rng.Int64N(900) // 8,000 in about 1.2 windows
					c.Cost = 1 + rng.Int64N(3)
					got := decide(t, clockedStore{s, &now}, false, c)[0]
					want := make([]Decision, 1)
					exact.decide(now, methodPeek, []Check{c}, want, []int{0}, 0)
					switch {
					case got.Allowed && !want[0].Allowed:
						t.Fatalf("admission %d at %d: merged admits %+v, exact denies %+v", i, now, exported(got), exported(want[0]))
					case !got.Allowed && want[0].Allowed:
						early++
						if got.RetryAfter > span {
							t.Fatalf("admission %d: denied for %v where the exact log admits, want at most the span %v", i, got.RetryAfter, span)
						}
					case !got.Allowed && (got.RetryAfter < want[0].RetryAfter || got.RetryAfter > want[0].RetryAfter+span):
						t.Fatalf("admission %d: retry after %v, exact %v: want at most a span (%v) later", i, got.RetryAfter, want[0].RetryAfter, span)
					}
					if got.Allowed {
						admitted++
						exact.decide(now, methodAllow, []Check{c}, want, []int{0}, 0)
					}
					if r, ok := s.(*RedisStore); ok && i%500 == 0 {
						biggest = max(biggest, readRing(t, testClient, r.Key(c.Zone, c.Key), now).bytes)
					}
				}
				t.Logf("%d admitted, %d denied early (within the span %v); largest ring %d bytes", admitted, early, span, biggest)
				if r, ok := s.(*RedisStore); ok {
					ring := readRing(t, testClient, r.Key(c.Zone, c.Key), now)
					t.Logf("ring: %d entries for the window, cap %d, %d bytes", len(ring.times), ring.cap, ring.bytes)
					if biggest > 16<<10 || ring.bytes > 16<<10 {
						t.Errorf("a ring of %d bytes, want at most 16 KB", biggest)
					}
				}
				if budget == 8_000 && admitted == 8_000 {
					t.Error("the budget was never reached: the test would not cross a denial")
				}
			})
		}
	}
}
