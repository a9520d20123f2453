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
