package limiter_test

import (
	"context"
	"testing"
	"time"

	"github.com/slidingratelimit/caddy-sliding-ratelimit/limiter"
)

// TestLargeUnitsAreExact: budgets and costs up to 2^48-1 (a quota of bytes,
// say) are kept to the unit by both algorithms, on both stores, settles
// included: the counter's hash holds them as text, which must keep every
// digit past 10^14.
func TestLargeUnitsAreExact(t *testing.T) {
	mem, red := bothStores(t)
	const max = 1<<48 - 1
	costs := []int64{100000000000003, 123456789012345}
	for name, s := range map[string]limiter.Store{"memory": mem, "redis": red} {
		for _, alg := range []limiter.Algorithm{limiter.SlidingLog, limiter.SlidingCounter} {
			ctx := context.Background()
			check := limiter.Check{Zone: "bytes", Key: name + alg.String(), Limit: limiter.Limit{Window: time.Hour, Max: max, Algorithm: alg}}
			left := int64(max)
			ds := make([]limiter.Decision, 1)
			for _, cost := range costs {
				check.Cost = cost
				if err := s.Allow(ctx, []limiter.Check{check}, ds); err != nil || !ds[0].Allowed {
					t.Fatalf("%s %s, cost %d: %+v, %v", name, alg, cost, ds[0], err)
				}
				if left -= cost; ds[0].Remaining != left {
					t.Errorf("%s %s, after cost %d: remaining %d, want %d", name, alg, cost, ds[0].Remaining, left)
				}
			}
			// The last admission really cost 2 more.
			check.Cost = costs[1] + 2
			if err := s.Settle(ctx, []limiter.Check{check}, ds); err != nil {
				t.Fatalf("%s %s: settle: %v", name, alg, err)
			}
			check.Cost = 1
			if err := s.Peek(ctx, []limiter.Check{check}, ds); err != nil {
				t.Fatal(err)
			}
			if want := left - 2; ds[0].Remaining != want {
				t.Errorf("%s %s, after settling 2 more: %d left, want %d", name, alg, ds[0].Remaining, want)
			}
		}
	}
}
