package limiter_test

import (
	"context"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/slidingratelimit/caddy-sliding-ratelimit/internal/redistest"
	"github.com/slidingratelimit/caddy-sliding-ratelimit/limiter"
)

// A client may make 2 requests a minute: the third is denied, with the
// exact wait. The store batches concurrent calls and bounds each by its
// timeout, so the caller needs no deadline of its own.
func Example() {
	srv, err := redistest.New() // a redis-server of its own, for the example
	if err != nil {
		fmt.Println(err)
		return
	}
	defer srv.Close()
	client := redis.NewClient(&redis.Options{Addr: srv.Addr(), ContextTimeoutEnabled: true})
	defer client.Close()

	store := limiter.NewRedisStore(client, limiter.RedisOptions{Timeout: 100 * time.Millisecond})
	defer store.Close()

	checks := []limiter.Check{{
		Zone:  "api",
		Key:   limiter.BoundKey("203.0.113.7"),
		Limit: limiter.Limit{Window: time.Minute, Max: 2},
	}}
	decisions := make([]limiter.Decision, len(checks))
	for range 3 {
		if err := store.Allow(context.Background(), checks, decisions); err != nil {
			fmt.Println("redis failed, apply the fail mode:", err)
			return
		}
		if d := decisions[0]; limiter.Admitted(decisions) {
			fmt.Println("allowed, remaining", d.Remaining)
		} else {
			fmt.Println("denied, retry after", d.RetryAfter.Round(time.Second))
		}
	}
	// Output:
	// allowed, remaining 1
	// allowed, remaining 0
	// denied, retry after 1m0s
}

// A tenant may spend 10,000 tokens a minute. A request reserves its
// estimate; the response settles its real cost; a request may wait up to two
// seconds for its tokens rather than fail; one that could never fit says so.
func Example_units() {
	srv, err := redistest.New()
	if err != nil {
		fmt.Println(err)
		return
	}
	defer srv.Close()
	client := redis.NewClient(&redis.Options{Addr: srv.Addr(), ContextTimeoutEnabled: true})
	defer client.Close()
	store := limiter.NewRedisStore(client, limiter.RedisOptions{})
	defer store.Close()
	ctx := context.Background()

	checks := []limiter.Check{{
		Zone:  "tokens",
		Key:   limiter.BoundKey("tenant-42"),
		Limit: limiter.Limit{Window: time.Minute, Max: 10_000},
		Cost:  4_000, // the estimate
		Wait:  2 * time.Second,
	}}
	decisions := make([]limiter.Decision, 1)
	if err := store.Allow(ctx, checks, decisions); err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("allowed:", decisions[0].Allowed, "remaining:", decisions[0].Remaining)

	checks[0].Cost = 2_500 // what the response really cost
	if err := store.Settle(ctx, checks, decisions); err != nil {
		fmt.Println(err)
		return
	}
	checks[0].Cost = 9_000
	if err := store.Allow(ctx, checks, decisions); err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("9,000 more: allowed:", decisions[0].Allowed, "remaining:", decisions[0].Remaining,
		"retry after:", decisions[0].RetryAfter.Round(time.Minute))

	checks[0].Cost = 20_000
	if err := store.Allow(ctx, checks, decisions); err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("20,000: never:", decisions[0].Never)
	// Output:
	// allowed: true remaining: 6000
	// 9,000 more: allowed: false remaining: 7500 retry after: 1m0s
	// 20,000: never: true
}
